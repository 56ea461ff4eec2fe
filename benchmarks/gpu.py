"""The one-command GPU check: the CUDA tests, then forward+backward timings of every method
against its peer, with peak memory, in one run that stops itself before 8 minutes.

    python benchmarks/gpu.py --out benchmarks/results/gpu          # on a CUDA machine
    python benchmarks/gpu.py --device cpu --quick --out /tmp/gpu   # smoke run, 1-2 min

Sections, in this order, each with its own time cap (``--caps name=seconds`` changes one):

* ``tests`` (170 s): ``pytest -m cuda`` in a subprocess (the tests ``tests/conftest.py``
  marks ``cuda``: a CUDA device among their parameters, or CUDA in their name or body); its
  counts and failures go into the JSON, its JUnit report into ``pytest_cuda.xml``. Skipped
  without CUDA unless ``--pytest ARGS`` names what to run.
* ``hsa`` (120 s): ``hiergraph.ops.hierarchical_attention`` over PyG batches of
  ``window_hierarchy`` trees (64 x 128, 32 x 512, 8 x 2,048 leaves) and single trees (16K,
  256K, 1M leaves), 8 heads, d = 64, on ``[L, H, d]`` inputs and on heads-first ones
  (``hsa-heads-first``: ``[H, L, d]`` memory viewed as ``[L, H, d]``, no layout copies),
  vs ``scaled_dot_product_attention`` over each tree's leaves with the flash and the
  memory-efficient backends, and vs the per-level bound of
  ``benchmarks/hsa_scaling.py`` (one batched SDPA call per level over its families); last,
  the first batch again with sequences of different lengths (``mixed``, uniform in
  [L/2, L]): the default kernel (padded to equal fanout), the block kernel, and SDPA with a
  key padding mask; the same for the second batch with windows of random sizes
  (``ragged``, as documents' sentences vary: 4–16 padded slots per leaf, which only an
  accelerator runs padded); then the batches again (``causal``) through the strictly causal op
  (``causal_hierarchical_attention``, decoder training) vs causal SDPA (flash, efficient).
* ``triton`` (90 s): the opt-in Triton kernels of equal-fanout HSA
  (``hiergraph.ops.hsa.triton_uniform``: ``hsa-triton``) beside the default path, the
  per-level bound and flash SDPA on the three batches and the 16K tree, and beside the
  default path and masked SDPA on the ``mixed`` and ``ragged`` batches (their padded forests),
  every method also replayed as a CUDA graph (``+graph``: launch cost apart from device time);
  then a profile of their 32 x 512 step beside the default path's (``profile`` rows, bf16);
  skipped off CUDA or without Triton. A section of its own, run in a subprocess (into
  ``OUT/triton``; its rows join the run's): the kernels' first builds (Triton's compiler,
  per block size and dtype) cost its time, not the others', and kernels that have never
  run on a GPU cannot leave the run's CUDA context unusable.
* ``hmatrix`` (35 s): ``hmatrix_attention`` at 16K and 64K tokens vs SDPA (settings of
  ``benchmarks/hmatrix.py``); on CUDA also ``hmatrix-tf32``, the same step with float32
  matrix products on TF32 tensor cores (``torch.set_float32_matmul_precision("high")``;
  bf16 inputs are computed in float32 inside).
* ``vcc`` (35 s): one VCC encoder layer at 16K and 128K tokens vs the same
  ``nn.TransformerEncoderLayer`` on all tokens (settings of ``benchmarks/vcc.py``).
* ``masked`` (35 s): ``MaskedAttentionConv`` on a window mask (p = 64; raw ``edge_index``,
  recognised per call, and a prepared ``BandMask``) and on a random mask with as many
  edges, 64K nodes, vs PyG's ``TransformerConv`` (settings of
  ``benchmarks/masked_attention.py``).
* ``cone`` (20 s): ``ConeConv`` (penumbral, umbral) vs PyG's ``GATConv`` on Cora-sized
  random graphs (2,708 nodes, 10,556 edges, 64 -> 8 heads x 8).
* ``graph_hsa`` (40 s): ``GraphHSANet`` (2 layers, GCN local convs) on a 1M-node planted-
  partition graph with a window hierarchy over its nodes (blocks are consecutive), vs the
  same net's GCN stack alone.
* ``profile`` (60 s): where the time of the steps furthest from their targets goes, bf16
  only: the 32 x 512 HSA batch (eager, heads-first, and with its forward through
  ``torch.compile``, compiled before it is timed) beside the per-level bound and flash SDPA,
  and H-matrix attention at 64K beside SDPA; each row also has a ``torch.profiler``
  breakdown of three steps (kernels per step, their summed device time, the wall time, the
  12 kernels that took longest; operators and CPU time on the CPU).
* ``graphs`` (100 s): ``hmatrix``, ``vcc``, ``masked`` and ``hsa`` again with ``--graphs``
  (below), in a subprocess of their own, into ``OUT/graphs/gpu.json``.
* ``compiled`` (120 s): the opt-in tests that compile ops with inductor on CUDA (Triton
  kernels) and compare outputs and gradients with eager ones (:data:`COMPILED_TESTS`:
  equal-fanout HSA, the strictly causal op, H-matrix attention's custom operators), in a
  subprocess with ``HIERGRAPH_SLOW=1``; counts in the section's entry, its JUnit report in
  ``pytest_compiled.xml``. Last: compiling costs minutes of the budget, not the timings.

Every case runs float32 and bfloat16 (ops get bf16 inputs; modules run under bf16 autocast).
With ``--graphs``, on CUDA, the methods of the launch-bound cases (HSA and its peers up to
16K leaves in all, H-matrix attention, and SDPA beside it at 16K, the banded
``MaskedAttentionConv``) also run
as ``name+graph``: the whole step, forward and backward, captured once as a CUDA graph
(``torch.cuda.graph``) and replayed, which removes the per-kernel launch cost that dominates
small problems (what ``torch.compile(mode="reduce-overhead")`` or a captured training step
gives a user); so does the VCC layer (``vip_slots`` set: static shapes), and its full
layer at 16K. A failed capture (``GATConv``'s) leaves the process's CUDA random generator
unusable, so the other sections have no twins; the ``graphs`` section runs them in a process
of their own. Methods of a case are timed in interleaved rounds (one step of each per round,
3 to 15 rounds, as many as fit in 1.5 s, after a warm-up step); a step is forward +
``out.sum().backward()``; times are medians, by CUDA events on a GPU (each step starts on an
idle device, so a launch-bound step's time includes its launches) and ``time.perf_counter``
on the CPU. Peak memory
is ``torch.cuda.max_memory_allocated`` over one extra step, reset per method; it includes
the tensors of the case's other methods, which are alive beside it, so each row also has the
step's own ``footprint`` (the peak above the level before the step, plus the method's own
inputs and gradients). A method is skipped, with the reason recorded, when its inputs would
not fit in free memory, when its time extrapolated from a smaller size of the same run would
pass the section's cap, on out-of-memory, or when SDPA has no kernel for it (flash needs
bf16/fp16).

The run stops itself at ``--deadline`` seconds (default 450, checked between cases and
rounds). ``gpu.json`` is rewritten after every case (a killed run keeps what it measured)
and ``gpu.png`` after every section; a table is printed at the end, then the targets
(``benchmarks/gpu_targets.py``: met, not met, or not measured by this run). Results of a
real GPU run go under ``benchmarks/results/gpu/``. What a failure costs is bounded: inputs
come from the script's own random generator (reseeded per method), not CUDA's default one,
which a failed capture breaks; after an error that leaves the CUDA context unusable (a
device-side assert, an illegal memory access) the sections of this process are skipped and
those in subprocesses still run; the child runs keep deadlines on this run's clock, a
margin before their section's end, so that they write what they measured before they would
be killed; a pytest section still running at its cap is interrupted as by Ctrl-C, so that
its JUnit report keeps the tests that ran.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

STARTED = time.monotonic()  # the deadline counts from here, torch's import included

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_targets  # noqa: E402
import hmatrix as hmatrix_bench  # noqa: E402
import masked_attention as masked_bench  # noqa: E402
import timing  # noqa: E402
import vcc as vcc_bench  # noqa: E402
from graph_hsa import planted_partition  # noqa: E402
from hsa_scaling import bound_shapes, branching_for, run_bound  # noqa: E402

from hiergraph.ops.hsa import triton_uniform  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CAPS = {
    "tests": 170.0,
    "hsa": 120.0,
    "triton": 90.0,
    "hmatrix": 35.0,
    "vcc": 35.0,
    "masked": 35.0,
    "cone": 20.0,
    "graph_hsa": 40.0,
    "profile": 60.0,
    "graphs": 100.0,
    "compiled": 120.0,
}
ROUNDS = 3  # timed rounds per case (at least)
MAX_ROUNDS = 15  # more rounds while a case stays within CASE_S
CASE_S = 1.5  # seconds of timed rounds a case may take beyond its first ROUNDS
GRAPH_MAX_LEAVES = 16384  # cases timed as CUDA graphs too, in leaves or tokens (launch-bound)
PROFILE_TOP = 12  # kernels listed per profiled step
MAX_STEP_S = 3.0  # a method whose step is predicted slower than this is not run
MIB = 2**20
#: seconds a pytest section's run gets, after its interruption at the section's cap, to
#: write its report (then it is killed)
INTERRUPT_GRACE_S = 10.0
#: the sections that run in subprocesses of their own: they still run after an error left
#: this process's CUDA context unusable
SUBPROCESS_SECTIONS = ("tests", "triton", "graphs", "compiled")
BROKEN = "the CUDA context is unusable after an earlier error (see the log)"


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of the full (GPU) and the quick (CPU smoke) runs."""

    hsa_batches: tuple[tuple[int, int], ...]  # (trees, leaves per tree)
    hsa_trees: tuple[int, ...]  # leaves of single trees
    heads: int
    dim: int
    hmatrix: tuple[int, ...]
    vcc: tuple[int, ...]
    masked: int
    cone: tuple[int, int]  # nodes, edges
    graph_hsa: int


FULL = Sizes(
    ((64, 128), (32, 512), (8, 2048)), (16384, 262144, 1048576), 8, 64,
    (16384, 65536), (16384, 131072), 65536, (2708, 10556), 1_000_000,
)  # fmt: skip
QUICK = Sizes(
    ((4, 128),), (2048,), 2, 16, (512,), (512,), 256, (2708, 10556), 4096,
)  # fmt: skip


# ------------------------------------------------------------------------------ timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor]) -> Callable[[], None]:
    """A step: fresh gradients, then forward of ``fn`` and ``out.sum().backward()``. The
    reset is part of the step: its timings include it, and the level :func:`peak_mib`
    reads before the step still holds the previous step's gradients."""
    forward_backward = timing.sum_backward(fn)

    def step():
        timing.reset_grads(leaves)
        forward_backward()

    return step


def tf32_matmuls(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` (forward and backward) with float32 matrix products allowed on TF32 tensor
    cores (``torch.set_float32_matmul_precision("high")``, a user's global setting), the
    previous setting restored after it."""

    def tf32_step():
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            step()
        finally:
            torch.set_float32_matmul_precision(before)

    return tf32_step


def timed_once(step: Callable[[], None], device: torch.device) -> float:
    """Wall seconds of one step, synchronised (the warm-up; also the time estimate)."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def interleaved(steps: dict[str, Callable[[], None]], rounds: int, device, stop_at: float):
    """Seconds of every step over ``rounds`` rounds of one step each, in turn (CUDA events
    on a GPU), after the warm-up that :func:`timed_once` ran. Stops after a round that ends
    past ``stop_at`` (monotonic clock)."""
    clock = timing.CudaEvents(device) if device.type == "cuda" else timing.WALL
    cases = {name: (step, ()) for name, step in steps.items()}  # steps reset their own grads
    return timing.interleaved(cases, rounds, clock, warmup=False, stop_at=stop_at)


def peak_mib(step: Callable[[], None], device: torch.device, own: list[torch.Tensor]) -> dict:
    """Peak allocated memory of one step: absolute, above the level before it, and the
    step's own ``footprint``: the peak less the other methods' tensors alive beside it
    (``own``: the method's tensors that get gradients; they and their gradients count)."""
    if device.type != "cuda":
        return {"peak_mib": None, "peak_above_mib": None, "footprint_mib": None}
    synchronize(device)
    mine = storage_bytes(own + [t.grad for t in own if t.grad is not None])
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    above = peak - before
    return {"peak_mib": peak / MIB, "peak_above_mib": above / MIB,
            "footprint_mib": (above + mine) / MIB}  # fmt: skip


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views count once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def free_bytes(device: torch.device) -> float:
    """Free device memory in bytes (unknown, ``inf``, off CUDA or in a broken CUDA context)."""
    if device.type != "cuda":
        return math.inf
    try:
        return torch.cuda.mem_get_info(device)[0]
    except Exception:  # noqa: BLE001 - a sticky CUDA error: the method's build will say so
        return math.inf


def release(device: torch.device) -> bool:
    """Frees what the last case left; ``False`` when the CUDA context is unusable (a sticky
    error such as a device-side assert or an illegal memory access makes every later CUDA
    call fail, ``empty_cache`` included)."""
    gc.collect()
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - reported by the caller
        traceback.print_exc()
        return False
    return True


# ------------------------------------------------------------------------------ running


Built = tuple[Callable[[], torch.Tensor], list[torch.Tensor]]


@dataclass
class Method:
    """One method of a case. ``build(dtype, device)`` makes its module and inputs and returns
    ``(forward, tensors that get gradients)``. ``work`` is its cost in any unit that grows
    like its time (leaves for linear methods, leaves squared for flat attention): a time
    measured at a smaller size of the same run, scaled by work, predicts this one.
    ``peak_bytes`` is a rough float32 peak, checked against free memory first."""

    build: Callable[[torch.dtype, torch.device], Built]
    work: float = 1.0
    peak_bytes: float = 0.0
    autocast: bool = False  # modules: bf16 via autocast, not bf16 inputs
    graph: bool = False  # on CUDA, also time its step captured as a CUDA graph (``+graph``)
    graphed: bool = False  # this is such a twin: its step replays the captured graph
    compiled: bool = False  # the forward through ``torch.compile`` (compiled before timing)
    tf32: bool = False  # float32 matrix products on TF32 tensor cores for the whole step


@dataclass
class Run:
    """The state of one run: options, deadline, results so far (written after every case)."""

    args: argparse.Namespace
    device: torch.device
    sizes: Sizes
    started: float = STARTED
    meta: dict = field(default_factory=dict)
    sections: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    seconds_per_work: dict = field(default_factory=dict)  # (section, method, dtype) -> s
    broken: bool = False  # the CUDA context is unusable (see release): in-process work stops

    @property
    def deadline(self) -> float:
        return self.started + self.args.deadline

    def left(self, section_end: float) -> float:
        return min(section_end, self.deadline) - time.monotonic()

    def write(self, plot_too: bool = False) -> None:
        out = Path(self.args.out)
        self.meta["elapsed_s"] = time.monotonic() - self.started
        report = {"meta": self.meta, "sections": self.sections, "tests": self.tests}
        report["rows"] = self.rows
        tmp = out / "gpu.json.tmp"
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, out / "gpu.json")
        if plot_too:
            plot(self.rows, out / "gpu.png")


def run_case(run: Run, section: str, end: float, case: str, methods: dict[str, Method],
             dtypes: tuple[str, ...] = tuple(DTYPES), profile: bool = False):  # fmt: skip
    """Time ``methods`` against each other in every dtype; one row per method and dtype.
    With ``profile``, each row also gets its step's :func:`profile_step` breakdown (and
    no method gets a CUDA-graph twin)."""
    if run.args.graphs and not profile:
        methods = with_graph_twins(methods, run.device)
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        label = dict(section=section, case=case, dtype=dtype_name)
        steps, owned, rows = {}, {}, {}
        for name, method in methods.items():
            row = rows[name] = dict(label, method=name, status="ok")
            reason = _skip_reason(run, section, end, name, dtype_name, method)
            if reason:
                row.update(status="skipped", reason=reason)
                continue
            try:
                steps[name], owned[name] = _prepare(run, method, dtype)
                row["warmup_s"] = timed_once(steps[name], run.device)
            except Exception as error:  # noqa: BLE001 - one method's failure is recorded
                row.update(_failure(error))
                if row["status"] == "error":
                    traceback.print_exc()  # the whole story in the log; the JSON has its line
                steps.pop(name, None)
                run.broken |= not release(run.device)
        if steps:
            _time_and_measure(run, section, end, steps, owned, rows, dtype_name, methods)
        for name, step in steps.items() if profile else ():
            if run.left(end) > 0 and rows[name].get("median_ms"):
                try:
                    rows[name]["profile"] = profile_step(step, run.device)
                except Exception as error:  # noqa: BLE001 - the timing row stays
                    rows[name]["profile_error"] = _failure(error)["reason"]
        first = next(iter(methods))
        for row in rows.values():
            base = rows[first].get("median_ms")
            if row.get("median_ms") and base:
                row[f"ratio_to_{first}"] = row["median_ms"] / base
            run.rows.append(row)
        del steps, owned
        run.write()
        run.broken |= not release(run.device)
        print(*(_line(r) for r in rows.values()), sep="\n", flush=True)


def with_graph_twins(methods: dict[str, Method], device: torch.device) -> dict[str, Method]:
    """``methods``, and on CUDA a ``name+graph`` twin after every method marked ``graph``."""
    out = {}
    for name, method in methods.items():
        out[name] = method
        if method.graph and device.type == "cuda":
            out[f"{name}+graph"] = replace(method, graph=False, graphed=True)
    return out


def _skip_reason(run: Run, section, end, name, dtype_name, method: Method) -> str | None:
    if run.broken:
        return BROKEN
    left = run.left(end)
    if left <= 0:
        return "deadline" if time.monotonic() > run.deadline else "section time cap"
    need = method.peak_bytes * DTYPES[dtype_name].itemsize / 4
    if need > free_bytes(run.device):
        return f"estimated peak {need / MIB:.0f} MiB would not fit in free memory"
    per_work = run.seconds_per_work.get((section, name, dtype_name))
    if per_work is not None:
        step = per_work * method.work  # scaled from a smaller size of this run
        if step > MAX_STEP_S:
            return f"predicted {step:.1f} s per step (> {MAX_STEP_S:.0f} s) from a smaller size"
        if step * (ROUNDS + 2) > left:
            return f"predicted {step * (ROUNDS + 2):.0f} s for the case > {left:.0f} s left"
    return None


def _prepare(run: Run, method: Method, dtype: torch.dtype) -> tuple[Callable[[], None], list]:
    """The method's step in ``dtype`` (bf16 inputs, or float32 modules under bf16 autocast)
    and the tensors that get its gradients."""
    torch.manual_seed(0)  # the modules' parameters
    seed_inputs(run.device)
    fn, leaves = method.build(torch.float32 if method.autocast else dtype, run.device)
    if method.autocast and dtype != torch.float32:
        inner = fn

        def fn():  # no cast cache: a CUDA graph cannot capture one (each weight casts once)
            with torch.autocast(run.device.type, dtype=dtype, cache_enabled=False):
                return inner()

    if method.compiled:
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    step = fwd_bwd(fn, leaves)
    if method.tf32:
        step = tf32_matmuls(step)
    if method.compiled:
        step()  # compiles the forward and the backward before the timed warm-up
    return (timing.cuda_graphed(step, run.device) if method.graphed else step), leaves


def _time_and_measure(run, section, end, steps, owned, rows, dtype_name, methods) -> None:
    per_round = sum(rows[n]["warmup_s"] for n in steps)  # the warm-up predicts a round
    left = run.left(end)
    rounds = min(MAX_ROUNDS, max(ROUNDS, int(CASE_S / max(per_round, 1e-9))))
    rounds = ROUNDS if run.sizes is QUICK else rounds  # a smoke test: what runs, not its times
    rounds = rounds if per_round * rounds <= left else max(1, int(left / per_round))
    try:
        times = interleaved(steps, rounds, run.device, min(end, run.deadline))
    except Exception as error:  # noqa: BLE001
        for name in steps:
            rows[name].update(_failure(error))
        return
    for name, samples in times.items():
        median = statistics.median(samples)
        rows[name].update(median_ms=1e3 * median, times_ms=[1e3 * t for t in samples])
        rows[name]["rounds"] = len(samples)
        if len(samples) < ROUNDS:
            rows[name]["note"] = f"only {len(samples)} rounds fit the time cap"
        run.seconds_per_work[(section, name, dtype_name)] = median / methods[name].work
        try:
            rows[name].update(peak_mib(steps[name], run.device, owned[name]))
            if methods[name].graphed:  # its intermediates live in the graph's reserved pool
                rows[name]["footprint_mib"] = None
        except Exception as error:  # noqa: BLE001
            rows[name]["memory_error"] = _failure(error)["reason"]


def _failure(error: Exception) -> dict:
    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if isinstance(error, torch.OutOfMemoryError):
        return {"status": "skipped", "reason": "out of memory"}
    if "No available kernel" in str(error) or "No viable backend" in str(error):
        return {"status": "skipped", "reason": "no SDPA kernel: " + text.split(". ")[0][:160]}
    return {"status": "error", "reason": text[:300]}


def _line(row: dict) -> str:
    ms = f"{row['median_ms']:10.2f} ms" if row.get("median_ms") is not None else " " * 13
    mem = f"{row['peak_mib']:9.0f} MiB" if row.get("peak_mib") is not None else " " * 13
    ratio = next((f"{v:7.2f}x" for k, v in row.items() if k.startswith("ratio_to_")), "")
    status = "" if row["status"] == "ok" else f"  [{row['status']}: {row.get('reason', '')}]"
    return (
        f"{row['section']:<9} {row['case']:<14} {row['dtype']:<4} {row['method']:<18}"
        f"{ms} {mem} {ratio}{status}"
    )


# ----------------------------------------------------------------------------- sections


def section_tests(run: Run, end: float) -> dict | None:
    """``pytest -m cuda`` (or ``--pytest``) in a subprocess; counts from its JUnit report."""
    run.tests["status"] = "running"  # what gpu.json says if the process dies in there
    run.tests.update(pytest_section(run, end, "cuda", run.args.pytest, ["-m", "cuda", "tests"]))
    if run.tests["status"] == "done":
        return None
    return {k: run.tests[k] for k in ("status", "reason") if k in run.tests}


#: the opt-in compiled tests the ``compiled`` section runs on CUDA: inductor (Triton) against
#: eager, forward and gradients, for the ops whose compiled form differs most from eager
COMPILED_TESTS = [
    "-m", "cuda", "tests/ops/test_gpu_path.py",
    "-k", "compiled_matches_eager and (hsa-uniform or hsa-strict-causal or hmatrix)",
]  # fmt: skip


def section_compiled(run: Run, end: float) -> dict:
    """:data:`COMPILED_TESTS` (or ``--compiled-pytest``) in a subprocess with the opt-in
    tests switched on (``HIERGRAPH_SLOW=1``); counts from its JUnit report, in the
    section's entry."""
    chosen = run.args.compiled_pytest
    return pytest_section(run, end, "compiled", chosen, COMPILED_TESTS, {"HIERGRAPH_SLOW": "1"})


def pytest_section(
    run: Run, end: float, name: str, chosen: str | None, default: list[str], env=None
) -> dict:
    """The pytest run of a section: ``chosen`` (a command line's arguments) or ``default``,
    its JUnit report in ``OUT/pytest_<name>.xml``; skipped without CUDA unless ``chosen``
    (the default selections hold CUDA tests only)."""
    if run.device.type != "cuda" and not chosen:
        return {"status": "skipped", "reason": "no CUDA device (the cuda tests would skip)"}
    args = shlex.split(chosen) if chosen else default
    xml = Path(run.args.out) / f"pytest_{name}.xml"
    result = run_pytest(args, xml, run.left(end), env)
    print(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'output_tail'})}")
    return result


def run_pytest(args: list[str], xml: Path, timeout: float, env: dict | None = None) -> dict:
    """``pytest args`` in a subprocess (at most ``timeout`` s, extra environment ``env``):
    its command, status, return code, time, the counts of its JUnit report ``xml`` and the
    end of its output."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    command += [f"--junitxml={xml}", *args]
    result = {"command": portable(" ".join(["python", *command[1:]]))}
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, **(env or {})),
    )  # fmt: skip
    limit = max(timeout - INTERRUPT_GRACE_S, 1)
    try:
        output = process.communicate(timeout=limit)[0]
        result.update(status="done", returncode=process.returncode)
    except subprocess.TimeoutExpired:
        # as Ctrl-C does: pytest stops after the running test and still writes its JUnit
        # report of the tests that ran (killed, it would write none)
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=INTERRUPT_GRACE_S)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0]
        result.update(status="timeout", reason=f"interrupted after {limit:.0f} s")
    output = output.decode(errors="replace")
    result["elapsed_s"] = time.monotonic() - start
    if xml.exists():  # its skip messages name test files by absolute path
        xml.write_text(xml.read_text().replace(str(REPO) + os.sep, ""))
    result.update(junit_counts(xml))
    result["output_tail"] = portable(output[-3000:])
    return result


def portable(text: str) -> str:
    """``text`` without machine paths: the repository and the Python installation's folders
    become relative, other absolute ``--out``-style folders keep only their last part."""
    for root in sorted({str(REPO), sys.prefix, sys.exec_prefix, *sys.path[1:]}, key=len)[::-1]:
        if root and root != "/" and os.path.isabs(root):
            text = text.replace(root + os.sep, "").replace(root, ".")
    return re.sub(r"(?<![\w.])/(?:[^\s/=]+/)+([^\s/=]+)", r"\1", text)


def junit_counts(path: Path) -> dict:
    """``passed/failed/errors/skipped`` and the failing test ids of a JUnit XML report."""
    if not path.exists():
        return {}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    count["skipped"] = sum(int(s.get("skipped", 0)) for s in suites)
    failing = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    return {
        "passed": passed,
        "failed": count["failures"],
        "errors": count["errors"],
        "skipped": count["skipped"],
        "failing": failing,
    }


#: the generators of the inputs, one per device, reseeded before every build (:func:`_prepare`)
_GENERATORS: dict[str, torch.Generator] = {}


def seed_inputs(device: torch.device) -> None:
    """Reseeds the generator of :func:`randn` on ``device``."""
    if device.type != "meta":  # (shapes only: no generator)
        _GENERATORS[str(device)] = torch.Generator(device=device).manual_seed(0)


def randn(*shape: int, device: torch.device) -> torch.Tensor:
    """Normal inputs from this script's own generator on ``device``, not the device's default
    one, which a failed CUDA-graph capture leaves unusable for the rest of the process (the
    inputs of every later method would fail)."""
    if str(device) not in _GENERATORS:
        seed_inputs(device)
    return torch.randn(*shape, generator=_GENERATORS.get(str(device)), device=device)


def _leaf(shape, dtype, device) -> torch.Tensor:
    return randn(*shape, device=device).to(dtype).requires_grad_()


def _sdpa(backend_name: str, shape, dtype, device, causal: bool = False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    q, k, v = (_leaf(shape, dtype, device) for _ in range(3))

    def fn():
        with sdpa_kernel(backend[backend_name]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn, [q, k, v]


def tree_branching(leaves: int) -> tuple[int, ...]:
    """``hsa_scaling``'s window sizes (16, 8, 4, 2, 2, ...), the levels a tree of ``leaves``
    uses (a level is kept while its windows leave at least 2 nodes above them)."""
    branching, span = [], 1
    for b in branching_for(max(leaves, 1024)):
        if span * b * 2 > leaves:
            break
        branching.append(b)
        span *= b
    return tuple(branching) or (leaves,)


def hsa_methods(
    run: Run, trees: int, leaves: int, compiled: bool = False, triton: bool = False
) -> dict[str, Method]:
    """HSA and its peers on ``trees`` window trees of ``leaves`` leaves; with ``compiled``,
    also ``hsa-compiled``: the forward through ``torch.compile`` over the batch's plan; with
    ``triton``, where the run times them (:func:`times_triton_kernels`), ``hsa-triton``."""
    from torch_geometric.data import Batch

    from hiergraph.data import window_hierarchy
    from hiergraph.ops import hierarchical_attention

    H, d = run.sizes.heads, run.sizes.dim
    branching = tree_branching(leaves)
    total = trees * leaves

    def hsa(dtype, device, heads_first=False, plan=False, kernels=False):
        """``plan``: the batch's fixed tree plan in place of the batch (what a compiled
        function closes over); ``kernels``: the Triton kernels turned on for the call."""
        batch = Batch.from_data_list([window_hierarchy(leaves, branching)] * trees)
        batch.tree_index()  # structure, built once on the CPU, moves with the batch
        batch = batch.to(device)
        hierarchy = batch.tree_index() if plan else batch
        if heads_first:  # [H, L, d] memory viewed as [L, H, d], as SDPA gets [B, H, L, d]
            qkv = [_leaf((H, total, d), dtype, device).detach().transpose(0, 1) for _ in "qkv"]
            q, k, v = (t.requires_grad_() for t in qkv)
        else:
            q, k, v = (_leaf((total, H, d), dtype, device) for _ in range(3))

        def forward():
            return hierarchical_attention(q, k, v, hierarchy)

        return (triton_uniform.turned_on()(forward) if kernels else forward), [q, k, v]

    def bound(dtype, device):
        shapes = bound_shapes(leaves, branching)
        blocks = [[_leaf((trees * f, H, w, d), dtype, device) for _ in range(3)] for f, w in shapes]
        return (lambda: run_bound(blocks)), [t for blk in blocks for t in blk]

    flat = (trees, H, leaves, d)
    nbytes = 4 * 3 * total * H * d * 4  # q, k, v, their grads, outputs and workspace
    graph = total <= GRAPH_MAX_LEAVES
    methods = {
        "hsa": Method(hsa, work=total, peak_bytes=nbytes, graph=graph),
        "hsa-heads-first": Method(
            lambda dt, dev: hsa(dt, dev, heads_first=True), total, nbytes, graph=graph
        ),
        "sdpa-flash": Method(
            lambda dt, dev: _sdpa("flash", flat, dt, dev), trees * leaves**2, nbytes, graph=graph
        ),
        "sdpa-efficient": Method(
            lambda dt, dev: _sdpa("efficient", flat, dt, dev),
            trees * leaves**2,
            nbytes,
            graph=graph,
        ),  # fmt: skip
        "level-bound": Method(bound, work=total, peak_bytes=nbytes, graph=graph),
    }
    if triton and times_triton_kernels(run):
        methods["hsa-triton"] = Method(
            lambda dt, dev: hsa(dt, dev, kernels=True), total, nbytes, graph=graph
        )
    if compiled:
        methods["hsa-compiled"] = Method(
            lambda dt, dev: hsa(dt, dev, plan=True), total, nbytes, compiled=True
        )
    return methods


def times_triton_kernels(run: Run) -> bool:
    """Whether the run times the Triton kernels of equal-fanout HSA (``hsa-triton``): on
    CUDA, with Triton installed."""
    return run.device.type == "cuda" and triton_uniform.available()


def hsa_causal_methods(run: Run, trees: int, leaves: int) -> dict[str, Method]:
    """The strictly causal op (decoder training) on ``trees`` window trees of ``leaves``
    leaves, its ``CausalPlan`` built once on the CPU and moved (as a training loop does),
    vs causal SDPA over each tree's leaves (flash, memory-efficient)."""
    from torch_geometric.data import Batch

    from hiergraph.data import window_hierarchy
    from hiergraph.ops import causal_hierarchical_attention

    H, d = run.sizes.heads, run.sizes.dim
    total = trees * leaves

    def hsa(dtype, device):
        batch = Batch.from_data_list([window_hierarchy(leaves, tree_branching(leaves))] * trees)
        plan = batch.tree_index().causal_plan.to(device)
        q, k, v = (_leaf((total, H, d), dtype, device) for _ in range(3))
        return (lambda: causal_hierarchical_attention(q, k, v, plan)), [q, k, v]

    flat = (trees, H, leaves, d)
    nbytes = 4 * 3 * total * H * d * 4
    graph = total <= GRAPH_MAX_LEAVES
    sdpa = {
        f"sdpa-{backend}": Method(
            lambda dt, dev, b=backend: _sdpa(b, flat, dt, dev, causal=True),
            trees * leaves**2,
            nbytes,
            graph=graph,
        )
        for backend in ("flash", "efficient")
    }
    return {"hsa-causal": Method(hsa, work=total, peak_bytes=nbytes, graph=graph), **sdpa}


def hsa_lengths_methods(
    run: Run, trees: int, leaves: int, ragged: bool = False, triton: bool = False
) -> dict[str, Method]:
    """Sequences of different lengths (uniform in ``[leaves / 2, leaves]``, seeded), one
    window tree each (with ``ragged``, windows of random sizes: ``random_window_hierarchy``,
    as documents' sentences and paragraphs vary): HSA's default kernel (the forest padded
    to equal fanout, where that pays), its block kernel, and SDPA on the zero-padded batch
    with a key padding mask; with ``triton``, where the run times them, ``hsa-triton``."""
    from torch_geometric.data import Batch

    from hiergraph.data import random_window_hierarchy, window_forest
    from hiergraph.ops import hierarchical_attention

    H, d = run.sizes.heads, run.sizes.dim
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(leaves // 2, leaves + 1, (trees,), generator=gen)
    total = int(lengths.sum())
    branching = tree_branching(leaves)

    def forest():
        if not ragged:
            return window_forest(lengths, branching)
        gen = torch.Generator().manual_seed(1)
        return Batch.from_data_list(
            [random_window_hierarchy(int(n), branching, generator=gen) for n in lengths]
        )

    def hsa(dtype, device, kernel="dense", kernels=False):
        index = forest().tree_index().to(device)
        q, k, v = (_leaf((total, H, d), dtype, device) for _ in range(3))

        def forward():
            return hierarchical_attention(q, k, v, index, kernel=kernel)

        return (triton_uniform.turned_on()(forward) if kernels else forward), [q, k, v]

    def sdpa(dtype, device):
        q, k, v = (_leaf((trees, H, leaves, d), dtype, device) for _ in range(3))
        keys = (torch.arange(leaves)[None] < lengths[:, None])[:, None, None, :].to(device)
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keys)), [q, k, v]

    nbytes = 4 * 3 * trees * leaves * H * d * 4
    graph = trees * leaves <= GRAPH_MAX_LEAVES
    methods = {
        "hsa": Method(hsa, work=total, peak_bytes=nbytes, graph=graph),
        "hsa-blocks": Method(lambda dt, dev: hsa(dt, dev, "blocks"), total, nbytes, graph=graph),
        "sdpa-masked": Method(sdpa, work=trees * leaves**2, peak_bytes=nbytes, graph=graph),
    }
    if triton and times_triton_kernels(run):
        methods["hsa-triton"] = Method(
            lambda dt, dev: hsa(dt, dev, kernels=True), total, nbytes, graph=graph
        )
    return methods


def hsa_cases(sizes: Sizes) -> list[tuple[int, int]]:
    """``(trees, leaves per tree)`` of the HSA section's equal-tree cases: the batches,
    then the single trees."""
    return [*sizes.hsa_batches, *((1, leaves) for leaves in sizes.hsa_trees)]


def section_hsa(run: Run, end: float) -> None:
    for trees, leaves in hsa_cases(run.sizes):
        run_case(run, "hsa", end, f"{trees}x{leaves}", hsa_methods(run, trees, leaves))
    trees, leaves = run.sizes.hsa_batches[0]  # the same batch, sequences of different lengths
    run_case(run, "hsa", end, f"{trees}x{leaves} mixed", hsa_lengths_methods(run, trees, leaves))
    trees, leaves = run.sizes.hsa_batches[min(1, len(run.sizes.hsa_batches) - 1)]
    ragged = hsa_lengths_methods(run, trees, leaves, ragged=True)  # windows of random sizes
    run_case(run, "hsa", end, f"{trees}x{leaves} ragged", ragged)
    for trees, leaves in run.sizes.hsa_batches:  # the strictly causal op
        run_case(
            run, "hsa", end, f"{trees}x{leaves} causal", hsa_causal_methods(run, trees, leaves)
        )


def section_triton(run: Run, end: float) -> dict | None:
    """The Triton kernels (``hsa-triton``) beside the default path and the peers of the
    HSA section's targets, on its batches and its first single tree, and on its batches of
    sequences of different lengths (equal and random windows), each method also as a CUDA
    graph (``+graph``); then where the time of their 32 x 512 step goes, in bf16, beside the
    default path's (``profile`` rows). In a
    subprocess of its own: kernels that have never run on a GPU could leave its CUDA context
    unusable (an illegal memory access), which must not cost the sections after it. Its rows
    join this run's."""
    if not times_triton_kernels(run):
        return {"status": "skipped", "reason": "needs CUDA and Triton"}
    if not run.args.triton_child:
        return _triton_subprocess(run, end)
    peers = ("hsa", "hsa-triton", "level-bound", "sdpa-flash")
    for trees, leaves in [*run.sizes.hsa_batches, (1, run.sizes.hsa_trees[0])]:
        methods = hsa_methods(run, trees, leaves, triton=True)
        run_case(run, "triton", end, f"{trees}x{leaves}", {n: methods[n] for n in peers})
    lengths = ("hsa", "hsa-triton", "sdpa-masked")
    trees, leaves = run.sizes.hsa_batches[0]
    mixed = hsa_lengths_methods(run, trees, leaves, triton=True)
    run_case(run, "triton", end, f"{trees}x{leaves} mixed", {n: mixed[n] for n in lengths})
    trees, leaves = run.sizes.hsa_batches[min(1, len(run.sizes.hsa_batches) - 1)]
    ragged = hsa_lengths_methods(run, trees, leaves, ragged=True, triton=True)
    run_case(run, "triton", end, f"{trees}x{leaves} ragged", {n: ragged[n] for n in lengths})
    methods = hsa_methods(run, trees, leaves, triton=True)
    profiled = {n: methods[n] for n in ("hsa", "hsa-triton")}
    run_case(run, "profile", end, f"{trees}x{leaves}", profiled, ("bf16",), profile=True)
    return None


def _triton_subprocess(run: Run, end: float) -> dict:
    """:func:`section_triton` in a child ``gpu.py`` (into ``OUT/triton``), whose rows join
    this run's."""
    out = Path(run.args.out) / "triton"
    status = child_run(run, end, out, ["--triton-child", "--sections", "triton"], {"triton": 1})
    if (out / "gpu.json").exists():  # what it measured, also when it died or was killed
        run.rows.extend(json.loads((out / "gpu.json").read_text())["rows"])
    return status


#: seconds a child run stops before its parent's limit: a warm-up or a CUDA-graph capture in
#: progress at its deadline cannot be interrupted
CHILD_MARGIN_S = 15.0


def child_run(run: Run, end: float, out: Path, args: list[str], shares: dict) -> dict:
    """This script with ``--graphs`` and ``args`` in a subprocess, into ``out``, until the
    section's end ``end``: its deadline on this run's clock (``--clock-start``; Linux's
    monotonic clock is the system's), :data:`CHILD_MARGIN_S` before the end, so that it
    writes what it measured before this process would kill it; its sections' caps are the
    ``shares`` (section -> fraction) of the time left. Returns the section's status."""
    left = run.left(end)
    deadline = time.monotonic() - run.started + left - CHILD_MARGIN_S
    caps = [f"{name}={share * (left - CHILD_MARGIN_S):.0f}" for name, share in shares.items()]
    command = [sys.executable, str(Path(__file__).resolve()), "--graphs", *args,
               "--out", str(out), "--deadline", f"{deadline:.1f}",
               "--clock-start", repr(run.started), "--caps", *caps]  # fmt: skip
    command += ["--quick"] if run.args.quick else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"killed after {left:.0f} s"}
    status = {"status": "done" if done.returncode == 0 else "error", "returncode": done.returncode}
    if done.returncode:  # the end of its log says where it died
        status["reason"] = portable("\n".join(done.stderr.strip().splitlines()[-40:]))[-4000:]
    return status


def hmatrix_methods(length: int, tf32: bool = False) -> dict[str, Method]:
    """H-matrix attention and SDPA at ``length`` tokens; with ``tf32`` (on CUDA) also
    ``hmatrix-tf32``: the same step with float32 matrix products on TF32 tensor cores
    (:func:`tf32_matmuls`). bf16 inputs are computed in float32 inside, so their products
    run there too: exact for the inputs' own values (a bf16 number is a TF32 one), the other
    operands (the coarse levels' averages, the attention weights) rounded to TF32's 10-bit
    mantissa."""
    from hiergraph.ops.hmatrix import hmatrix_attention

    H, d, block = hmatrix_bench.HEADS, hmatrix_bench.DIM, hmatrix_bench.BLOCK
    shape = (1, H, length, d)

    def ours(dtype, device):
        q, k, v = (_leaf(shape, dtype, device) for _ in range(3))
        return (lambda: hmatrix_attention(q, k, v, block)), [q, k, v]

    def sdpa(dtype, device):
        q, k, v = (_leaf(shape, dtype, device) for _ in range(3))
        return (lambda: F.scaled_dot_product_attention(q, k, v)), [q, k, v]

    nbytes = 4 * 3 * length * H * d * 4
    methods = {
        "hmatrix": Method(ours, work=length, peak_bytes=nbytes, graph=True),
        # the quadratic peer is launch-bound only at the shorter length
        "sdpa": Method(sdpa, length**2, nbytes, graph=length <= GRAPH_MAX_LEAVES),
    }
    if tf32:
        methods["hmatrix-tf32"] = Method(ours, work=length, peak_bytes=nbytes, tf32=True)
    return methods


def section_hmatrix(run: Run, end: float) -> None:
    for length in run.sizes.hmatrix:
        methods = hmatrix_methods(length, tf32=run.device.type == "cuda")
        run_case(run, "hmatrix", end, f"L={length}", methods)


def section_vcc(run: Run, end: float) -> None:
    for n in run.sizes.vcc:

        def layer(which: str, dtype, device, n=n):
            enc = vcc_bench._encoder(trained_like=False).to(device)
            x, vip = (t.to(device) for t in vcc_bench._inputs(n, trained_like=False))
            x.requires_grad_()
            if which == "vcc":
                return (lambda: enc(x, vip)), [x, *enc.parameters()]
            return (lambda: enc.layers[0](x)), [x, *enc.parameters()]

        nbytes = 16 * n * vcc_bench.DIM * 4  # activations of one layer, fwd + bwd
        methods = {
            "vcc-layer": Method(
                lambda dt, dev, f=layer: f("vcc", dt, dev), n, nbytes, True, graph=True
            ),
            "full-layer": Method(  # launch-bound only at the shorter length
                lambda dt, dev, f=layer: f("full", dt, dev),
                n**2,
                nbytes,
                True,
                graph=n <= GRAPH_MAX_LEAVES,
            ),
        }
        run_case(run, "vcc", end, f"n={n}", methods)


def section_masked(run: Run, end: float) -> None:
    from torch_geometric.nn import TransformerConv

    from hiergraph.masks import BandMask
    from hiergraph.nn import MaskedAttentionConv

    n = run.sizes.masked
    cin, cout, heads = masked_bench.IN_CHANNELS, masked_bench.OUT_CHANNELS, masked_bench.HEADS

    masks = {kind: masked_bench.build_mask(kind, n)[0] for kind in ("window", "random")}

    def conv(kind: str, method: str, dtype, device):
        edge_index = masks[kind]
        ours = MaskedAttentionConv(cin, cout, heads=heads, root_weight=False)
        if method == "transformer_conv":
            layer = TransformerConv(cin, cout, heads=heads, root_weight=False)
            layer.load_state_dict(ours.state_dict(), strict=False)
        else:
            layer = ours
        mask = BandMask((n,), masked_bench.WINDOW, masked_bench.WINDOW)
        edges = mask if method == "ours-bandmask" else edge_index.to(device)
        layer = layer.to(device)
        x = randn(n, cin, device=device).requires_grad_()
        return (lambda: layer(x, edges)), [x, *layer.parameters()]

    edges = n * (2 * masked_bench.WINDOW + 1)
    for kind in ("window", "random"):
        names = ["ours", "transformer_conv"] + (["ours-bandmask"] if kind == "window" else [])
        methods = {
            name: Method(
                lambda dt, dev, k=kind, m=name: conv(k, m, dt, dev),
                work=edges,  # per-edge [E, H, C] tensors: about 6 for TransformerConv
                peak_bytes=edges * heads * cout * 4 * (6 if name == "transformer_conv" else 1),
                autocast=True,
                graph=name == "ours-bandmask",  # raw edges are recognised per call (syncs)
            )
            for name in names
        }
        run_case(run, "masked", end, f"{kind} n={n}", methods)


def section_cone(run: Run, end: float) -> None:
    from torch_geometric.nn import GATConv

    from hiergraph.nn import ConeConv

    nodes, num_edges = run.sizes.cone

    def conv(variant: str, dtype, device):
        gen = torch.Generator().manual_seed(0)
        edge_index = torch.randint(0, nodes, (2, num_edges), generator=gen).to(device)
        if variant == "gat":
            layer = GATConv(64, 8, heads=8)
        else:
            layer = ConeConv(64, 8, heads=8, variant=variant)
        layer = layer.to(device)
        x = randn(nodes, 64, device=device).requires_grad_()
        return (lambda: layer(x, edge_index)), [x, *layer.parameters()]

    methods = {
        name: Method(lambda dt, dev, v=name: conv(v, dt, dev), autocast=True)
        for name in ("gat", "penumbral", "umbral")
    }
    run_case(run, "cone", end, f"cora-size n={nodes}", methods)


def section_graph_hsa(run: Run, end: float) -> None:
    from torch_geometric.nn import GCNConv

    from hiergraph.data import window_hierarchy
    from hiergraph.nn import GraphHSANet

    n, channels = run.sizes.graph_hsa, 64
    edge_index = planted_partition(n, 128, 4, 1).to(run.device)  # blocks of 128 nodes
    tree = window_hierarchy(n, tree_branching(n))
    tree.tree_index()  # structure, built once on the CPU, moves with the tree
    tree = tree.to(run.device)

    def net(kind: str, dtype, device):
        model = GraphHSANet(
            channels, channels, 16, conv_factory=lambda c: GCNConv(c, c, cached=True),
            num_layers=2, heads=2, dropout=0.0,
        )  # fmt: skip
        model = model.to(device)
        x = randn(n, channels, device=device).requires_grad_()
        if kind == "gcn":  # the same convs without the attention branch
            convs = [layer.conv for layer in model.layers]

            def gcn():
                h = model.lin_in(x)
                for conv in convs:
                    h = torch.relu(conv(h, edge_index)) + h
                return model.lin_out(h)

            return gcn, [x, *model.parameters()]
        return (lambda: model(x, edge_index, tree)), [x, *model.parameters()]

    nbytes = 40 * n * channels * 4  # node features through 2 layers, fwd + bwd
    methods = {
        kind: Method(lambda dt, dev, k=kind: net(k, dt, dev), n, nbytes, autocast=True)
        for kind in ("graph_hsa_net", "gcn")
    }
    run_case(run, "graph_hsa", end, f"n={n}", methods)


def section_profile(run: Run, end: float) -> None:
    """Where the time of the steps that are far from their targets goes, in bf16: the
    second HSA batch (eager, heads-first, and its forward through ``torch.compile``) beside
    the per-level bound and flash SDPA, and the longest H-matrix case beside SDPA (the
    Triton kernels' step: :func:`section_triton`). Each row has its :func:`profile_step`
    breakdown."""
    trees, leaves = run.sizes.hsa_batches[min(1, len(run.sizes.hsa_batches) - 1)]
    hsa = hsa_methods(run, trees, leaves, compiled=True)
    names = ("hsa", "hsa-heads-first", "hsa-compiled", "level-bound", "sdpa-flash")
    methods = {name: hsa[name] for name in names}
    run_case(run, "profile", end, f"{trees}x{leaves}", methods, ("bf16",), profile=True)
    length = run.sizes.hmatrix[-1]
    run_case(run, "profile", end, f"L={length}", hmatrix_methods(length), ("bf16",), True)


def profile_step(step: Callable[[], None], device: torch.device, steps: int = 3) -> dict:
    """``steps`` steps under ``torch.profiler``, per step: the kernels launched and their
    summed device time (on the CPU: the outermost operator calls and their CPU time), the
    wall time, and the ``PROFILE_TOP`` kernels (operators) that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall = (time.perf_counter() - started) / steps
    if cuda:
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        key = lambda e: e.device_time_total  # noqa: E731 - one per event kind
    else:  # the CPU: the operator calls not made inside another operator
        events = [e for e in prof.events() if _outermost_operator(e)]
        key = lambda e: e.cpu_time_total  # noqa: E731
    totals: dict[str, list[float]] = {}
    for event in events:
        total = totals.setdefault(event.name[:100], [0, 0.0])
        total[0] += 1
        total[1] += key(event)
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:PROFILE_TOP]
    return {
        "unit": "kernels" if cuda else "operators",
        "per_step": len(events) / steps,
        "busy_ms": sum(key(e) for e in events) / steps / 1e3,
        "wall_ms": 1e3 * wall,
        "top": [{"name": n, "calls": c / steps, "ms": t / steps / 1e3} for n, (c, t) in top],
    }


def _outermost_operator(event) -> bool:
    parent = event.cpu_parent
    return event.name.startswith("aten::") and not (parent and parent.name.startswith("aten::"))


def section_graphs(run: Run, end: float) -> dict | None:
    """The launch-bound sections again with ``--graphs``, in a subprocess of their own (a
    failed capture can leave a CUDA context unusable): ``OUT/graphs/gpu.json``."""
    if run.device.type != "cuda" or run.args.graphs:
        return {"status": "skipped", "reason": "needs CUDA; not inside a --graphs run"}
    # the short sections first: a capture that outlasts its cap costs only the sections after it
    shares = {"hmatrix": 0.15, "vcc": 0.2, "masked": 0.15, "hsa": 0.5}
    out = Path(run.args.out) / "graphs"
    return child_run(run, end, out, ["--sections", *shares], shares)


SECTIONS = {
    "tests": section_tests,
    "hsa": section_hsa,
    "triton": section_triton,
    "hmatrix": section_hmatrix,
    "vcc": section_vcc,
    "masked": section_masked,
    "cone": section_cone,
    "graph_hsa": section_graph_hsa,
    "profile": section_profile,
    "graphs": section_graphs,
    "compiled": section_compiled,
}


# -------------------------------------------------------------------------------- report


def environment(device: torch.device) -> dict:
    import torch_geometric

    meta = {
        "device": str(device),
        "device_name": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "command": portable("python benchmarks/gpu.py " + " ".join(sys.argv[1:])),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(device_name=props.name, device_memory_gib=props.total_memory / 2**30)
    sources = sorted((REPO / "hiergraph").rglob("*.py")) + sorted(
        (REPO / "benchmarks").glob("*.py")
    )  # which code ran, also where the checkout's git metadata is stale or absent
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sources)).hexdigest()
    meta["source_sha1"] = digest[:12]
    try:  # "-dirty" when the sources differ from the commit (a copied working tree)
        meta["commit"] = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return meta


def plot(rows: list[dict], path: Path) -> None:
    """One panel per section: median fwd+bwd time of every method, per case and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = list(dict.fromkeys(r["section"] for r in rows if r.get("median_ms")))
    if not sections:
        return
    fig, axes = plt.subplots(len(sections), 1, figsize=(10, 2.6 * len(sections)), squeeze=False)
    for ax, section in zip(axes[:, 0], sections, strict=True):
        done = [r for r in rows if r["section"] == section and r.get("median_ms")]
        groups = list(dict.fromkeys(f"{r['case']} {r['dtype']}" for r in done))
        methods = list(dict.fromkeys(r["method"] for r in done))
        width = 0.8 / len(methods)
        for i, method in enumerate(methods):
            mine = {
                f"{r['case']} {r['dtype']}": r["median_ms"] for r in done if r["method"] == method
            }
            xs = [g + i * width for g, name in enumerate(groups) if name in mine]
            ax.bar(xs, [mine[name] for name in groups if name in mine], width, label=method)
        ax.set_yscale("log")
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups, fontsize=7)
        ax.set_ylabel("fwd+bwd ms")
        ax.set_title(section, fontsize=9)
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu.json, gpu.png, the report")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, 3 rounds a case (a CPU smoke run)"
    )
    parser.add_argument("--deadline", type=float, default=450.0, help="stop after this (s)")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--caps", nargs="*", default=[], help="section=seconds overrides")
    parser.add_argument(
        "--graphs", action="store_true", help="on CUDA, also time CUDA-graph twins (+graph)"
    )
    parser.add_argument("--pytest", default=None, help="pytest arguments (default: -m cuda)")
    parser.add_argument("--triton-child", action="store_true", help=argparse.SUPPRESS)
    # a child run's clock: its parent's start (time.monotonic), so their deadlines agree
    parser.add_argument("--clock-start", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--compiled-pytest", default=None, help="pytest arguments of the compiled section"
    )
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu --quick for a smoke run")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    caps = dict(CAPS, **{k: float(v) for k, v in (c.split("=") for c in args.caps)})
    run = Run(args, device, QUICK if args.quick else FULL)
    if args.clock_start is not None:
        run.started = args.clock_start
    run.meta = environment(device) | {"quick": args.quick, "deadline_s": args.deadline}
    run.meta["graphs"] = args.graphs
    run.meta["caps_s"] = caps
    run.meta["started"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    for name in args.sections:
        start = time.monotonic()
        if start > run.deadline:
            run.sections[name] = {"status": "skipped", "reason": "deadline"}
            continue
        if run.broken and not (name in SUBPROCESS_SECTIONS and not args.triton_child):
            run.sections[name] = {"status": "skipped", "reason": BROKEN}
            continue
        run.sections[name] = {"status": "running", "cap_s": caps[name]}
        try:
            status = SECTIONS[name](run, start + caps[name]) or {"status": "done"}
        except Exception as error:  # noqa: BLE001 - a broken section must not lose the rest
            status = {"status": "error", "reason": _failure(error)["reason"]}
        status["elapsed_s"] = time.monotonic() - start
        run.sections[name].update(status)
        run.write(plot_too=True)
        run.broken |= not release(device)
    run.meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    run.meta["stopped_by_deadline"] = time.monotonic() > run.deadline
    run.write(plot_too=True)
    print(f"{'section':<9} {'case':<14} {'type':<4} {'method':<18}{'fwd+bwd':>13} {'peak':>13}"
          f" {'vs 1st':>8}")  # fmt: skip
    print("\n".join(_line(r) for r in run.rows))
    report = {"meta": run.meta, "tests": run.tests, "rows": run.rows}
    for twin in ("", "+graph") if args.graphs else ("",):
        print(f"\ntargets{' (CUDA-graph twins)' if twin else ''}:")
        print("\n".join(gpu_targets.lines(gpu_targets.evaluate(report, twin))))
    print(f"wrote {Path(args.out) / 'gpu.json'} and gpu.png in {run.meta['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
