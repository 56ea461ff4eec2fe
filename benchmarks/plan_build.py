"""Building the plan of a batch of trees, beside the HSA step it serves, CPU.

    python benchmarks/plan_build.py               # the rows below, 2 threads
    python benchmarks/plan_build.py --quick       # one small row, for a smoke test

A batch's :class:`~hiergraph.plan.TreeIndex` is built once per batch, on the host, and
shared by every layer and head; a training loop pays it once per step. The rows are
``benchmarks/hsa_lengths.py``'s: ``B`` lengths drawn uniformly from ``[L/2, L]`` (seeded),
each sequence one tree: window trees of the given branching (``windows``, a forest without
equal fanout) and trees of windows of random sizes, uniform in ``[1, 2b - 1]`` (``ragged``,
:func:`~hiergraph.data.random_window_hierarchy`). For each forest, in interleaved rounds:

* ``collate``: ``Batch.from_data_list`` of the trees (PyG's batching);
* ``plan``: :meth:`TreeIndex.from_hierarchy <hiergraph.plan.TreeIndex.from_hierarchy>`
  (the structure checked, then planned), the plan the ops build: the parts that only some
  paths read (the padded embedding, the family blocks) left for first use;
* ``plan-complete``: the same plan with those parts built
  (:meth:`~hiergraph.plan.TreeIndex.complete`), as ``tree_index()`` and
  :class:`~hiergraph.loader.HierarchyLoader` build it, and as every plan was built before
  the parts were left for first use;
* ``hsa``: forward+backward of :func:`~hiergraph.ops.hierarchical_attention` (default
  kernel: on the CPU the compiled forest kernel, which reads neither part) on the built
  plan, 4 heads of 64 channels, float32;
* ``flat``: forward+backward of ``scaled_dot_product_attention`` on the zero-padded
  ``[B, H, L, d]`` batch with a key padding mask (one per row: both forests have the
  row's lengths).

Medians and the spread (min–max) are reported, with every sample, in
``benchmarks/results/plan_build.json`` (and a plot, ``plan_build.png``; ``--out``: another
JSON path, the plot beside it). A ``--quick`` run writes there only when ``--out`` names it,
else into a fresh temporary folder, printed. Freed CPU memory is kept for reuse
(``--allocator default``: glibc's settings).
"""

from __future__ import annotations

import json
import os

import timing
import torch
import torch.nn.functional as F
from hsa_lengths import QUICK_ROWS, ROWS
from torch_geometric.data import Batch

from hiergraph.data import random_window_hierarchy, window_hierarchy
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa.attention import attention_path
from hiergraph.plan import TreeIndex

HEADS, DIM = 4, 64
FORESTS = ("windows", "ragged")


def make_cases(batch: int, length: int, branching: tuple[int, ...]) -> tuple[dict, dict]:
    """``{method: (step, leaf tensors)}`` for one row (methods ``forest/what`` and
    ``flat``), and what the row's forests are."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen).tolist()
    trees = {
        "windows": [window_hierarchy(n, branching) for n in lengths],
        "ragged": [random_window_hierarchy(n, branching, generator=gen) for n in lengths],
    }
    leaves = [torch.randn(sum(lengths), HEADS, DIM, generator=gen).requires_grad_()
              for _ in "qkv"]  # fmt: skip
    padded = [torch.randn(batch, HEADS, length, DIM, generator=gen).requires_grad_()
              for _ in "qkv"]  # fmt: skip
    keys = (torch.arange(length)[None] < torch.tensor(lengths)[:, None])[:, None, None, :]
    cases = {
        "flat": (timing.sum_backward(
            lambda: F.scaled_dot_product_attention(*padded, attn_mask=keys)), padded),
    }  # fmt: skip
    info = {"lengths": lengths, "tokens": sum(lengths), "paths": {}, "blocks": {}}
    for name, items in trees.items():
        forest = Batch.from_data_list(items)
        index = TreeIndex.from_hierarchy(forest).complete()
        cases |= {
            f"{name}/collate": (lambda items=items: Batch.from_data_list(items), []),
            f"{name}/plan": (lambda f=forest: TreeIndex.from_hierarchy(f), []),
            f"{name}/plan-complete": (
                lambda f=forest: TreeIndex.from_hierarchy(f).complete(), []),
            f"{name}/hsa": (timing.sum_backward(
                lambda i=index: hierarchical_attention(*leaves, i)), leaves),
        }  # fmt: skip
        info["paths"][name] = attention_path(*leaves, index, None)
        info["blocks"][name] = sum(len(level.blocks) for level in index.levels)
    return cases, info


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=9, out="plan_build.json")
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, "plan_build.json", args.quick)
    results = []
    for batch, length, branching in QUICK_ROWS if args.quick else ROWS:
        cases, info = make_cases(batch, length, branching)
        samples = timing.interleaved(cases, args.rounds)
        median = timing.medians(samples)
        derived = {
            forest: {
                # what leaving the parts for first use saves on the plan
                "complete_over_plan": median[f"{forest}/plan-complete"] / median[f"{forest}/plan"],
                # the plan's share of a step of the HSA op, plan included
                "plan_share": median[f"{forest}/plan"]
                / (median[f"{forest}/plan"] + median[f"{forest}/hsa"]),
                # flat attention against the HSA op with its plan
                "flat_over_hsa_and_plan": median["flat"]
                / (median[f"{forest}/plan"] + median[f"{forest}/hsa"]),
                "flat_over_hsa": median["flat"] / median[f"{forest}/hsa"],
            }
            for forest in FORESTS
        }
        results.append({
            "batch": batch, "length": length, "branching": list(branching),
            "threads": args.threads, **info, "rounds": args.rounds,
            "median_s": median, "spread_s": timing.spreads(samples), "samples_s": samples,
            "derived": derived,
        })  # fmt: skip
        print(f"{batch:>3} × {length:<5} " + "  ".join(
            f"{m} {v * 1e3:.2f} ms" for m, v in median.items()), flush=True)  # fmt: skip
    meta = {
        "heads": HEADS, "dim": DIM, "dtype": "float32", "threads": args.threads,
        "torch": torch.__version__, "allocator": args.allocator,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "command": timing.round_command("plan_build.py", args),
        "load_average": os.getloadavg(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))


def plot(rows: list[dict], out) -> None:
    """Per row and forest: the plan as the ops build it, complete, and the HSA step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ("collate", "plan", "plan-complete", "hsa")
    labels = [f"{r['batch']}×{r['length']}\n{forest}" for r in rows for forest in FORESTS]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(labels)), 4))
    for i, method in enumerate(methods):
        times = [r["median_s"][f"{forest}/{method}"] * 1e3 for r in rows for forest in FORESTS]
        ax.bar([j + i * width for j in range(len(labels))], times, width, label=method)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
    ax.set_ylabel("median ms (hsa: forward+backward)")
    ax.set_title("A batch's plan beside the HSA step it serves (CPU)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
