"""hiergraph.runtime: freed large buffers are reused instead of re-faulted (glibc)."""

import subprocess
import sys
import textwrap

import pytest

from hiergraph.runtime import _glibc, reuse_freed_memory

# Minor page faults of 8 rounds of allocating, touching and freeing a 64 MiB tensor.
FAULTS = textwrap.dedent(
    """
    import resource, sys, torch
    from hiergraph.runtime import reuse_freed_memory
    applied = reuse_freed_memory() if sys.argv[1] == "reuse" else None
    torch.ones(2**24).sum()  # first touch, counted in neither run
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        torch.ones(2**24).sum()
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(_glibc() is None, reason="needs glibc (Linux)")
def test_reuse_freed_memory_stops_refaulting_large_buffers():
    _, default = _faults("default")
    applied, reuse = _faults("reuse")
    assert applied == "True"
    assert default > 8 * 16384 * 0.9  # every round faults its 16Ki pages in again
    assert reuse < default / 10


@pytest.mark.parametrize("bad", [0, -1, 2**31 + 1, 1.5, True])
def test_rejects_bad_thresholds(bad):
    with pytest.raises((TypeError, ValueError), match="threshold_bytes"):
        reuse_freed_memory(bad)


def test_default_threads_stays_within_the_limit_and_the_idle_cores(monkeypatch):
    import os

    import torch

    from hiergraph.runtime import default_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.6, 0.0, 0.0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert default_threads(limit=4) == 2  # 8 cores, 5.6 busy: 2 idle
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert default_threads() == 1  # never below one
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert default_threads(limit=3) == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # Python cannot tell
    assert default_threads(limit=3) == 3
    for limit, error in ((0, ValueError), (-5, ValueError), (2.7, TypeError), ("4", TypeError)):
        with pytest.raises(error, match="limit must be a positive int"):  # (they gave 1)
            default_threads(limit)


def test_progress_is_a_tqdm_bar_over_the_iterable():
    import io
    import tempfile

    from hiergraph.runtime import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = progress(range(3), disable=True)
    assert list(bar) == [0, 1, 2]
    own = progress(range(3), mininterval=5, file=Terminal())  # (a TypeError: given twice)
    assert own.mininterval == 5 and list(own) == [0, 1, 2]
    assert "3/3" in own.fp.getvalue()
    # a log file gets no bar (every redraw was a line there); a stream without a file
    # descriptor (a notebook's) does; disable wins
    with tempfile.TemporaryFile("w+") as log:
        assert list(progress(range(3), file=log)) == [0, 1, 2]
        log.seek(0)
        assert log.read() == ""
    notebook = io.StringIO()
    list(progress(range(3), file=notebook))
    assert "3/3" in notebook.getvalue()
    assert progress(range(3), file=Terminal(), disable=True).disable


def test_apply_budget_fills_only_the_options_left_unset():
    from argparse import Namespace

    from hiergraph.runtime import apply_budget

    quick, paper = {"epochs": 5, "seeds": [0]}, {"epochs": 1000, "seeds": list(range(10))}
    args = Namespace(paper=False, epochs=None, seeds=[3])
    apply_budget(args, quick, paper)
    assert args.epochs == 5 and args.seeds == [3]  # an explicit option wins
    args = Namespace(paper=True, epochs=None, seeds=None)
    apply_budget(args, quick, paper)
    assert args.epochs == 1000 and args.seeds == list(range(10))
