"""Peak memory of leaf-budget batches vs the budget's prediction, on mixed-size synthetic trees.

    python benchmarks/leaf_budget.py            # budgets 1024, 4096 (~20 min on a busy 2-core box)
    python benchmarks/leaf_budget.py --quick    # budget 512, small trees (a smoke run)

Dataset (**synthetic**): ragged window hierarchies whose leaf counts are
log-uniform in [8, half the largest budget], with one of three shapes per tree
(branching (4, 4, 4, 4), (16, 8, 4, 2) or (2, 2, 2, 2, 2, 2): from ~0.07 to ~1
internal node per leaf), plus two *giant* trees of three times the largest
budget, which the sampler puts in batches of their own.

Model: a training step of an HTE classifier (``--hidden`` wide, 2 layers,
4 heads, position bias): collate (``Batch.from_data_list``), forward, mean-pool,
cross-entropy, backward. Peak memory of a step is the peak of live tensor
bytes allocated inside it: on CPU from the allocation events of
``torch.profiler`` (``profile_memory=True``), on CUDA from
``torch.cuda.max_memory_allocated``. Parameters and the dataset live outside
the step and are not counted; gradients are (they are reset to ``None``).

Prediction models, fitted by least squares on a probe (8 batches of 1/4 and
1/2 of the budget from a separate sample of trees):

* ``leaves``: ``peak = a + c L``; a tree costs its ``L`` leaves;
* ``leaves+internal``: ``peak = a + c_L L + c_I I`` with ``I`` internal nodes;
  a tree costs ``L + ceil(w I)`` leaf-equivalents, ``w = c_I / c_L``
  (``leaf_counts(dataset, internal_weight=w)``).

For each model the sampler packs one epoch at the budget; the budget's
prediction is ``a + c * budget``. Recorded per batch: ``measured /
prediction(budget)`` (target: <= 1.3 for every batch within budget) and
``measured / prediction(own cost)`` (also for the oversized single trees).
Baseline: the same trees in batches of a *fixed number of trees* giving the
same mean batch count. Results: ``benchmarks/results/leaf_budget.json``, ``.png``
(``--out``: another JSON path, the plot beside it). A ``--quick`` run writes into
``benchmarks/results/`` only when ``--out`` names it, else ``leaf_budget_quick.json`` and
``.png`` into a fresh temporary folder, printed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import timing
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch_geometric.data import Batch

from hiergraph.data import random_window_hierarchy
from hiergraph.loader import LeafBudgetBatchSampler, leaf_counts
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool

SHAPES = ((4, 4, 4, 4), (16, 8, 4, 2), (2, 2, 2, 2, 2, 2))
CHANNELS, CLASSES = 16, 4


def mixed_trees(num: int, largest: int, giant: int, num_giants: int, seed: int) -> list:
    """**Synthetic** trees: log-uniform sizes in [8, largest], three shapes, plus giant trees."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.exp(torch.empty(num).uniform_(math.log(8), math.log(largest), generator=gen))
    sizes = sizes.long().tolist() + [giant] * num_giants
    trees = []
    for i, n in enumerate(sizes):
        shape = SHAPES[int(torch.randint(len(SHAPES), (), generator=gen))]
        x = torch.randn(n, CHANNELS, generator=gen)
        tree = random_window_hierarchy(n, shape, x=x, generator=gen)
        tree.y = torch.tensor([i % CLASSES])
        trees.append(tree)
    order = torch.randperm(len(trees), generator=gen).tolist()  # giants anywhere in the epoch
    return [trees[i] for i in order]


class Classifier(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.encoder = HierarchicalTransformerEncoder(CHANNELS, hidden, 2, 4, pos_channels=16)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, batch):
        return self.head(global_leaf_mean_pool(self.encoder(batch.x, batch), batch))


def step_peak_bytes(model: nn.Module, trees: list, device: torch.device) -> int:
    """Peak live tensor bytes of one training step (collate, forward, backward) on ``trees``."""
    model.zero_grad(set_to_none=True)

    def step():
        batch = Batch.from_data_list(trees).to(device)
        loss = F.cross_entropy(model(batch), batch.y)
        loss.backward()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def fit_linear(features: list[list[float]], peaks: list[int]) -> list[float]:
    """Least-squares ``peak = a + sum_j c_j feature_j``; returns ``[a, c_1, ...]``."""
    design = torch.tensor([[1.0, *f] for f in features], dtype=torch.float64)
    target = torch.tensor(peaks, dtype=torch.float64).unsqueeze(1)
    return torch.linalg.lstsq(design, target).solution.view(-1).tolist()


def measure(model, trees, batches, device) -> list[dict]:
    leaves, nodes = leaf_counts(trees), torch.tensor([t.num_nodes for t in trees])
    out = []
    for batch in batches:
        n_leaves, n_nodes = int(leaves[batch].sum()), int(nodes[batch].sum())
        peak = step_peak_bytes(model, [trees[i] for i in batch], device)
        out.append(
            {
                "trees": len(batch),
                "leaves": n_leaves,
                "internal": n_nodes - n_leaves,
                "peak_bytes": peak,
            }
        )
    return out


def calibrate(model, probe_trees, budget, device) -> dict:
    """Fit both prediction models on 8 probe batches of 1/4 and 1/2 of the budget."""
    probe = []
    for fraction in (4, 2):
        sampler = LeafBudgetBatchSampler(leaf_counts(probe_trees), budget // fraction)
        probe += measure(model, probe_trees, sampler.batches()[:4], device)
    peaks = [p["peak_bytes"] for p in probe]
    a, c = fit_linear([[p["leaves"]] for p in probe], peaks)
    a2, c_leaf, c_internal = fit_linear([[p["leaves"], p["internal"]] for p in probe], peaks)
    return {
        "probe": probe,
        # peak(L) = a + c L; the cost of a tree is its leaf count
        "leaves": {"intercept_bytes": a, "bytes_per_leaf": c, "internal_weight": 0.0},
        # peak(L, I) = a + c_L L + c_I I; the cost is L + ceil(w I) with w = c_I / c_L
        "leaves+internal": {
            "intercept_bytes": a2,
            "bytes_per_leaf": c_leaf,
            "bytes_per_internal": c_internal,
            "internal_weight": max(c_internal / c_leaf, 0.0),
        },
    }


def evaluate(rows: list[dict], fit: dict, budget: int) -> dict:
    """Annotate ``rows`` with predictions and summarise them against the target."""
    weight = fit["internal_weight"]
    predicted_budget = fit["intercept_bytes"] + fit["bytes_per_leaf"] * budget
    for row in rows:
        cost = row["leaves"] + weight * row["internal"]
        row["cost"] = cost
        row["predicted_bytes"] = fit["intercept_bytes"] + fit["bytes_per_leaf"] * cost
        row["ratio_to_own_prediction"] = row["peak_bytes"] / row["predicted_bytes"]
        row["ratio_to_budget_prediction"] = row["peak_bytes"] / predicted_budget
        row["oversized"] = row["trees"] == 1 and cost > budget
    within = [r for r in rows if not r["oversized"]]
    return {
        "predicted_budget_bytes": predicted_budget,
        "num_batches": len(rows),
        "num_oversized": len(rows) - len(within),
        "max_ratio_to_budget_prediction": max(r["ratio_to_budget_prediction"] for r in within),
        "max_ratio_to_own_prediction": max(r["ratio_to_own_prediction"] for r in rows),
        "min_ratio_to_own_prediction": min(r["ratio_to_own_prediction"] for r in rows),
        "mean_fill": sum(r["cost"] for r in within) / (budget * max(len(within), 1)),
    }


def run_budget(model, trees, budget, probe_trees, device, seed) -> dict:
    """Calibrate on the probe, then measure one epoch per cost model and the fixed baseline."""
    fits = calibrate(model, probe_trees, budget, device)
    models = {}
    for name in ("leaves", "leaves+internal"):
        fit = fits[name]
        costs = leaf_counts(trees, internal_weight=fit["internal_weight"])
        sampler = LeafBudgetBatchSampler(costs, budget, shuffle=True, seed=seed)
        rows = measure(model, trees, sampler.batches(), device)
        models[name] = {"fit": fit, "summary": evaluate(rows, fit, budget), "batches": rows}
    size = max(1, round(len(trees) / models["leaves"]["summary"]["num_batches"]))
    fixed = [list(range(i, min(i + size, len(trees)))) for i in range(0, len(trees), size)]
    fixed_rows = measure(model, trees, fixed, device)
    return {
        "budget": budget,
        "probe": fits["probe"],
        "models": models,
        "fixed_batch_size": size,
        "fixed": {"summary": evaluate(fixed_rows, fits["leaves"], budget), "batches": fixed_rows},
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2**20
    runs = results["runs"]
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 4.2 * len(runs)), squeeze=False)
    for row_axes, run in zip(axes, runs, strict=True):
        for ax, name in zip(row_axes, ("leaves", "leaves+internal"), strict=True):
            model = run["models"][name]
            for rows, color, label in (
                (run["fixed"]["batches"], "tab:gray", f"fixed {run['fixed_batch_size']} trees"),
                (model["batches"], "tab:blue", "budget batches"),
            ):
                ax.scatter(
                    [r["predicted_bytes"] / mib for r in rows],
                    [r["peak_bytes"] / mib for r in rows],
                    s=12,
                    c=color,
                    label=label,
                )
            budget_mib = model["summary"]["predicted_budget_bytes"] / mib
            top = max(r["peak_bytes"] for r in run["fixed"]["batches"]) / mib
            ax.plot([0, top], [0, top], "k--", lw=0.8, label="measured = predicted")
            ax.plot([0, top], [0, 1.3 * top], "r:", lw=0.8, label="1.3 x predicted")
            ax.axhline(budget_mib, color="tab:green", lw=0.8, label="budget prediction")
            ax.axhline(1.3 * budget_mib, color="tab:red", lw=0.8, label="1.3 x budget prediction")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"predicted peak (MiB), cost model '{name}'")
            ax.set_ylabel("measured peak tensor memory of a step (MiB)")
            ax.set_title(f"budget {run['budget']} ({name}), {results['device']}", fontsize=9)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="budget 512, 30 trees")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--trees", type=int, default=80, help="mixed-size trees")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    timing.add_out_option(parser, "leaf_budget.json")
    args = parser.parse_args(argv)
    out = timing.output_path(
        args.out, "leaf_budget_quick.json" if args.quick else "leaf_budget.json", args.quick
    )
    if args.quick:
        args.budgets, args.trees = [512], 30
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = Classifier(args.hidden).to(device)
    largest, giant = max(args.budgets) // 2, 3 * max(args.budgets)
    trees = mixed_trees(args.trees, largest, giant, 2, args.seed)
    probe_trees = mixed_trees(args.trees // 2, largest, giant, 0, args.seed + 1)
    step_peak_bytes(model, probe_trees[:2], device)  # warm-up (lazy initialisations)
    runs = [run_budget(model, trees, b, probe_trees, device, args.seed) for b in args.budgets]
    results = {
        "command": "python benchmarks/leaf_budget.py" + (" --quick" if args.quick else ""),
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "threads": args.threads,
        "hidden": args.hidden,
        "num_trees": len(trees),
        "giant_leaves": giant,
        "leaf_counts": leaf_counts(trees).tolist(),
        "target": "peak <= 1.3 x budget prediction for every batch within budget",
        "memory": "peak live tensor bytes of one step"
        + (
            " (torch.profiler allocation events)"
            if device.type == "cpu"
            else " (torch.cuda.max_memory_allocated)"
        ),
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    for run in runs:
        for name, model in run["models"].items():
            print(run["budget"], name, json.dumps(model["summary"]))
        print(run["budget"], "fixed", json.dumps(run["fixed"]["summary"]))
    return results


if __name__ == "__main__":
    main()
