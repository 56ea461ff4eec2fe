"""``benchmarks/timing.py`` (interleaved forward+backward timing) and ``benchmarks/memory.py``
(resident-memory readings), the helpers the benchmark scripts share."""

from __future__ import annotations

import contextlib
import gc
import mmap
import sys
import time
import weakref
from pathlib import Path

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


def test_round_command_repeats_the_settings_not_the_output_path(tmp_path):
    parser = timing.round_parser("x", rounds=7, out="x.json")
    args = parser.parse_args(["--rounds", "3", "--quick", "--out", str(tmp_path / "y.json")])
    assert (
        timing.round_command("x.py", args)
        == "python benchmarks/x.py --threads 2 --rounds 3 --quick"
    )
    args = parser.parse_args(["--threads", "1", "--allocator", "default"])
    assert timing.round_command("x.py", args, "--no-compile") == (
        "python benchmarks/x.py --threads 1 --rounds 7 --no-compile --allocator default"
    )


def test_a_quick_run_writes_into_the_results_only_when_out_names_them(tmp_path, capsys):
    results = timing.RESULTS
    assert results.name == "results" and results.parent.name == "benchmarks"
    # a full run: the recorded results, file or folder
    assert timing.output_path(None, "x.json", quick=False) == results / "x.json"
    assert timing.output_path(None, "", quick=False) == results
    assert capsys.readouterr().out == ""
    # a quick run without --out: a fresh temporary folder each time, its path printed
    first = timing.output_path(None, "x.json", quick=True)
    second = timing.output_path(None, "x.json", quick=True)
    folder = timing.output_path(None, "", quick=True)
    for path in (first, second, folder):
        assert results not in path.parents and path != results
    assert first.name == "x.json" and first.parent.is_dir() and not first.exists()
    assert first.parent != second.parent and folder.is_dir() and not any(folder.iterdir())
    printed = capsys.readouterr().out
    assert str(first) in printed and str(second) in printed and str(folder) in printed
    for path in (first.parent, second.parent, folder):
        path.rmdir()
    # --out wins, quick or not: the results themselves only when named
    for quick in (False, True):
        assert timing.output_path(tmp_path / "y.json", "x.json", quick) == tmp_path / "y.json"
        assert timing.output_path(results / "x.json", "x.json", quick) == results / "x.json"
    # the option: no default of its own, resolved by output_path
    parser = timing.round_parser("x", rounds=7, out="x.json")
    assert parser.parse_args(["--quick"]).out is None
    assert parser.parse_args(["--out", "y.json"]).out == Path("y.json")
    assert "benchmarks/results/x.json" in parser.format_help()


def test_wall_and_cpu_samples_are_pairs_and_summaries():
    work = torch.randn(200, 200)
    samples = timing.interleaved({"mm": (lambda: work @ work, ())}, 3, timing.WALL_AND_CPU)
    assert len(samples["mm"]) == 3
    assert all(len(pair) == 2 and pair[0] >= 0 and pair[1] >= 0 for pair in samples["mm"])
    values = {"a": [3.0, 1.0, 2.0], "b": [5.0], "c": [1.0, 1.5, 9.0]}  # c: median 1.5, mean 3.83
    assert timing.medians(values) == {"a": 2.0, "b": 5.0, "c": 1.5}
    assert timing.spreads(values) == {"a": [1.0, 3.0], "b": [5.0, 5.0], "c": [1.0, 9.0]}


def test_each_step_is_timed_from_the_clocks_start_to_its_mark():
    events = []

    class Recording(timing.Clock):
        def start(self):
            events.append("start")
            return 0

        def mark(self):
            events.append("mark")
            return 1

    timing.interleaved({"a": (lambda: events.append("a"), ())}, 2, Recording(), warmup=False)
    assert events == ["start", "a", "mark"] * 2


def test_cuda_events_start_on_an_idle_device(monkeypatch):
    """The start event is recorded after the device has finished earlier work, so a step's
    time includes its own kernel launches (not hidden behind queued kernels)."""
    calls = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            calls.append("record")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    clock = timing.CudaEvents(torch.device("cuda"))
    clock.start()
    assert calls == ["sync", "record"]
    clock.mark()
    assert calls == ["sync", "record", "record"]


def test_a_captured_step_outlives_its_caller(monkeypatch):
    """The graph replays kernels that read the step's tensors: ``cuda_graphed`` keeps the
    step (and what its closure holds) alive however the caller drops it."""

    class Graph:
        def replay(self):
            pass

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())

    class Plan:  # stands in for a tree plan on the device
        size = 3

    def make():
        plan = Plan()
        return timing.cuda_graphed(lambda: plan.size, torch.device("cuda")), weakref.ref(plan)

    replay, plan = make()
    gc.collect()
    assert plan() is not None and replay() == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_hsa_step_replays_after_its_plan_is_dropped():
    """Capture a block-kernel HSA step whose tree plan only its closure holds, fill freed
    memory with junk, replay: the same output as eagerly (no stale plan indices)."""
    from hiergraph.data import window_forest
    from hiergraph.ops import hierarchical_attention

    lengths = torch.tensor([100, 64, 128, 77] * 8)
    total = int(lengths.sum())
    q, k, v = (torch.randn(total, 2, 16, device="cuda") for _ in range(3))

    def make(kernel):
        index = window_forest(lengths, (16, 4)).tree_index().to("cuda")
        return lambda: hierarchical_attention(q, k, v, index, kernel=kernel)

    for kernel in ("dense", "blocks"):
        want = make(kernel)()
        replay = timing.cuda_graphed(make(kernel), torch.device("cuda"))
        gc.collect()
        junk = [torch.full((1 << 16,), -(1 << 40), dtype=torch.long, device="cuda")
                for _ in range(256)]  # fmt: skip
        got = replay().clone()
        del junk
        torch.testing.assert_close(got, want)


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


def test_the_recorded_command_names_no_output_folder():
    """(A run's JSON recorded the machine's folder it wrote into.)"""
    argv = ["--sizes", "16384", "--out", "/some/where", "--reps", "2"]
    assert timing.command_line("masked_attention.py", argv) == (
        "python benchmarks/masked_attention.py --sizes 16384 --out <out> --reps 2"
    )
    assert timing.command_line("hmatrix.py", ["--out=/x", "--quick"]) == (
        "python benchmarks/hmatrix.py --out=<out> --quick"
    )
