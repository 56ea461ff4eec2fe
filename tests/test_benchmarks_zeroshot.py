"""``benchmarks/zeroshot.py``: the phase breakdown of the hub path adds up to the call and
leaves the library as it found it."""

import sys
import time
from pathlib import Path

import pytest
import torch

from hiergraph.integrations import padded_hub_window_hsa
from hiergraph.ops.hsa import native
from tests.conftest import hsa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import zeroshot  # noqa: E402


def batch():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 24, 2, 4, generator=gen).transpose(1, 2) for _ in range(3))
    mask = torch.arange(24)[None] < torch.tensor([[24], [17], [9]])
    return q, k, v, mask


def functions() -> dict[str, object]:
    """The functions the phases time, by their names in :data:`zeroshot.HUB_PHASES`."""
    names = [n for ns in zeroshot.HUB_PHASES.values() for n in ns]
    return {n: getattr(*zeroshot.phase_owner(n)) for n in names}


@pytest.mark.parametrize("branching", [(2, 3), (32,)], ids=["forest", "tokens-as-windows"])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch-ops"])
def test_hub_phases_add_up_to_the_call(branching, kernel, monkeypatch):
    if kernel:
        hsa_kernel()
    monkeypatch.setattr(native, "_enabled", kernel)
    q, k, v, mask = batch()
    originals = functions()
    calls = []

    def op():
        start = time.thread_time()
        out = padded_hub_window_hsa(q, k, v, mask, branching, 3)
        calls.append(time.thread_time() - start)
        return out

    with torch.no_grad():
        phases = zeroshot.hub_phases(op, 1)  # one call: its phases are its whole time
    assert list(phases) == [*zeroshot.HUB_PHASES, "rest"]
    assert all(seconds >= 0 for seconds in phases.values())
    # the kernel runs trees whose top windows hold several tokens, whole
    whole = kernel and branching == (2, 3)
    assert (phases["kernel"] > 0) == whole
    assert (phases["root family"] > 0) == (phases["gathers"] > 0) == (not whole)
    assert (phases["window forest"] > 0) == (branching == (2, 3) and not kernel)
    # the phases split the call: their sum is its time (and the timer's call around it)
    assert calls[0] <= sum(phases.values()) <= calls[0] + 1e-3
    assert all(getattr(*zeroshot.phase_owner(n)) is fn for n, fn in originals.items())


def test_hub_phases_restore_the_module_after_an_error():
    originals = functions()

    def op():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        zeroshot.hub_phases(op, 2)
    assert all(getattr(*zeroshot.phase_owner(n)) is fn for n, fn in originals.items())
