"""``benchmarks/timing.py`` (interleaved forward+backward timing) and ``benchmarks/memory.py``
(resident-memory readings), the helpers the benchmark scripts share."""

from __future__ import annotations

import mmap
import sys
import time

import pytest
import torch

from tests.conftest import load_benchmark

timing = load_benchmark("timing")
memory = load_benchmark("memory")


class CountingClock(timing.Clock):
    """Marks are 0, 1, 2, ...; counts the round synchronisations."""

    def __init__(self):
        self.now, self.syncs = 0, 0

    def mark(self):
        self.now += 1
        return self.now

    def sync(self):
        self.syncs += 1


def test_rounds_run_every_case_in_turn_after_one_warm_up():
    """Every case in every position: round r starts at case r mod n."""
    calls = []
    cases = {name: (lambda name=name: calls.append(name), ()) for name in ("a", "b", "c")}
    clock = CountingClock()
    samples = timing.interleaved(cases, 3, clock)
    # the warm-up round, then 3 timed rounds, each starting one case later
    assert calls == [*"abc", *"abc", *"bca", *"cab"]
    assert samples == {name: [1, 1, 1] for name in "abc"} and clock.syncs == 3
    calls.clear()
    assert len(timing.interleaved(cases, 2, clock, warmup=False)["a"]) == 2
    assert calls == [*"abc", *"bca"]


def test_gradients_are_reset_before_every_call():
    x = torch.ones(3, requires_grad=True)
    seen = []

    def step():
        seen.append(x.grad)
        (2 * x).sum().backward()

    x.grad = torch.full((3,), 5.0)
    timing.interleaved({"x": (step, [x])}, 2)
    assert seen == [None] * 3
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_a_round_that_ends_past_stop_at_is_the_last():
    cases = {"a": (lambda: None, ()), "b": (lambda: None, ())}
    samples = timing.interleaved(cases, 5, stop_at=time.monotonic() - 1)
    assert {k: len(v) for k, v in samples.items()} == {"a": 1, "b": 1}


def test_steps_sum_a_given_gradient_and_forward_only():
    x = torch.arange(4.0, requires_grad=True)
    timing.sum_backward(lambda: (x * x, "aux"))()  # the first output of a tuple
    torch.testing.assert_close(x.grad, 2 * x.detach())
    x.grad = None
    grad = torch.tensor([1.0, -1.0, 2.0, 0.5])
    timing.grad_backward(lambda: 3 * x, grad)()
    torch.testing.assert_close(x.grad, 3 * grad)
    outs = []
    timing.forward_only(lambda: outs.append(x * 2))()
    assert not outs[0].requires_grad


def test_wall_and_cpu_samples_are_pairs_and_summaries():
    work = torch.randn(200, 200)
    samples = timing.interleaved({"mm": (lambda: work @ work, ())}, 3, timing.WALL_AND_CPU)
    assert len(samples["mm"]) == 3
    assert all(len(pair) == 2 and pair[0] >= 0 and pair[1] >= 0 for pair in samples["mm"])
    values = {"a": [3.0, 1.0, 2.0], "b": [5.0]}
    assert timing.medians(values) == {"a": 2.0, "b": 5.0}
    assert timing.spreads(values) == {"a": [1.0, 3.0], "b": [5.0, 5.0]}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_time_a_cuda_step():
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    clock = timing.CudaEvents(torch.device("cuda"))
    samples = timing.interleaved({"mm": (timing.sum_backward(lambda: x @ x), [x])}, 2, clock)
    assert len(samples["mm"]) == 2 and all(s > 0 for s in samples["mm"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")
def test_peak_rss_counts_memory_touched_inside():
    assert memory.status_kib("VmHWM") >= memory.status_kib("VmRSS") > 0
    size = 64 * 2**20

    def touch():  # fresh pages (a malloc could reuse resident memory freed before), each written
        pages = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            pages[offset] = 1
        pages.close()

    peak = memory.peak_rss_mib(touch)
    assert peak >= 0.9 * size / 2**20
    with pytest.raises(RuntimeError):
        memory.status_kib("NoSuchField")
