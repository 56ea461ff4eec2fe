"""HSA at the lengths most models run: batches of 128–2,048-token window trees, CPU.

    python benchmarks/hsa_short.py                 # the three rows, 2 threads, eager + compiled
    python benchmarks/hsa_short.py --no-compile    # eager only (no inductor warm-up)
    python benchmarks/hsa_short.py --quick         # one small row, for a smoke test

For every row (``B`` sequences of ``L`` tokens, a :func:`~hiergraph.data.window_forest`
with the given branching, 4 heads of 64 channels, float32) it times forward+backward of

* ``flat``: ``scaled_dot_product_attention`` on the ``[B, H, L, d]`` batch;
* ``bound``: one batched SDPA call per level over that level's families (the FLOPs of
  HSA's family attention with no pooling, gating or layout changes);
* ``hsa``: :func:`~hiergraph.ops.hierarchical_attention` on contiguous ``[L, H, d]``
  inputs: on the CPU the compiled kernel of :mod:`hiergraph.ops.hsa.native`, one task per
  (tree, head) that reads the leaves where they lie;
* ``hsa-torch``: the same op on PyTorch operations alone (the kernel turned off, as with
  ``HIERGRAPH_NATIVE=0``): equal-fanout forests run as reshaped views, one autograd node
  with a written backward, the leaf level read in place by one product per head;
* ``hsa-heads-first``: the op on inputs whose memory is heads first (``[H, L, d]``
  storage viewed as ``[L, H, d]``, the layout ``flat`` gets as ``[B, H, L, d]``);
* ``hsa-blocks``: the same op forced onto the general block kernel (``kernel="blocks"``),
  the path every forest took before the reshaped one existed;
* ``flat-causal``, ``hsa-causal``, ``hsa-causal-edges``: the strictly causal
  counterparts: SDPA with ``is_causal=True``,
  :func:`~hiergraph.ops.causal_hierarchical_attention` (equal-fanout forests run as
  reshaped views) and the same op with ``kernel="edge"``, its general path;
* ``hsa-compiled``: ``torch.compile(hierarchical_attention, fullgraph=True)`` with the plan
  fixed and static shapes (inductor on CPU); its compile time is recorded separately.

A pass is the forward and the backward of a fixed random output gradient (the same for
every round, in the output's memory layout, as a loss would send it). Both wall-clock and
process CPU time are recorded. Results:
``benchmarks/results/hsa_short_<threads>t.json`` and ``.png`` (``--out``: another JSON path,
the plot beside it; a ``--quick`` run writes into ``benchmarks/results/`` only when
``--out`` names it, else into a fresh temporary folder, printed).

Every method runs with freed CPU memory kept for reuse (``--allocator default``: glibc's
settings, under which each step page-faults its large buffers in again). Rounds are
interleaved (each round runs every method once, so all see the same machine load); the
JSON keeps every sample, and medians and the spread (min–max) are reported. A profile of
one ``hsa`` and one ``hsa-torch`` forward+backward per row (self CPU time by operator,
grouped into matrix products, layout copies, element-wise, reductions and the rest; the
kernel is one call) is written to the JSON too.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import timing
import torch
import torch.nn.functional as F
from hsa_scaling import bound_shapes, run_bound
from torch.profiler import ProfilerActivity, profile

from hiergraph.data import window_forest
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention
from hiergraph.ops.hsa import native

HEADS, DIM = 4, 64
ROWS = ((64, 128, (16, 8)), (32, 512, (16, 8, 4)), (8, 2048, (16, 8, 4, 4)))
QUICK_ROWS = ((8, 64, (8, 8)),)
GROUPS = {
    "matmul": ("aten::bmm", "aten::mm", "aten::baddbmm", "aten::addmm", "aten::matmul"),
    "layout copies": ("aten::copy_", "aten::clone", "aten::contiguous"),
    "reductions": ("aten::sum", "aten::amax", "aten::logsumexp", "aten::max"),
}


def make_cases(batch: int, length: int, branching: tuple[int, ...], compile_hsa: bool):
    """``{method: (fn, leaf tensors)}`` for one row; every ``fn()`` returns a tensor to sum."""
    gen = torch.Generator().manual_seed(0)

    def leaf_qkv(*shape):
        return [torch.randn(*shape, generator=gen).requires_grad_() for _ in range(3)]

    forest = window_forest([length] * batch, branching)
    index = forest.tree_index()
    if index.uniform is None:
        raise ValueError(f"{length} tokens with branching {branching} is not an equal tree")
    hq, fq = leaf_qkv(batch * length, HEADS, DIM), leaf_qkv(batch, HEADS, length, DIM)
    hf = [t.detach().transpose(0, 1) for t in leaf_qkv(HEADS, batch * length, DIM)]
    hf = [t.requires_grad_() for t in hf]  # heads-first memory, viewed [L, H, d]
    blocks = [leaf_qkv(batch * f, HEADS, w, DIM) for f, w in bound_shapes(length, branching)]
    plan = forest.causal_plan()
    cases = {
        "flat": (lambda: F.scaled_dot_product_attention(*fq), fq),
        "bound": (lambda: run_bound(blocks), [t for blk in blocks for t in blk]),
        "hsa": (lambda: hierarchical_attention(*hq, index), hq),
        "hsa-torch": (on_torch_ops(lambda: hierarchical_attention(*hq, index)), hq),
        "hsa-heads-first": (lambda: hierarchical_attention(*hf, index), hf),
        "hsa-blocks": (lambda: hierarchical_attention(*hq, index, kernel="blocks"), hq),
        "flat-causal": (lambda: F.scaled_dot_product_attention(*fq, is_causal=True), fq),
        "hsa-causal": (lambda: causal_hierarchical_attention(*hq, plan), hq),
        "hsa-causal-heads-first": (lambda: causal_hierarchical_attention(*hf, plan), hf),
        "hsa-causal-edges": (
            lambda: causal_hierarchical_attention(*hq, plan, kernel="edge"),
            hq,
        ),
    }
    compile_s = None
    if compile_hsa:
        torch._dynamo.reset()  # every row compiles its own static-shape graph
        compiled = torch.compile(lambda q, k, v: hierarchical_attention(q, k, v, index),
                                 fullgraph=True, dynamic=False)  # fmt: skip
        t0 = time.perf_counter()
        compiled(*hq).sum().backward()
        compile_s = time.perf_counter() - t0
        cases["hsa-compiled"] = (lambda: compiled(*hq), hq)
    return cases, index, compile_s


def on_torch_ops(fn: Callable) -> Callable:
    """``fn`` with the compiled HSA kernel turned off while it runs (the autograd node, and
    so the backward, is chosen in the forward)."""

    def run():
        previous = native.set_enabled(False)
        try:
            return fn()
        finally:
            native.set_enabled(previous)

    return run


def interleaved_times(cases: dict[str, tuple[Callable, list]], rounds: int) -> tuple[dict, dict]:
    """Wall-clock and process CPU seconds of forward+backward of every case (the backward of
    its :func:`output_gradient`), ``rounds`` interleaved rounds after one warm-up: two
    ``{method: [seconds, ...]}``. CPU time is less sensitive to other processes on a
    shared machine (with one thread it is the work itself; with more it also counts
    threads waiting for work)."""
    steps = {
        method: (timing.grad_backward(fn, output_gradient(fn)), tensors)
        for method, (fn, tensors) in cases.items()
    }
    samples = timing.interleaved(steps, rounds, timing.WALL_AND_CPU)
    wall = {method: [w for w, _ in pairs] for method, pairs in samples.items()}
    cpu = {method: [c for _, c in pairs] for method, pairs in samples.items()}
    return wall, cpu


def output_gradient(fn: Callable) -> torch.Tensor:
    """A fixed random gradient for the output of ``fn`` (one forward), in the output's
    memory layout, as a loss downstream would send it (``out.sum()`` would send one
    broadcast value, a case no training loop sees)."""
    return torch.randn_like(fn().detach())


def profile_breakdown(fn: Callable, tensors: list, reps: int = 3) -> dict:
    """Self CPU time per forward+backward by operator group, and the top operators."""
    step = timing.grad_backward(fn, output_gradient(fn))
    step()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            timing.reset_grads(tensors)
            step()
    by_op = {e.key: e.self_cpu_time_total / reps / 1e6 for e in prof.key_averages()}
    calls = {e.key: e.count // reps for e in prof.key_averages() if e.key.startswith("aten::")}
    groups = dict.fromkeys([*GROUPS, "element-wise and other"], 0.0)
    for op, seconds in by_op.items():
        name = next((g for g, ops in GROUPS.items() if op in ops), "element-wise and other")
        groups[name] += seconds
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:10]
    return {
        "self_cpu_s_by_group": groups,
        "top_ops_s": dict(top),
        "aten_calls": sum(calls.values()),
    }


def flop_ratio(length: int, branching: tuple[int, ...]) -> float:
    """Attention FLOPs of flat softmax over those of HSA's family attention (per sequence)."""
    return length * length / sum(f * w * w for f, w in bound_shapes(length, branching))


def plot(rows: list[dict], path: Path) -> None:
    labels = [f"{r['batch']}×{r['length']}" for r in rows]
    title = f"HSA vs flat SDPA, CPU, {rows[0]['threads']} threads"
    bar_plot(rows, labels, title, path, log=True)


def bar_plot(
    rows: list[dict], labels: list[str], title: str, path: Path, log: bool,
    what: str = "forward+backward",
) -> None:  # fmt: skip
    """Median time (ms) of ``what`` of every method of every row, as grouped bars (a method
    a row lacks: no bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(m for r in rows for m in r["median_s"]))
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(rows)), 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r["median_s"].get(m, 0.0) * 1e3 for r in rows], width, label=m)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(f"{what}, ms (median)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=7, out="hsa_short_<threads>t.json")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, f"hsa_short_{args.threads}t.json", args.quick)
    results = []
    for batch, length, branching in QUICK_ROWS if args.quick else ROWS:
        cases, index, compile_s = make_cases(batch, length, branching, args.compile)
        times, cpu = interleaved_times(cases, args.rounds)
        median, cpu_median = timing.medians(times), timing.medians(cpu)
        row = {
            "batch": batch,
            "length": length,
            "branching": list(branching),
            "threads": args.threads,
            "rounds": args.rounds,
            "flop_ratio_flat_over_hsa": flop_ratio(length, branching),
            "median_s": median,
            "spread_s": timing.spreads(times),
            "samples_s": times,
            "flat_over": {m: median["flat"] / median[m] for m in median},
            "over_bound": {m: median[m] / median["bound"] for m in median},
            "cpu_median_s": cpu_median,
            "cpu_samples_s": cpu,
            "cpu_flat_over": {m: cpu_median["flat"] / cpu_median[m] for m in cpu_median},
            "cpu_over_bound": {m: cpu_median[m] / cpu_median["bound"] for m in cpu_median},
            "compile_s": compile_s,
            "profiles": {m: profile_breakdown(*cases[m]) for m in ("hsa", "hsa-torch")},
        }
        results.append(row)
        print(
            f"{batch:>3} × {length:<5} "
            + "  ".join(f"{m} {v * 1e3:7.1f} ms" for m, v in median.items())
            + f"  | flat/hsa {row['flat_over']['hsa']:.2f}"
            + f"  hsa/bound {row['over_bound']['hsa']:.2f}"
            + f"  (CPU time: {row['cpu_flat_over']['hsa']:.2f}, {row['cpu_over_bound']['hsa']:.2f})"
        )
    command = timing.round_command("hsa_short.py", args, *["--no-compile"] * (not args.compile))
    meta = {"heads": HEADS, "dim": DIM, "dtype": "float32", "torch": torch.__version__,
            "command": command, "allocator": args.allocator,
            # the vector instructions PyTorch and the compiled kernel use (AVX512, AVX2, ...)
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))
    assert all(math.isfinite(r["median_s"]["hsa"]) for r in results)


if __name__ == "__main__":
    main()
