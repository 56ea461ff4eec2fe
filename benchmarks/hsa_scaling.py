"""HSA vs flat softmax attention vs the per-level SDPA bound, CPU, float32.

    python benchmarks/hsa_scaling.py            # N = 1K .. 256K, 2 threads
    python benchmarks/hsa_scaling.py --quick    # N = 1K, 4K
    python benchmarks/hsa_scaling.py --no-compile   # without the compiled case

For every N it times, in one process and interleaved (every repetition runs
each method once; medians of ``--reps`` repetitions, 2 fewer above 16K),
forward and forward+backward of

* ``hsa-window``: HSA over a window hierarchy (16, 8, 4, 2, 2, …) bottom-up,
  extra 2s until the remainder root has at most 16 children, on contiguous
  ``[N, H, d]`` inputs (which it copies to its heads-first working layout);
* ``hsa-window-heads-first``: the same on inputs whose memory is already heads first
  (``[H, N, d]`` viewed as ``[N, H, d]``): no copies (no memory run: same footprint);
* ``hsa-window-compiled``: ``hsa-window`` through ``torch.compile(fullgraph=True,
  dynamic=False)`` with the plan fixed (inductor on CPU; its compile time, forward+backward
  and forward under ``no_grad``, is recorded per N, and no memory run);
* ``hsa-ragged``: HSA over a random ragged window hierarchy with the same
  mean branching (window sizes uniform in [1, 2b-1]);
* ``flat-sdpa``: ``scaled_dot_product_attention`` over all N leaves (up to
  ``--max-flat``);
* ``bound``: one batched SDPA call per level of the window hierarchy over
  that level's families: the FLOPs of HSA's family attention with no
  pooling, gating or scatter overhead.

Every method runs with freed CPU memory kept for reuse (``--allocator default``: glibc's
settings). Peak memory of a forward+backward is measured in a fresh subprocess (Linux)
as the growth of the resident set's high-water mark over the resident set
before it, after one warm-up run (not for flat SDPA). The 1-minute
load average of the machine is recorded before and after each N, since the
absolute times depend on it. Results go to
``benchmarks/results/hsa_scaling.json`` and ``hsa_scaling.png`` (``--out``: another JSON
path, the plot beside it). A ``--quick`` run writes into ``benchmarks/results/`` only when
``--out`` names it, else into a fresh temporary folder, printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import timing
import torch
import torch.nn.functional as F
from memory import peak_rss_mib
from torch.nn.attention import SDPBackend, sdpa_kernel

from hiergraph.data import random_window_hierarchy, window_hierarchy
from hiergraph.ops import hierarchical_attention

HEADS, DIM = 4, 64
# the per-level bound's SDPA kernels: every backend but cuDNN's
BOUND_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
BOUND_BATCH = 32768  # families per SDPA call of the bound
METHODS = (
    "hsa-window",
    "hsa-window-heads-first",
    "hsa-window-compiled",
    "hsa-ragged",
    "bound",
    "flat-sdpa",
)
NO_MEMORY_RUN = ("flat-sdpa", "hsa-window-heads-first", "hsa-window-compiled")


def branching_for(n: int) -> tuple[int, ...]:
    """(16, 8, 4, 2) then 2s until at most 16 nodes remain below the root."""
    branching, remaining = [16, 8, 4, 2], n / (16 * 8 * 4 * 2)
    while remaining > 16:
        branching.append(2)
        remaining /= 2
    return tuple(branching)


def bound_shapes(n: int, branching: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(families, width)`` of every level of the per-level bound over ``n`` leaves: windows
    of ``b`` leaves (or nodes) per level, then one root family over what remains."""
    shapes, count = [], n
    for b in (*branching, None):
        families, width = (-(-count // b), b) if b else (1, count)
        shapes.append((families, width))
        count = families
        if b is None or count == 1:
            break
    return shapes


def run_bound(blocks: list[list[torch.Tensor]]) -> torch.Tensor:
    """One batched SDPA call per level (``blocks``: per level ``[q, k, v]`` of shape
    ``[families, heads, width, d]``), in calls of at most ``BOUND_BATCH`` families (a CUDA
    grid dimension holds at most 65,535 blocks, and flash attention spends one on the
    batch); the outputs, flattened and concatenated."""
    with sdpa_kernel(BOUND_BACKENDS):  # cuDNN's kernel fails on 10^5-family batches
        return torch.cat([
            F.scaled_dot_product_attention(*(t[i : i + BOUND_BATCH] for t in blk)).reshape(-1)
            for blk in blocks
            for i in range(0, blk[0].size(0), BOUND_BATCH)
        ])  # fmt: skip


def make_case(method: str, n: int, seed: int = 0):
    """A closure running forward (and backward) of ``method`` at size ``n``."""
    gen = torch.Generator().manual_seed(seed)
    branching = branching_for(n)

    def leaf_qkv(*shape):
        return [torch.randn(*shape, generator=gen).requires_grad_() for _ in range(3)]

    if method == "hsa-window-heads-first":  # [H, N, d] memory viewed as [N, H, d]: no copies
        index = window_hierarchy(n, branching).tree_index()
        q, k, v = (t.detach().transpose(0, 1).requires_grad_() for t in leaf_qkv(HEADS, n, DIM))
        return lambda: hierarchical_attention(q, k, v, index), (q, k, v)
    if method == "hsa-window-compiled":
        index = window_hierarchy(n, branching).tree_index()
        q, k, v = leaf_qkv(n, HEADS, DIM)
        torch._dynamo.reset()  # every N compiles its own static-shape graph
        compiled = torch.compile(lambda q, k, v: hierarchical_attention(q, k, v, index),
                                 fullgraph=True, dynamic=False)  # fmt: skip
        timing.sum_backward(lambda: compiled(q, k, v))()  # compile both graphs now
        timing.forward_only(lambda: compiled(q, k, v))()
        return (lambda: compiled(q, k, v)), (q, k, v)
    if method.startswith("hsa"):
        if method == "hsa-window":
            h = window_hierarchy(n, branching)
        else:
            h = random_window_hierarchy(n, branching, generator=gen)
        index = h.tree_index()
        q, k, v = leaf_qkv(n, HEADS, DIM)
        return lambda: hierarchical_attention(q, k, v, index), (q, k, v)
    if method == "flat-sdpa":
        q, k, v = leaf_qkv(1, HEADS, n, DIM)
        return lambda: F.scaled_dot_product_attention(q, k, v), (q, k, v)
    if method == "bound":
        blocks = [
            leaf_qkv(families, HEADS, width, DIM) for families, width in bound_shapes(n, branching)
        ]
        return (lambda: run_bound(blocks)), [t for blk in blocks for t in blk]
    raise ValueError(method)


def time_cases(cases: dict, reps: int) -> dict:
    """Median seconds of forward and of forward+backward (``out.sum().backward()``) of every
    case, interleaved: each repetition runs every method once, so all methods see the same
    machine load."""
    steps = {}
    for method, (fn, tensors) in cases.items():
        steps[method, "forward"] = (timing.forward_only(fn), ())
        steps[method, "forward+backward"] = (timing.sum_backward(fn), tensors)
    medians = timing.medians(timing.interleaved(steps, reps))  # after one warm-up each
    return {m: (medians[m, "forward"], medians[m, "forward+backward"]) for m in cases}


def peak_memory_mb(method: str, n: int) -> float:
    """Growth of max RSS during one forward+backward, in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-of",
            method,
            str(n),
            "--threads",
            str(torch.get_num_threads()),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _memory_child(method: str, n: int) -> None:
    fn, _ = make_case(method, n)
    step = timing.sum_backward(fn)
    step()  # warm-up (lazy initialisations), then the high-water mark of one more step
    print(peak_rss_mib(step))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only N = 1K and 4K")
    parser.add_argument("--sizes", type=int, nargs="*", help="leaf counts (default 1K..256K)")
    parser.add_argument("--max-flat", type=int, default=16384, help="largest N for flat SDPA")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (medians) up to 16K")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the compiled case (no inductor warm-up)")  # fmt: skip
    timing.add_out_option(parser, "hsa_scaling.json")
    timing.add_allocator_option(parser)
    parser.add_argument("--memory-of", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        _memory_child(args.memory_of[0], int(args.memory_of[1]))
        return
    args.out = timing.output_path(args.out, "hsa_scaling.json", args.quick)
    timing.apply_allocator(args.allocator)
    sizes = args.sizes or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536, 262144])
    rows, load = [], [os.getloadavg()[0]]
    for n in sizes:
        methods = [
            m
            for m in METHODS
            if (m != "flat-sdpa" or n <= args.max_flat)
            and (m != "hsa-window-compiled" or args.compile)
        ]
        cases, compile_s = {}, None
        for m in methods:
            start = time.perf_counter()
            cases[m] = make_case(m, n)
            if m == "hsa-window-compiled":
                compile_s = time.perf_counter() - start
        reps = args.reps if n <= 16384 else max(args.reps - 2, 1)
        medians = time_cases(cases, reps)
        del cases
        for method in methods:
            fwd, both = medians[method]
            mem = None
            if not args.no_memory and method not in NO_MEMORY_RUN:
                mem = peak_memory_mb(method, n)
            row = dict(n=n, method=method, forward_s=fwd, forward_backward_s=both, peak_mb=mem)
            if method == "hsa-window-compiled":
                row["compile_s"] = compile_s
            rows.append(row)
            print(
                f"N={n:>7} {method:<11} fwd {fwd * 1e3:9.1f} ms  fwd+bwd {both * 1e3:9.1f} ms"
                + (f"  peak {mem:8.1f} MB" if mem is not None else ""),
                flush=True,
            )
        load.append(os.getloadavg()[0])
        write_results(rows, sizes, load, args)


def write_results(rows, sizes, load, args) -> None:
    """Write the JSON and the plot for the sizes done so far (a long run keeps partial results)."""
    summary = summarize(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        heads=HEADS,
        dim=DIM,
        dtype="float32",
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        branching={n: branching_for(n) for n in sizes},
        reps=args.reps,
        allocator=args.allocator,
        cpu_count=os.cpu_count(),
        load_average_1min=load,
        command=" ".join(["python benchmarks/hsa_scaling.py", *_flags(sys.argv[1:])]),
    )
    args.out.write_text(json.dumps(dict(meta=meta, rows=rows, summary=summary), indent=2))
    plot(rows, args.out.with_suffix(".png"))
    print(json.dumps(summary, indent=1), flush=True)


def _flags(argv: list[str]) -> list[str]:
    """The command-line flags without ``--out`` and its path (a local path, not a setting)."""
    flags, skip = [], False
    for arg in argv:
        if not skip and not arg.startswith("--out"):
            flags.append(arg)
        skip = arg == "--out"
    return flags


def summarize(rows):
    by = {(r["n"], r["method"]): r for r in rows}
    out = {}
    for n in sorted({r["n"] for r in rows}):
        hsa = by[(n, "hsa-window")]["forward_backward_s"]
        bound = by[(n, "bound")]["forward_backward_s"]
        entry = dict(hsa_over_bound=hsa / bound)
        if (n, "hsa-window-heads-first") in by:
            heads_first = by[(n, "hsa-window-heads-first")]["forward_backward_s"]
            entry["hsa_heads_first_over_bound"] = heads_first / bound
        if (n, "hsa-window-compiled") in by:
            compiled = by[(n, "hsa-window-compiled")]["forward_backward_s"]
            entry["hsa_compiled_over_bound"] = compiled / bound
        if (n, "flat-sdpa") in by:
            entry["flat_over_hsa"] = by[(n, "flat-sdpa")]["forward_backward_s"] / hsa
        out[n] = entry
    return out


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in METHODS:
        pts = [r for r in rows if r["method"] == method]
        if not pts:
            continue
        ns = [r["n"] for r in pts]
        ax_t.loglog(ns, [r["forward_backward_s"] for r in pts], "o-", label=method)
        if all(r["peak_mb"] is not None for r in pts):
            ax_m.loglog(ns, [max(r["peak_mb"], 1e-1) for r in pts], "o-", label=method)
    ax_t.set(xlabel="leaves N", ylabel="forward+backward (s, median)", title="Time, 4 heads, d=64")
    ax_m.set(xlabel="leaves N", ylabel="peak extra RSS (MB)", title="Peak memory")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
