"""Masked attention: MaskedAttentionConv vs dense masked SDPA vs PyG TransformerConv.

Run from the repository root::

    python benchmarks/masked_attention.py   # N = 1K..64K, about 30 min on a busy 2-core box
    python benchmarks/masked_attention.py --quick --out <folder>   # N = 1K, 2K, ~2 min

Writes ``masked_attention.json`` and ``masked_attention.png`` into ``--out`` (a folder;
default ``benchmarks/results``). A ``--quick`` run writes into ``benchmarks/results`` only
when ``--out`` names it, else into a fresh temporary folder, printed, so that it never
overwrites the full results that ``benchmarks/README.md`` reports by default.

Setting: ``in_channels = 64``, ``heads = 4``, ``out_channels = 64``
per head, float32, forward + ``out.sum().backward()`` of one layer on ``x``
``[N, 64]``, one torch thread by default (``--threads``). Masks: a
bidirectional sliding window ``|i - j| <= 64`` and a uniformly random mask with
the same edge count (self-loops included), plus Cora's graph (2,708 nodes,
self-loops added, random 64-d features; loaded with
``hiergraph.datasets.planetoid.load_planetoid`` from ``$HIERGRAPH_RAW/Cora/raw``) when
``$HIERGRAPH_RAW`` names a folder holding them.

Methods, all given the same ``x`` and ``edge_index`` and the same weights:

* ``ours`` - :class:`hiergraph.nn.masked_attention_conv.MaskedAttentionConv`; it
  recognises the window from ``edge_index`` (cost included) and runs the banded
  kernel; the random mask and Cora take its general (sparse-kernel) edge path.
* ``transformer_conv`` - :class:`torch_geometric.nn.TransformerConv`.
* ``dense_sdpa`` - the same projections, a dense ``[N, N]`` boolean mask built
  from ``edge_index`` (cost included) and
  :func:`torch.nn.functional.scaled_dot_product_attention`.

Protocol, per (mask, N):

1. **memory**: every method runs once in a fresh subprocess; its peak resident
   memory is Linux ``VmHWM`` (reset through ``/proc/self/clear_refs``) minus the
   resident size just before the run, its output is kept for the accuracy
   check and its time is the first sample;
2. **time**: one subprocess builds all methods and runs them **interleaved**
   (round robin, after one warm-up each) for ``--reps`` more samples; a method
   whose first run took over ``--slow-s`` seconds (``transformer_conv`` and
   ``dense_sdpa`` at N = 16K on a loaded machine) keeps that run as its only
   sample. The reported time is the median of a method's samples.

The JSON is rewritten after every (mask, N), so an interrupted run keeps what
it measured.

Runs that would not fit in memory (estimated from edge counts) are skipped and
marked so. The machine is shared: compare the ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timing
import torch
from memory import reset_peak, status_kib
from torch import Tensor

IN_CHANNELS, OUT_CHANNELS, HEADS, WINDOW = 64, 64, 4, 64
METHODS = ("ours", "transformer_conv", "dense_sdpa")
RAW_ROOT = Path(os.environ["HIERGRAPH_RAW"]) if os.environ.get("HIERGRAPH_RAW") else None


# ------------------------------------------------------------------ worker side
def build_mask(kind: str, n: int) -> tuple[Tensor, int]:
    """``(edge_index, num_nodes)`` of a benchmark mask."""
    from hiergraph.masks import graph_mask, random_mask, window_mask

    if kind == "window":
        return window_mask(n, WINDOW), n
    if kind == "random":
        return random_mask(n, window_mask(n, WINDOW).size(1), seed=0), n
    if kind == "cora":
        from hiergraph.datasets.planetoid import load_planetoid

        with tempfile.TemporaryDirectory() as root:
            data = load_planetoid("Cora", root=root, raw_dir=RAW_ROOT / "Cora" / "raw")[0]
        return graph_mask(data.edge_index, data.num_nodes), data.num_nodes
    raise ValueError(f"unknown mask {kind!r}")


def make_step(method: str, x: Tensor, edge_index: Tensor):
    """A closure running forward + backward and returning the detached output."""
    import torch.nn.functional as F
    from torch_geometric.nn import TransformerConv

    from hiergraph.masks import edge_index_to_mask
    from hiergraph.nn.masked_attention_conv import MaskedAttentionConv

    torch.manual_seed(0)
    ours = MaskedAttentionConv(IN_CHANNELS, OUT_CHANNELS, heads=HEADS, root_weight=False)
    if method == "ours":
        forward = lambda: ours(x, edge_index)  # noqa: E731
    elif method == "transformer_conv":
        conv = TransformerConv(IN_CHANNELS, OUT_CHANNELS, heads=HEADS, root_weight=False)
        conv.load_state_dict(ours.state_dict(), strict=False)
        forward = lambda: conv(x, edge_index)  # noqa: E731
    else:

        def forward():
            n = x.size(0)
            mask = edge_index_to_mask(edge_index, n, rows="query")
            q, k, v = (  # [1, H, N, C]: 4-D inputs let SDPA use its fused CPU kernel
                lin(x).view(1, n, HEADS, OUT_CHANNELS).transpose(1, 2)
                for lin in (ours.lin_query, ours.lin_key, ours.lin_value)
            )
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return out.transpose(1, 2).reshape(n, HEADS * OUT_CHANNELS)

    def step():
        x.grad = None
        out = forward()
        out.sum().backward()
        return out.detach()

    return step


def _setup(kind: str, n: int) -> tuple[Tensor, Tensor]:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    # on a shared machine, let the out-of-memory killer pick this worker first
    Path("/proc/self/oom_score_adj").write_text("1000")
    edge_index, n = build_mask(kind, n)
    x = torch.randn(n, IN_CHANNELS, generator=torch.Generator().manual_seed(1), requires_grad=True)
    return x, edge_index


def worker_memory(kind: str, n: int, method: str, out_path: str) -> None:
    """One run in a fresh process: peak memory, time, output."""
    x, edge_index = _setup(kind, n)
    step = make_step(method, x, edge_index)
    before = status_kib("VmRSS") / 1024
    reset_peak()
    start = time.perf_counter()
    out = step()
    elapsed = time.perf_counter() - start
    peak = status_kib("VmHWM") / 1024 - before
    torch.save(out, out_path)
    print(json.dumps({"first_s": elapsed, "peak_mib": peak, "num_nodes": x.size(0),
                      "num_edges": edge_index.size(1)}))  # fmt: skip


def worker_time(kind: str, n: int, reps: dict[str, int]) -> None:
    """All methods in one process, run round robin; ``reps[method]`` samples each.

    A method's first run in this process is a warm-up (not a sample) unless it
    takes over 20 s, where one-time costs are negligible.
    """
    x, edge_index = _setup(kind, n)
    reps = {method: count for method, count in reps.items() if count > 0}
    steps = {method: make_step(method, x, edge_index) for method in reps}
    samples = {method: [] for method in reps}
    warm = set()
    while any(len(samples[m]) < reps[m] for m in reps):
        for method, step in steps.items():
            if len(samples[method]) >= reps[method]:
                continue
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            if method in warm or elapsed > 20.0:
                samples[method].append(elapsed)
            warm.add(method)
    print(json.dumps(samples))


# ------------------------------------------------------------------ driver side
def available_mib() -> float:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"MemAvailable:\s+(\d+)", text).group(1)) / 1024


def estimated_mib(kind: str, method: str, n: int) -> float:
    """Rough peak memory of a run, from this script's measurements at N = 4K."""
    num_edges = 13_264 if kind == "cora" else (2 * WINDOW + 1) * n - WINDOW * (WINDOW + 1)
    if method == "dense_sdpa":
        return n * n * 5.5 / 2**20  # bool mask + float mask + workspace
    if method == "transformer_conv":  # per-edge [E, H, C] tensors
        return num_edges * HEADS * OUT_CHANNELS * 4 * 6.2 / 2**20
    if kind != "window":  # per-edge [E, H] tensors and the edge index copies
        return num_edges * (HEADS * 4 * 10 + 8 * 6) / 2**20
    return num_edges * HEADS * OUT_CHANNELS * 4 * 0.5 / 2**20  # banded kernel


def _run(args: list[str], threads: int) -> tuple[dict | None, str]:
    cmd = [sys.executable, __file__, "--worker", *args]
    env = os.environ | {"BENCH_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return None, f"failed: {proc.stderr.strip().splitlines()[-1:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def run_case(kind: str, n: int, tmp: str, args: argparse.Namespace) -> dict:
    """Memory runs, then the interleaved timing run, of one (mask, N)."""
    methods = [m for m in args.methods if kind != "cora" or m != "dense_sdpa"]
    limit = min(args.max_gib * 1024, args.mem_fraction * available_mib())
    results, reps = {}, {}
    for method in methods:
        need = estimated_mib(kind, method, n)
        if need > limit:
            results[method] = {"skipped": f"needs ~{need / 1024:.1f} GiB, limit {limit / 1024:.1f}"}
            continue
        out_path = str(Path(tmp) / f"{kind}_{n}_{method}.pt")
        result, error = _run(["memory", kind, str(n), method, out_path], args.threads)
        results[method] = result | {"output": out_path} if result else {"skipped": error}
        if result:  # a run over --slow-s: its fresh-process run is its only sample
            reps[method] = args.reps if result["first_s"] <= args.slow_s else 0
    timed, error = ({}, "")
    if any(reps.values()):
        timed, error = _run(["time", kind, str(n), json.dumps(reps)], args.threads)
    for method in reps:
        result = results[method]
        if timed is None:
            result["skipped"] = error
            continue
        result["samples_s"] = [result["first_s"], *timed.get(method, [])]
        result["median_s"] = statistics.median(result["samples_s"])
    return results


def max_diff(a: dict, b: dict) -> float | None:
    if "output" not in a or "output" not in b:
        return None
    return float((torch.load(a["output"]) - torch.load(b["output"])).abs().max())


def summarise(case: dict) -> dict:
    """Side-by-side ratios of one (mask, N) case."""
    ours, tc, dense = (case["methods"].get(m, {}) for m in METHODS)
    ratios = {}
    for name, other in (("transformer_conv", tc), ("dense_sdpa", dense)):
        if "median_s" in ours and "median_s" in other:
            ratios[f"{name}_time_over_ours"] = other["median_s"] / ours["median_s"]
            ratios[f"{name}_peak_over_ours"] = other["peak_mib"] / max(ours["peak_mib"], 1.0)
        ratios[f"max_abs_diff_ours_vs_{name}"] = max_diff(ours, other)
    for result in case["methods"].values():
        result.pop("output", None)
    return ratios


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, style in (("window", "-"), ("random", "--")):
        for method, color in zip(METHODS, ("C0", "C1", "C2"), strict=True):
            pts = [
                (c["num_nodes"], c["methods"][method])
                for c in report["cases"]
                if c["mask"] == kind and "median_s" in c["methods"].get(method, {})
            ]
            if not pts:
                continue
            ns = [p[0] for p in pts]
            label = f"{method} ({kind})"
            axes[0].plot(ns, [p[1]["median_s"] for p in pts], style, color=color, marker="o",
                         label=label)  # fmt: skip
            axes[1].plot(ns, [max(p[1]["peak_mib"], 1.0) for p in pts], style, color=color,
                         marker="o", label=label)  # fmt: skip
    for ax, title in zip(axes, ("forward + backward time [s]", "peak memory [MiB]"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (tokens)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"masked attention, {HEADS} heads x {OUT_CHANNELS} channels, window p={WINDOW} "
        "(random: same edge count); medians, interleaved"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1K, 2K only, 3 repetitions")
    parser.add_argument("--sizes", type=int, nargs="*", help="override the sequence lengths")
    parser.add_argument("--reps", type=int, default=3, help="interleaved samples per method")
    parser.add_argument(
        "--slow-s", type=float, default=60.0, help="no more samples of a run slower than this"
    )
    parser.add_argument("--max-gib", type=float, default=15.0, help="skip runs estimated above")
    parser.add_argument(
        "--mem-fraction", type=float, default=0.65, help="... or above this share of free memory"
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--masks", nargs="+", default=["window", "random", "cora"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per run (the 2 cores are shared)")  # fmt: skip
    timing.add_out_option(parser, "", "output folder")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        role, kind, n, *rest = args.worker
        if role == "memory":
            worker_memory(kind, int(n), rest[0], rest[1])
        else:
            worker_time(kind, int(n), json.loads(rest[0]))
        return

    args.out = timing.output_path(args.out, "", args.quick)
    sizes = args.sizes or ([1024, 2048] if args.quick else [1024, 4096, 16384, 65536])
    args.reps = 3 if args.quick else args.reps
    cases = [(kind, n) for kind in ("window", "random") if kind in args.masks for n in sizes]
    if "cora" in args.masks and RAW_ROOT is not None and (RAW_ROOT / "Cora" / "raw").is_dir():
        cases.append(("cora", 2708))
    command = timing.command_line("masked_attention.py", sys.argv[1:])
    if ("cora", 2708) in cases:  # (the raw files' folder is no setting)
        command = f"HIERGRAPH_RAW=<raw> {command}"
    report = {
        "command": command,
        "setting": {
            "in_channels": IN_CHANNELS,
            "out_channels_per_head": OUT_CHANNELS,
            "heads": HEADS,
            "window_p": WINDOW,
            "threads": args.threads,
            "reps": args.reps,
            "single_sample_above_s": args.slow_s,
            "pass": "forward + out.sum().backward()",
            "dtype": "float32",
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
        },
        "cases": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n in cases:
            case = {"mask": kind, "num_nodes": n, "methods": run_case(kind, n, tmp, args)}
            for method, result in case["methods"].items():
                shown = (
                    f"{result['median_s']:.3f} s, {result['peak_mib']:.0f} MiB"
                    if "median_s" in result
                    else result["skipped"]
                )
                print(f"{kind:>6} N={n:>6} {method:>16}: {shown}", flush=True)
            case["num_edges"] = next(
                (r["num_edges"] for r in case["methods"].values() if "num_edges" in r), None
            )
            case["ratios"] = summarise(case)
            print(f"{'':>6} {'':>8} {json.dumps(case['ratios'])}", flush=True)
            report["cases"].append(case)
            report["setting"]["load_average_at_end"] = os.getloadavg()
            report["wall_s"] = time.time() - started
            args.out.mkdir(parents=True, exist_ok=True)  # after every case: partial runs count
            (args.out / "masked_attention.json").write_text(json.dumps(report, indent=2))
            plot(report, args.out / "masked_attention.png")
    print(f"wrote {args.out}/masked_attention.json and .png in {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
