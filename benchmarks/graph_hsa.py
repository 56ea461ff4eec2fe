"""Hybrid GCN + HSA layer vs PyG's GPSConv (full / Performer attention) on large graphs.

    python benchmarks/graph_hsa.py                      # N = 10K, 100K; 1 thread
    python benchmarks/graph_hsa.py --sizes 10000 100000 1000000 --max-full 10000

Graphs are **synthetic** planted-partition (stochastic-block-model-like)
graphs: blocks of ``--block`` consecutive nodes, every node draws ``--deg-in``
neighbours in its block and ``--deg-out`` anywhere (expected degrees fixed, so
that 1M nodes are cheap to sample). The community tree is built from the
graph alone by :class:`~hiergraph.transforms.GraphHierarchy` with
``method='lp'`` (size-capped label propagation, ``max_family=64``, no
position features); its build time, family statistics and the share of
leaf families that lie inside one planted block are recorded, but the build
is not part of the timed forward+backward (it is done once per graph, like
any preprocessing; networkx Louvain is far too slow at these sizes). The
second hybrid run of each N reuses the tree of the first (``--tree-dir``).

Every (method, N) runs in a fresh subprocess: ``--warmup`` untimed passes
(default 1), then the median of ``--reps`` forward+backward passes of one
layer (64 channels, 2 heads, GCN local conv on a sparse CSR adjacency, the
same for all methods), and the
growth of the resident set's high-water mark over the resident set before
the warm-up (Linux ``ru_maxrss``; ``process_peak_mib`` is the whole
process's high-water mark, graph and tree included). Methods run one after
the other for each N (hybrid, GPS full, GPS Performer, hybrid again), so the
hybrid's two runs bracket the others; the ratio uses their median. With
``--methods hsa_hybrid`` alone the hybrid runs once.

Full attention: ``GPSConv(attn_type='multihead')`` calls
``nn.MultiheadAttention(..., need_weights=False)``, which runs PyTorch's
``scaled_dot_product_attention``; on CPU that is a flash-style kernel that never
holds the ``N × N`` scores (its backward recomputes them block by block), so
its memory grows as ``O(N)``. Each row records what the scores *would* take if
materialised (``full_scores_gib_per_head``: ``4 N²`` bytes per head in
float32, e.g. 37.3 GiB per head at N = 100K), next to the measured peak. Full
attention is run up to ``--max-full`` nodes; above, its time is extrapolated
as ``O(N²)`` from the largest size run, and marked as such. Writes
``benchmarks/results/graph_hsa.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from memory import status_kib

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
    from torch_geometric.data import Data
    from torch_geometric.nn import GCNConv, GPSConv
    from torch_geometric.utils import to_torch_csr_tensor

    from hiergraph.datasets.processed import SAFE_CLASSES, load_weights_only
    from hiergraph.nn.graph_hsa import GraphHSAConv
    from hiergraph.transforms import GraphHierarchy, HierarchicalGraph, hierarchy_stats

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = args.channels
    edge_index = planted_partition(n, args.block, args.deg_in, args.deg_out)
    # GCNConv on a sparse CSR adjacency: one SpMM, no [E, C] message tensors
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(n, n))
    x = torch.randn(n, c, requires_grad=True)
    info = {}
    if method == "hsa_hybrid":
        cache = Path(args.tree_dir) / f"tree_{n}.pt"
        if cache.exists():
            allow = [*SAFE_CLASSES, HierarchicalGraph]  # tensors and these alone: no code
            data = load_weights_only(cache, "a tree of this benchmark", "it", allow=allow)
        else:
            t0 = time.perf_counter()
            graph = Data(edge_index=edge_index, num_nodes=n)
            data = GraphHierarchy("lp", max_family=64, pe_dim=0, seed=0)(graph)
            info["tree_build_sec"] = time.perf_counter() - t0
            info["tree_stats"] = hierarchy_stats(data)
            info["leaf_families_in_one_block"] = _purity(data.tree_parent[:n], args.block)
            torch.save(data, cache)
        tree = data.hierarchy()
        tree.tree_index()  # structure indices are built once per graph, not per step
        layer = GraphHSAConv(c, GCNConv(c, c), heads=args.heads, norm="layer_norm")

        def step():
            return layer(x, adj_t, tree)
    else:
        attn = "multihead" if method == "gps_full" else "performer"
        layer = GPSConv(c, GCNConv(c, c), heads=args.heads, attn_type=attn, norm="layer_norm")

        def step():
            return layer(x, adj_t)

    before = status_kib("VmRSS")
    times = []
    for i in range(args.warmup + args.reps):
        t0 = time.perf_counter()
        step().square().mean().backward()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
        x.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "sec": statistics.median(times),
        "times": times,
        "peak_mib": (peak - before) / 1024,
        "process_peak_mib": peak / 1024,
        **info,
    }


def _purity(leaf_parent: torch.Tensor, block: int) -> float:
    """Share of the leaves' parents whose leaf children all lie in one planted block."""
    blocks = torch.arange(leaf_parent.numel()) // block
    size = int(leaf_parent.max()) + 1
    low, high = (
        torch.full((size,), -1).scatter_reduce(0, leaf_parent, blocks, op, include_self=False)
        for op in ("amin", "amax")
    )
    parents = leaf_parent.unique()
    return float((low[parents] == high[parents]).float().mean())


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
    p.add_argument("--warmup", type=int, default=1, help="untimed passes before the timed ones")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-full", type=int, default=20_000)
    p.add_argument("--max-performer", type=int, default=1_000_000)
    p.add_argument("--out", default=str(RESULTS / "graph_hsa.json"))
    p.add_argument("--tree-dir", default=None, help="tree cache (default: a temporary folder)")
    p.add_argument("--worker", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return

    tmp = tempfile.TemporaryDirectory()
    args.tree_dir = args.tree_dir or tmp.name
    passthrough = [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in (
            "channels",
            "heads",
            "block",
            "deg_in",
            "deg_out",
            "reps",
            "warmup",
            "threads",
            "tree_dir",
        )
    ]
    rows = []
    for n in args.sizes:
        order = [m for m in args.methods if m != "hsa_hybrid"]
        if "hsa_hybrid" in args.methods:  # twice only to bracket other methods
            order = ["hsa_hybrid", *order, "hsa_hybrid"] if order else ["hsa_hybrid"]
        found: dict[str, list[dict]] = {}
        load = [os.getloadavg()[0]]
        for method in order:
            if method == "gps_performer" and n > args.max_performer:
                skip = f"not run above --max-performer={args.max_performer} (time)"
                found.setdefault(method, []).append({"skipped": skip})
                continue
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
        row = {
            "n": n,
            "load_avg_1min": load,
            "full_scores_gib_per_head": 4 * n * n / 2**30,
            "methods": found,
        }
        hybrid = [r["sec"] for r in found.get("hsa_hybrid", []) if "sec" in r]
        for other in ("gps_full", "gps_performer"):
            secs = [r["sec"] for r in found.get(other, []) if "sec" in r]
            if hybrid and secs:
                row[f"speedup_vs_{other}"] = secs[0] / statistics.median(hybrid)
            guess = [r["extrapolated_sec"] for r in found.get(other, []) if "extrapolated_sec" in r]
            if hybrid and guess:
                row[f"speedup_vs_{other}_EXTRAPOLATED"] = guess[0] / statistics.median(hybrid)
        rows.append(row)
        out = {
            "what": "one layer, forward+backward, CPU float32, synthetic planted-partition graphs; "
            "hybrid tree: GraphHierarchy('lp', max_family=64) (build not timed in 'sec')",
            "command": "python " + " ".join(sys.argv),
            "threads": args.threads,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(out, indent=1))
        plot(rows, Path(args.out).with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    """Time and memory against N, log-log; extrapolated times are hollow markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        measured, guessed, memory = [], [], []
        for row in rows:
            runs = row["methods"].get(method, [])
            secs = [r["sec"] for r in runs if "sec" in r]
            if secs:
                measured.append((row["n"], statistics.median(secs)))
                memory.append((row["n"], max(r["peak_mib"] for r in runs if "sec" in r)))
            guessed += [(row["n"], r["extrapolated_sec"]) for r in runs if "extrapolated_sec" in r]
        if measured:
            line = ax_t.plot(*zip(*measured, strict=True), "o-", label=method)[0]
            ax_m.plot(*zip(*memory, strict=True), "o-", label=method, color=line.get_color())
            if guessed:
                xs, ys = zip(*([measured[-1], *guessed]), strict=True)
                ax_t.plot(
                    xs,
                    ys,
                    "o--",
                    mfc="none",
                    color=line.get_color(),
                    label=f"{method} (EXTRAPOLATED, O(N²))",
                )
    for ax, label in ((ax_t, "seconds per forward+backward"), (ax_m, "peak memory growth (MiB)")):
        ax.set(xscale="log", yscale="log", xlabel="nodes N", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle("one hybrid layer vs GPSConv, synthetic planted-partition graphs, CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
