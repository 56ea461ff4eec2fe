"""Hybrid GCN + HSA layer vs PyG's GPSConv (full / Performer attention) on large graphs.

    python benchmarks/graph_hsa.py                      # N = 10K, 100K; 1 thread
    python benchmarks/graph_hsa.py --sizes 10000 100000 1000000

Graphs are **synthetic** planted-partition (stochastic-block-model-like)
graphs: blocks of ``--block`` consecutive nodes, every node draws ``--deg-in``
neighbours in its block and ``--deg-out`` anywhere (expected degrees fixed, so
that 1M nodes are cheap to sample). The community tree is a window hierarchy
over the node order with branching (16, 8, 8, …), so its lowest two levels
are the planted blocks (16 · 8 = 128 nodes); building it with
:class:`~hiergraph.transforms.GraphHierarchy` (networkx Louvain) would take
far longer than the layer itself at these sizes and is not what is timed.

Every (method, N) runs in a fresh subprocess: one warm-up, then the median of
``--reps`` forward+backward passes of one layer (64 channels, 2 heads, GCN
local conv), and the growth of the resident set's high-water mark over the
resident set before the warm-up (Linux ``ru_maxrss``). Methods run one after
the other for each N (hybrid, GPS full, GPS Performer, hybrid again), so the
hybrid's two runs bracket the others; the ratio uses their median. Full
attention (PyTorch's CPU SDPA kernel, which does not materialise the
``N × N`` scores, so memory is not what limits it) is run up to
``--max-full`` nodes; above, its time is extrapolated as ``O(N²)`` from the
largest size run, and marked as such. Writes ``benchmarks/results/graph_hsa.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("hsa_hybrid", "gps_full", "gps_performer")


def planted_partition(n: int, block: int, deg_in: int, deg_out: int, seed: int = 0) -> torch.Tensor:
    """``[2, E]`` undirected edges of a planted-partition graph (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.arange(n).repeat_interleave(deg_in + deg_out)
    start = (src // block) * block
    size = torch.clamp(n - start, max=block)
    inside = start + (torch.rand(src.numel(), generator=gen) * size).long()
    anywhere = torch.randint(0, n, (src.numel(),), generator=gen)
    is_in = (torch.arange(src.numel()) % (deg_in + deg_out)) < deg_in
    dst = torch.where(is_in, inside, anywhere)
    return torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)


def worker(method: str, n: int, args) -> dict:
    from torch_geometric.nn import GCNConv, GPSConv

    from hiergraph.data import window_hierarchy
    from hiergraph.nn.graph_hsa import GraphHSAConv

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = args.channels
    edge_index = planted_partition(n, args.block, args.deg_in, args.deg_out)
    x = torch.randn(n, c, requires_grad=True)
    if method == "hsa_hybrid":
        levels, size = [16], -(-n // 16)
        while size > 16:
            levels.append(8)
            size = -(-size // 8)
        tree = window_hierarchy(n, levels)
        layer = GraphHSAConv(c, GCNConv(c, c), heads=args.heads, norm="layer_norm")

        def step():
            return layer(x, edge_index, tree)
    else:
        attn = "multihead" if method == "gps_full" else "performer"
        layer = GPSConv(c, GCNConv(c, c), heads=args.heads, attn_type=attn, norm="layer_norm")

        def step():
            return layer(x, edge_index)

    before = _rss_kib()
    times = []
    for i in range(args.reps + 1):
        t0 = time.perf_counter()
        step().square().mean().backward()
        if i:  # the first run is the warm-up
            times.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
        x.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"sec": statistics.median(times), "times": times, "peak_mib": (peak - before) / 1024}


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--deg-in", type=int, default=4)
    p.add_argument("--deg-out", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-full", type=int, default=20_000)
    p.add_argument("--out", default=str(RESULTS / "graph_hsa.json"))
    p.add_argument("--worker", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return

    passthrough = [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in ("channels", "heads", "block", "deg_in", "deg_out", "reps", "threads")
    ]
    rows = []
    for n in args.sizes:
        order = [m for m in args.methods if m != "hsa_hybrid"]
        if "hsa_hybrid" in args.methods:
            order = ["hsa_hybrid", *order, "hsa_hybrid"]
        found: dict[str, list[dict]] = {}
        load = [os.getloadavg()[0]]
        for method in order:
            if method == "gps_full" and n > args.max_full:
                ran = [
                    (r["n"], r["methods"]["gps_full"][0])
                    for r in rows
                    if "gps_full" in r["methods"]
                ]
                ran = [(m, r["sec"]) for m, r in ran if "sec" in r]
                skip = {"skipped": f"not run above --max-full={args.max_full} (O(N^2) time)"}
                if ran:
                    skip["extrapolated_sec"] = ran[-1][1] * (n / ran[-1][0]) ** 2
                found.setdefault(method, []).append(skip)
                continue
            cmd = [sys.executable, __file__, "--worker", method, str(n), *passthrough]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                tail = run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
                found.setdefault(method, []).append({"failed": tail[0]})
            else:
                found.setdefault(method, []).append(json.loads(run.stdout.splitlines()[-1]))
            print(n, method, found[method][-1], flush=True)
        load.append(os.getloadavg()[0])
        row = {"n": n, "load_avg_1min": load, "methods": found}
        hybrid = [r["sec"] for r in found.get("hsa_hybrid", []) if "sec" in r]
        for other in ("gps_full", "gps_performer"):
            secs = [r["sec"] for r in found.get(other, []) if "sec" in r]
            if hybrid and secs:
                row[f"speedup_vs_{other}"] = secs[0] / statistics.median(hybrid)
        rows.append(row)
        out = {
            "what": "one layer, forward+backward, CPU float32, synthetic planted-partition graphs",
            "command": "python " + " ".join(sys.argv),
            "threads": args.threads,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
