"""ConeConv vs PyG's GATConv: forward+backward time per Cora training epoch, side by side.

Two measurements, each a median over ``--reps`` repetitions, with all variants
interleaved in every repetition so that machine noise hits them alike:

- ``epoch``: one full-batch training step of the Cora model of
  ``examples/cora_cone_gat.py`` exactly as it trains (sparse CSR input features,
  1433 -> 8 heads x 8 -> 7; dropout 0.6; cross-entropy on the 140 training
  nodes; backward). The target is this step at most 1.5x GATConv's.
- ``layer``: one attention layer alone, 64 -> 8 heads x 8 on Cora's graph,
  forward + backward of ``out.sum()``: the attention share is larger here.

Every step is timed twice: wall clock and the CPU time of the timing thread
(``time.thread_time``). Runs use one thread; on a shared machine the CPU time is
the robust figure (it does not count time spent waiting for a core), so the
ratios in ``ratio_to_gat`` use CPU time and ``wall_ratio_to_gat`` the wall clock.

Writes ``benchmarks/results/cone.json`` (times in ms and ratios to ``gat``) and
``benchmarks/results/cone.png``. Example::

    python benchmarks/cone.py --raw-dir /path/to/Cora/raw
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_geometric
import torch_geometric.transforms as T

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

from cora_cone_gat import ATTENTIONS, GAT, make_conv  # noqa: E402

from hiergraph.datasets.planetoid import load_planetoid  # noqa: E402


def epoch_step(model, data, x):
    """One training step of the full Cora model: forward, loss, backward."""

    def step():
        model.zero_grad(set_to_none=True)
        out = model(x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()

    return step


def layer_step(conv, x, edge_index):
    """Forward + backward of one attention layer."""

    def step():
        conv.zero_grad(set_to_none=True)
        conv(x, edge_index).sum().backward()

    return step


def measure(steps: dict, reps: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """CPU and wall times in ms of every step, interleaved; ``warmup`` rounds dropped."""
    times = {name: {"cpu": [], "wall": []} for name in steps}
    for rep in range(warmup + reps):
        for name, step in steps.items():
            cpu, wall = time.thread_time(), time.perf_counter()
            step()
            if rep >= warmup:
                times[name]["cpu"].append(1e3 * (time.thread_time() - cpu))
                times[name]["wall"].append(1e3 * (time.perf_counter() - wall))
    return times


def summarize(times: dict[str, dict[str, list[float]]]) -> dict:
    """Medians, quartiles and ratios to ``gat`` (CPU time; wall clock separately)."""
    base = {clock: statistics.median(times["gat"][clock]) for clock in ("cpu", "wall")}
    out = {}
    for name, clocks in times.items():
        q1, median, q3 = statistics.quantiles(clocks["cpu"], n=4)
        wall = statistics.median(clocks["wall"])
        out[name] = {
            "median_ms": median,
            "q1_ms": q1,
            "q3_ms": q3,
            "ratio_to_gat": median / base["cpu"],
            "wall_median_ms": wall,
            "wall_ratio_to_gat": wall / base["wall"],
        }
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, (kind, rows) in zip(axes, results.items(), strict=True):
        names = list(rows)
        medians = [rows[n]["median_ms"] for n in names]
        errors = [
            [rows[n]["median_ms"] - rows[n]["q1_ms"] for n in names],
            [rows[n]["q3_ms"] - rows[n]["median_ms"] for n in names],
        ]
        bars = ax.bar(names, medians, yerr=errors, capsize=4, color=["grey", "C0", "C1", "C2"])
        for bar, n in zip(bars, names, strict=True):
            ax.annotate(
                f"{rows[n]['ratio_to_gat']:.2f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
            )
        ax.set_title(f"Cora {kind}: forward + backward")
        ax.set_ylabel("median CPU ms (IQR)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=None, help="data root (default: $HIERGRAPH_DATA)")
    parser.add_argument("--raw-dir", default=None, help="folder to link raw Cora files from")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = load_planetoid("Cora", args.root, args.raw_dir, transform=T.NormalizeFeatures())[0]
    hidden = torch.randn(data.num_nodes, 64)
    x = data.x.to_sparse_csr()  # as examples/cora_cone_gat.py trains
    epoch = {a: epoch_step(GAT(a, data.num_features, 7), data, x) for a in ATTENTIONS}
    layer = {
        a: layer_step(make_conv(a, 64, 8, heads=8), hidden, data.edge_index) for a in ATTENTIONS
    }
    load_before = os.getloadavg()
    results = {
        "epoch": summarize(measure(epoch, args.reps, args.warmup)),
        "layer": summarize(measure(layer, args.reps, args.warmup)),
    }
    load = {"before": load_before, "after": os.getloadavg()}
    report = {
        "what": "forward+backward time on Cora (ms), median over reps, variants interleaved; "
        "median_ms/ratio_to_gat: CPU time of the timing thread, wall_*: wall clock",
        "target": "epoch ratio_to_gat <= 1.5 for penumbral and umbral",
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "reps": args.reps,
        "loadavg_1_5_15min": load,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cone.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out / "cone.png")
    print(f"load average before {load['before']}, after {load['after']}")
    for kind, rows in results.items():
        for name, row in rows.items():
            print(
                f"{kind:5s} {name:9s} cpu {row['median_ms']:7.2f} ms {row['ratio_to_gat']:.2f}x"
                f"  wall {row['wall_median_ms']:7.2f} ms {row['wall_ratio_to_gat']:.2f}x"
            )
    return report


if __name__ == "__main__":
    main()
