"""One training epoch of a Hierarchical Transformer Encoder on random trees, CPU.

    python benchmarks/hte_epoch.py              # 1,000 trees of ~500 leaves (target < 60 s)
    python benchmarks/hte_epoch.py --trees 100  # a quick check

The data are a **synthetic stand-in**: random ragged hierarchies of
``U[400, 600]`` leaves whose windows have random sizes (mean branching drawn
per tree from a few bottom-up tuples, so depths and family sizes vary), leaf
features from N(0, 1) and a binary label (is the mean of feature 0 over the
first top-level sub-tree positive?). Only the speed is measured.

Model: ``HierarchicalTransformerEncoder(in=32, hidden=128, 2 layers, 4
heads, position channels 32)`` → global leaf mean pool → linear classifier,
AdamW, batch size 32 with the PyG ``DataLoader``. The epoch time includes
batching, the structural plan (``TreeIndex``) of every batch, forward,
backward and the optimiser step; building the 1,000 trees is reported
separately. Writes ``benchmarks/results/hte_epoch.json`` and a PNG of the
per-step times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch_geometric.loader import DataLoader

from hiergraph.data import random_window_hierarchy
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool

RESULTS = Path(__file__).resolve().parent / "results"
IN_CHANNELS = 32
BRANCHINGS = ((4, 4, 4), (8, 4, 2), (16, 8), (2, 4, 8), (6, 6))


def make_trees(num_trees: int, mean_leaves: int, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    trees = []
    for _ in range(num_trees):
        n = int(torch.randint(mean_leaves * 4 // 5, mean_leaves * 6 // 5 + 1, (), generator=gen))
        branching = BRANCHINGS[int(torch.randint(len(BRANCHINGS), (), generator=gen))]
        x = torch.randn(n, IN_CHANNELS, generator=gen)
        tree = random_window_hierarchy(n, branching, x=x, generator=gen)
        first = tree.parent[: tree.num_leaves] == tree.parent[0]  # leaves in leaf 0's window
        tree.y = (x[first, 0].mean() > 0).long().view(1)
        trees.append(tree)
    return trees


class Classifier(nn.Module):
    def __init__(self, hidden: int, layers: int, heads: int):
        super().__init__()
        self.encoder = HierarchicalTransformerEncoder(
            IN_CHANNELS, hidden, num_layers=layers, heads=heads, pos_channels=32
        )
        self.head = nn.Linear(hidden, 2)

    def forward(self, batch):
        h = self.encoder(batch.x, batch)
        return self.head(global_leaf_mean_pool(h, batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", type=int, default=1000)
    parser.add_argument("--leaves", type=int, default=500, help="mean leaves per tree")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "hte_epoch.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    t0 = time.perf_counter()
    trees = make_trees(args.trees, args.leaves)
    build_s = time.perf_counter() - t0
    model = Classifier(args.hidden, args.layers, args.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(trees, batch_size=args.batch_size, shuffle=True)

    steps, losses = [], []
    t0 = time.perf_counter()
    for batch in loader:
        t_step = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(batch), batch.y)
        loss.backward()
        opt.step()
        steps.append(time.perf_counter() - t_step)
        losses.append(loss.item())
    epoch_s = time.perf_counter() - t0

    leaves = sum(t.num_leaves for t in trees)
    result = dict(
        epoch_s=epoch_s,
        target_s=60.0,
        build_trees_s=build_s,
        median_step_s=statistics.median(steps),
        steps=len(steps),
        trees=args.trees,
        mean_leaves=leaves / args.trees,
        batch_size=args.batch_size,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        threads=torch.get_num_threads(),
        parameters=sum(p.numel() for p in model.parameters()),
        first_loss=losses[0],
        last_loss=losses[-1],
        data="synthetic random ragged window hierarchies (stand-in; speed only)",
        load_average_1min=os.getloadavg()[0],
        cpu_count=os.cpu_count(),
        command="python benchmarks/hte_epoch.py " + " ".join(sys.argv[1:]),
        torch=torch.__version__,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(steps, args.out.with_suffix(".png"), epoch_s)
    print(json.dumps(result, indent=2))


def plot(steps: list[float], path: Path, epoch_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([s * 1e3 for s in steps], ".-")
    ax.set(
        xlabel="step (batch of trees)",
        ylabel="step time (ms)",
        title=f"HTE training epoch: {epoch_s:.1f} s",
    )
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
