"""Masked attention: MaskedAttentionConv vs dense masked SDPA vs PyG TransformerConv.

Run from the repository root::

    python benchmarks/masked_attention.py            # full run (N = 1K..64K), ~5 min on 2 cores
    python benchmarks/masked_attention.py --quick --out /tmp/bench   # N = 1K, 2K, ~1 min

Writes ``masked_attention.json`` and ``masked_attention.png`` into ``--out``
(default ``benchmarks/results``; a ``--quick`` run there overwrites the full
results that the README quotes).

Setting (issue #4): ``in_channels = 64``, ``heads = 4``, ``out_channels = 64``
per head, float32, forward + ``out.sum().backward()`` of one layer on ``x``
``[N, 64]``, one torch thread by default (``--threads``). Masks: a
bidirectional sliding window ``|i - j| <= 64`` and a uniformly random mask with
the same edge count (self-loops included), plus Cora's graph (2,708 nodes,
self-loops added, random 64-d features) when its raw files are found.

Methods, all given the same ``x`` and ``edge_index`` and the same weights:

* ``ours`` - :class:`hiergraph.nn.MaskedAttentionConv`; it recognises the window
  from ``edge_index`` (cost included) and runs the banded kernel; the random
  mask and Cora take its general edge path.
* ``transformer_conv`` - :class:`torch_geometric.nn.TransformerConv`.
* ``dense_sdpa`` - the same projections, a dense ``[N, N]`` boolean mask built
  from ``edge_index`` (cost included) and
  :func:`torch.nn.functional.scaled_dot_product_attention`.

Each (mask, N, method) runs in a fresh subprocess: one untimed-for-median
warm-up run that also measures the peak resident memory above the level just
before it (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``),
then timed runs until a time budget; the median is reported. Runs that would not
fit in memory (estimated from edge counts) are skipped and marked so. Because
the machine is shared, compare the ratios, which are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor

IN_CHANNELS, OUT_CHANNELS, HEADS, WINDOW = 64, 64, 4, 64
METHODS = ("ours", "transformer_conv", "dense_sdpa")
RESULTS = Path(__file__).resolve().parent / "results"
CORA_RAW = Path(os.environ.get("HIERGRAPH_DATA", "../shared/datasets")) / "Cora" / "raw"


# ------------------------------------------------------------------ worker side
def _status_mib(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) / 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def build_mask(kind: str, n: int) -> tuple[Tensor, int]:
    """``(edge_index, num_nodes)`` of a benchmark mask."""
    from hiergraph.masks import graph_mask, random_mask, window_mask

    if kind == "window":
        return window_mask(n, WINDOW), n
    if kind == "random":
        return random_mask(n, window_mask(n, WINDOW).size(1), seed=0), n
    if kind == "cora":
        from torch_geometric.datasets import Planetoid

        with tempfile.TemporaryDirectory() as root:
            shutil.copytree(CORA_RAW, Path(root) / "Cora" / "raw")
            data = Planetoid(root, "Cora")[0]
        return graph_mask(data.edge_index, data.num_nodes), data.num_nodes
    raise ValueError(f"unknown mask {kind!r}")


def make_step(method: str, x, edge_index):
    """A closure running forward + backward, and the forward output function."""
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
        out = forward()
        out.sum().backward()
        return out.detach()

    return step


def worker(kind: str, n: int, method: str, budget: float, out_path: str) -> None:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    edge_index, n = build_mask(kind, n)
    x = torch.randn(n, IN_CHANNELS, generator=torch.Generator().manual_seed(1), requires_grad=True)
    step = make_step(method, x, edge_index)
    before = _status_mib("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    out = step()
    first = time.perf_counter() - start
    peak = _status_mib("VmHWM") - before
    torch.save(out, out_path)
    samples = [first] if first > 2.0 else []  # long runs: warm-up overhead is negligible
    while not samples or (sum(samples) < budget and len(samples) < 5):
        x.grad = None
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    print(json.dumps({"samples_s": samples, "peak_mib": peak, "num_nodes": n,
                      "num_edges": edge_index.size(1)}))  # fmt: skip


# ------------------------------------------------------------------ driver side
def available_mib() -> float:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"MemAvailable:\s+(\d+)", text).group(1)) / 1024


def estimated_mib(kind: str, method: str, n: int) -> float:
    """Rough peak memory of a run, from this script's measurements at N = 4K."""
    num_edges = 13_264 if kind == "cora" else (2 * WINDOW + 1) * n - WINDOW * (WINDOW + 1)
    if method == "dense_sdpa":
        return n * n * 5.5 / 2**20  # bool mask + float mask + workspace
    if method == "transformer_conv" or kind != "window":  # per-edge [E, H, C] tensors
        return num_edges * HEADS * OUT_CHANNELS * 4 * 6.2 / 2**20
    return num_edges * HEADS * OUT_CHANNELS * 4 * 0.5 / 2**20  # banded kernel


def run_case(
    kind: str, n: int, method: str, budget: float, tmp: str, max_mib: float, threads: int
) -> dict:
    need = estimated_mib(kind, method, n)
    limit = min(max_mib, 0.65 * available_mib())
    if need > limit:
        return {"skipped": f"needs ~{need / 1024:.1f} GiB, limit {limit / 1024:.1f} GiB"}
    out_path = str(Path(tmp) / f"{kind}_{n}_{method}.pt")
    cmd = [sys.executable, __file__, "--worker", kind, str(n), method, str(budget), out_path]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=os.environ | {"BENCH_THREADS": str(threads)}
    )
    if proc.returncode != 0:
        return {"skipped": f"failed: {proc.stderr.strip().splitlines()[-1:]}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["median_s"] = statistics.median(result["samples_s"])
    result["output"] = out_path
    return result


def max_diff(a: dict, b: dict) -> float | None:
    if "output" not in a or "output" not in b:
        return None
    return float((torch.load(a["output"]) - torch.load(b["output"])).abs().max())


def summarise(case: dict) -> dict:
    """Side-by-side ratios of one (mask, N) case."""
    ours, tc, dense = (case["methods"].get(m, {}) for m in METHODS)
    ratios = {}
    if "median_s" in ours and "median_s" in tc:
        ratios["transformer_conv_time_over_ours"] = tc["median_s"] / ours["median_s"]
    if "median_s" in ours and "median_s" in dense:
        ratios["dense_sdpa_time_over_ours"] = dense["median_s"] / ours["median_s"]
        ratios["dense_sdpa_peak_over_ours"] = dense["peak_mib"] / max(ours["peak_mib"], 1.0)
    if "median_s" in ours and "median_s" in tc:
        ratios["transformer_conv_peak_over_ours"] = tc["peak_mib"] / max(ours["peak_mib"], 1.0)
    ratios["max_abs_diff_ours_vs_transformer_conv"] = max_diff(ours, tc)
    ratios["max_abs_diff_ours_vs_dense_sdpa"] = max_diff(ours, dense)
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
    fig.suptitle(f"masked attention, d={OUT_CHANNELS}/head, {HEADS} heads, window p={WINDOW}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1K, 2K only, short budgets")
    parser.add_argument("--sizes", type=int, nargs="*", help="override the sequence lengths")
    parser.add_argument("--max-gib", type=float, default=14.0, help="skip runs estimated above")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per run (2-thread runs stall on a busy CPU)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, n, method, budget, out_path = args.worker
        worker(kind, int(n), method, float(budget), out_path)
        return

    sizes = args.sizes or ([1024, 2048] if args.quick else [1024, 4096, 16384, 65536])
    budget = 1.0 if args.quick else 8.0
    cases = [(kind, n) for kind in ("window", "random") for n in sizes]
    if CORA_RAW.is_dir():
        cases.append(("cora", 2708))
    report = {
        "command": "python " + " ".join(sys.argv),
        "setting": {
            "in_channels": IN_CHANNELS,
            "out_channels_per_head": OUT_CHANNELS,
            "heads": HEADS,
            "window_p": WINDOW,
            "threads": args.threads,
            "pass": "forward + out.sum().backward()",
            "dtype": "float32",
            "torch": torch.__version__,
        },  # fmt: skip
        "cases": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n in cases:
            methods = METHODS if kind != "cora" else ("ours", "transformer_conv")
            case = {"mask": kind, "num_nodes": n, "methods": {}}
            for method in methods:
                result = run_case(kind, n, method, budget, tmp, args.max_gib * 1024, args.threads)
                case["methods"][method] = result
                shown = f"{result['median_s']:.3f} s, {result['peak_mib']:.0f} MiB" \
                    if "median_s" in result else result["skipped"]  # fmt: skip
                print(f"{kind:>6} N={n:>6} {method:>16}: {shown}", flush=True)
            case["num_edges"] = next(
                (r["num_edges"] for r in case["methods"].values() if "num_edges" in r), None
            )
            case["ratios"] = summarise(case)
            print(f"{'':>6} {'':>8} {json.dumps(case['ratios'])}", flush=True)
            report["cases"].append(case)
    report["wall_s"] = time.time() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "masked_attention.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "masked_attention.png")
    print(f"wrote {args.out}/masked_attention.json and .png in {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
