"""Interleaved timing of forward+backward passes, shared by the benchmark scripts.

A *case* is ``(step, leaves)``: ``step()`` is the timed work (say a forward and a
backward) and ``leaves`` the tensors whose gradients are reset, untimed, before every
call. :func:`interleaved` runs every case once per round, in turn, so that all of them
see the same machine load, after one untimed warm-up call each; :func:`medians` and
:func:`spreads` summarise the samples.

What a script times, and with which clock, stays its own choice:

* the backward: :func:`sum_backward` (``out.sum().backward()``) or :func:`grad_backward`
  (the backward of a given output gradient);
* the clock: :data:`WALL` (``time.perf_counter``), :data:`WALL_AND_CPU` (wall and process
  CPU seconds, a pair per sample) or :class:`CudaEvents` (CUDA events, read after a
  synchronisation at the end of every round);
* the CPU allocator (:func:`add_allocator_option`, :func:`apply_allocator`): by default
  every method runs with freed memory kept for reuse, as a training loop would set it.

Where a script writes is one rule for all of them (:func:`add_out_option`,
:func:`output_path`): a full run writes into ``benchmarks/results/`` unless ``--out`` says
otherwise; a ``--quick`` (smoke-test) run writes there only when ``--out`` names it, and
otherwise into a fresh temporary folder whose path it prints, so that it never overwrites
the recorded results that ``benchmarks/report.py`` renders.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
Step = Callable[[], Any]
Case = tuple[Step, Sequence[torch.Tensor]]  # (timed step, leaves reset before it)
#: The recorded results (rendered by ``benchmarks/report.py``): where a full run writes.
RESULTS = Path(__file__).resolve().parent / "results"


def reset_grads(tensors: Iterable[torch.Tensor]) -> None:
    """Drop the gradients of ``tensors`` (a fresh backward, not an accumulating one)."""
    for t in tensors:
        t.grad = None


def sum_backward(fn: Callable[[], Any]) -> Step:
    """A step: forward of ``fn`` and ``out.sum().backward()`` (the first output of a tuple)."""

    def step() -> None:
        out = fn()
        (out[0] if isinstance(out, tuple) else out).sum().backward()

    return step


def grad_backward(fn: Callable[[], torch.Tensor], grad: torch.Tensor) -> Step:
    """A step: forward of ``fn`` and the backward of the output gradient ``grad``."""
    return lambda: fn().backward(grad)


def forward_only(fn: Callable[[], Any]) -> Step:
    """A step: forward of ``fn`` under ``torch.no_grad()`` (no autograd graph)."""

    def step() -> None:
        with torch.no_grad():
            fn()

    return step


def cuda_graphed(step: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``step`` (e.g. a forward and backward) captured once as a CUDA graph; each call of the
    result replays it and returns what the captured call returned (the same tensors, updated
    in place). Three warm-up calls run on a side stream first, as capture requires. A step
    that drops its gradients before the backward (:func:`reset_grads`) has them allocated in
    the graph's own memory, so every replay rewrites them. The result holds ``step``: the
    graph reads the memory of every tensor its closure keeps (a tree plan's indices, say),
    which must not be freed and reused while the graph can replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    def replay() -> Any:
        graph.replay()
        return out

    replay.captured = step
    return replay


class Clock:
    """Wall seconds by ``time.perf_counter``. ``start()`` is taken right before a step and
    ``mark()`` right after it; ``sync()`` runs at the end of a round, before ``elapsed``
    reads the marks of that round."""

    def start(self) -> Any:
        return self.mark()

    def mark(self) -> Any:
        return time.perf_counter()

    def elapsed(self, start: Any, end: Any) -> Any:
        return end - start

    def sync(self) -> None:
        pass


class WallAndCPU(Clock):
    """``(wall seconds, process CPU seconds)`` per sample. CPU time is less sensitive to
    other processes on a shared machine (with one thread it is the work itself; with more
    it also counts threads waiting for work)."""

    def mark(self) -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def elapsed(self, start, end) -> tuple[float, float]:
        return end[0] - start[0], end[1] - start[1]


class CudaEvents(Clock):
    """Seconds between CUDA events recorded on the current stream of ``device``, read after
    the round's ``torch.cuda.synchronize``. ``start()`` waits for the device first: the
    step's launches then meet an idle GPU, so a launch-bound step is timed with its launch
    cost, not hidden behind the previous step's kernels."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> torch.cuda.Event:
        torch.cuda.synchronize(self.device)
        return self.mark()

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


WALL = Clock()
WALL_AND_CPU = WallAndCPU()


def interleaved(
    cases: Mapping[K, Case],
    rounds: int,
    clock: Clock = WALL,
    warmup: bool = True,
    stop_at: float | None = None,
) -> dict[K, list]:
    """``{key: [sample, ...]}``: every case timed once per round, in turn, for ``rounds``
    rounds (the clock's samples; gradients of a case's leaves are reset before each call,
    untimed). Round ``r`` starts at case ``r mod n``, so every case runs in every position
    (after a large case or not) as often as the others. With ``warmup``, every case runs
    once, untimed, first. With ``stop_at`` (a ``time.monotonic()`` value), the first round
    that ends past it is the last: fewer samples, as many for every case."""
    if warmup:
        for step, leaves in cases.values():
            reset_grads(leaves)
            step()
    samples: dict[K, list] = {key: [] for key in cases}
    order = list(cases.items())
    for r in range(rounds):
        marks = []
        shift = r % len(order) if order else 0
        for key, (step, leaves) in order[shift:] + order[:shift]:
            reset_grads(leaves)
            start = clock.start()
            step()
            marks.append((key, start, clock.mark()))
        clock.sync()
        for key, start, end in marks:
            samples[key].append(clock.elapsed(start, end))
        if stop_at is not None and time.monotonic() > stop_at:
            break
    return samples


def medians(samples: Mapping[K, Sequence[float]]) -> dict[K, float]:
    """The median of every key's samples."""
    return {key: statistics.median(values) for key, values in samples.items()}


def spreads(samples: Mapping[K, Sequence[float]]) -> dict[K, list[float]]:
    """``[min, max]`` of every key's samples."""
    return {key: [min(values), max(values)] for key, values in samples.items()}


def add_out_option(
    parser: argparse.ArgumentParser, default: str, what: str = "the JSON file, the plot beside it"
) -> None:
    """``--out``: ``what`` a run writes, read with :func:`output_path`. Its help names the
    default of a full run, ``benchmarks/results/{default}`` (``default=""``: the folder
    itself), and the rule of a ``--quick`` run."""
    parser.add_argument(
        "--out",
        type=Path,
        help=f"{what} (default: benchmarks/results/{default}; a --quick run writes into "
        "benchmarks/results/ only when --out names it, else into a fresh temporary folder, "
        "printed)",
    )


def output_path(out: Path | None, default: str, quick: bool) -> Path:
    """Where a run writes: ``out`` (``--out``) when given; else ``benchmarks/results/{default}``
    for a full run and ``{default}`` in a fresh temporary folder, whose path is printed, for a
    ``--quick`` one. A smoke-test run thus writes into ``benchmarks/results/`` only when
    ``--out`` names it, and never overwrites the recorded results by default. ``default`` is a
    file name, or ``""`` for a script whose ``--out`` is a folder."""
    if out is not None:
        return out
    if not quick:
        return RESULTS / default
    path = Path(tempfile.mkdtemp(prefix="hiergraph-quick-")) / default
    print(f"--quick without --out: writing to {path}, not benchmarks/results/", flush=True)
    return path


def command_line(script: str, argv: Sequence[str]) -> str:
    """``python benchmarks/{script} {argv}`` with the value of ``--out`` written ``<out>``:
    the command that repeats a run, for its JSON (a local path is no setting, and the
    recorded results name no machine's folders)."""
    shown = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--out":
            arg = "<out>"
        elif arg.startswith("--out="):
            arg = "--out=<out>"
        shown.append(arg)
    return " ".join([f"python benchmarks/{script}", *shown])


def round_parser(description: str, rounds: int, out: str) -> argparse.ArgumentParser:
    """A parser with the options the interleaved-round benchmarks share: ``--threads``
    (default 2), ``--rounds``, ``--quick`` (the smoke-test rows), ``--out`` (the JSON file,
    the plot beside it; :func:`add_out_option`, whose ``default`` is ``out``, resolved with
    :func:`output_path` after parsing) and ``--allocator``; a script adds its own. Read it
    with :func:`parse_and_apply`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--quick", action="store_true", help="the smoke-test rows")
    add_out_option(parser, out)
    add_allocator_option(parser)
    return parser


def round_command(script: str, args: argparse.Namespace, *extra: str) -> str:
    """The command line that repeats a :func:`round_parser` run of ``benchmarks/{script}``:
    ``--threads``, ``--rounds``, ``--quick``, the script's own ``extra`` flags and a
    non-default ``--allocator`` (never ``--out``: a local path, not a setting)."""
    flags = [f"--threads {args.threads}", f"--rounds {args.rounds}"] + ["--quick"] * args.quick
    flags += [*extra, *[f"--allocator {args.allocator}"] * (args.allocator != "reuse")]
    return " ".join([f"python benchmarks/{script}", *flags])


def parse_and_apply(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The command line parsed by a :func:`round_parser`, its ``--threads`` and
    ``--allocator`` applied to this process."""
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    apply_allocator(args.allocator)
    return args


def add_allocator_option(parser: argparse.ArgumentParser) -> None:
    """``--allocator {reuse,default}`` (default ``reuse``), read by :func:`apply_allocator`."""
    parser.add_argument(
        "--allocator",
        choices=("reuse", "default"),
        default="reuse",
        help="reuse: hiergraph.runtime.reuse_freed_memory() for every method (freed buffers are "
        "reused, not page-faulted in again each step); default: glibc as configured",
    )


def apply_allocator(allocator: str) -> None:
    """Apply ``--allocator`` to this process (``reuse`` keeps freed CPU memory for reuse; glibc
    only, a no-op elsewhere). Imports ``hiergraph`` only here: a script may import this module
    before it chooses which ``hiergraph`` to import (``dispatch_count.py --library``)."""
    if allocator == "reuse":
        from hiergraph.runtime import reuse_freed_memory

        reuse_freed_memory()
