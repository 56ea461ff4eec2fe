"""HSA on batches of sequences of different lengths (what a data loader gives), CPU.

    python benchmarks/hsa_lengths.py               # the rows below, 2 threads
    python benchmarks/hsa_lengths.py --quick       # one small row, for a smoke test

Every row draws ``B`` lengths uniformly from ``[L/2, L]`` (seeded) and builds one window
tree per sequence (:func:`~hiergraph.data.window_forest`, the given branching): the trees
differ, so the forest has no equal fanout. 4 heads of 64 channels, float32; forward and
backward of

* ``flat``: ``scaled_dot_product_attention`` on the zero-padded ``[B, H, L, d]`` batch
  with a key padding mask (how a transformer runs such a batch);
* ``hsa``: :func:`~hiergraph.ops.hierarchical_attention` with its default kernel: on the
  CPU the compiled forest kernel (:func:`~hiergraph.ops.hsa.native.forest_attention`),
  elsewhere the forest embedded in an equal-fanout forest and run as reshaped views where
  that is cheaper (:mod:`hiergraph.plan.padded_forest`), else the block kernel (the row's
  ``hsa_path`` says which ran);
* ``hsa-torch``: the same op on PyTorch operations alone (the kernels turned off: the
  padded embedding or the block kernel);
* ``hsa-blocks``: the same op forced onto the block kernel (``kernel="blocks"``);
* ``hsa-ragged-trees``: ``hsa`` on trees of the same lengths whose windows vary in size
  (:func:`~hiergraph.data.random_window_hierarchy`, sizes uniform in ``[1, 2b - 1]``), as
  sentences and paragraphs do (``ragged_path``: the path it took; such forests need too
  much padding for the embedding);
* ``flat-causal``, ``hsa-causal``, ``hsa-causal-edges``: the strictly causal
  counterparts: SDPA with a causal and key padding mask,
  :func:`~hiergraph.ops.causal_hierarchical_attention` with its default kernel (the
  padded forest, whose padding follows every tree's leaves) and forced onto its general
  edge-list path, whose softmax over each pair's keys runs in the compiled CPU kernel;
* ``hsa-causal-ragged-trees``, ``hsa-causal-ragged-edges``, ``hsa-causal-ragged-torch``:
  the strictly causal op on the ragged trees of ``hsa-ragged-trees``: by default (on the
  CPU the compiled causal kernel, :func:`~hiergraph.ops.hsa.native.causal_forest_attention`),
  on its edge lists (``kernel="edge"``, their softmax in the compiled kernel), and on
  PyTorch operations alone (the edge lists' gathers and scatters of every edge's rows).

Rounds are interleaved (each round runs every method once); medians and the spread
(min–max) are reported, with every sample in ``benchmarks/results/hsa_lengths.json``
(and a plot, ``hsa_lengths.png``; ``--out``: another JSON path, the plot beside it). A
``--quick`` run writes there only when ``--out`` names it, else into a fresh temporary
folder, printed. Freed CPU memory is kept for reuse (``--allocator default``: glibc's
settings).
"""

from __future__ import annotations

import json
import os

import timing
import torch
import torch.nn.functional as F
from hsa_short import on_torch_ops, plot
from torch_geometric.data import Batch

from hiergraph.data import random_window_hierarchy, window_forest
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention
from hiergraph.ops.hsa.attention import attention_path

HEADS, DIM = 4, 64
ROWS = ((64, 128, (16, 8)), (32, 512, (16, 8, 4)), (8, 2048, (16, 8, 4, 4)))
QUICK_ROWS = ((8, 64, (8, 8)),)


def make_cases(batch: int, length: int, branching: tuple[int, ...]) -> tuple[dict, dict]:
    """``{method: (fn, leaf tensors)}`` for one row, and what the row's forests are."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen).tolist()
    windows = window_forest(lengths, branching).tree_index()
    ragged = Batch.from_data_list(
        [random_window_hierarchy(n, branching, generator=gen) for n in lengths]
    ).tree_index()

    def rand(*shape):
        return [torch.randn(*shape, generator=gen).requires_grad_() for _ in range(3)]

    leaves = rand(sum(lengths), HEADS, DIM)
    padded = rand(batch, HEADS, length, DIM)
    keys = (torch.arange(length)[None] < torch.tensor(lengths)[:, None])[:, None, None, :]
    causal = keys & torch.ones(length, length, dtype=torch.bool).tril()
    cases = {
        "flat": (lambda: F.scaled_dot_product_attention(*padded, attn_mask=keys), padded),
        "hsa": (lambda: hierarchical_attention(*leaves, windows), leaves),
        "hsa-torch": (on_torch_ops(lambda: hierarchical_attention(*leaves, windows)), leaves),
        "hsa-blocks": (lambda: hierarchical_attention(*leaves, windows, kernel="blocks"), leaves),
        "hsa-ragged-trees": (lambda: hierarchical_attention(*leaves, ragged), leaves),
        "flat-causal": (lambda: F.scaled_dot_product_attention(*padded, attn_mask=causal), padded),
        "hsa-causal": (lambda: causal_hierarchical_attention(*leaves, windows), leaves),
        "hsa-causal-edges": (
            lambda: causal_hierarchical_attention(*leaves, windows, kernel="edge"),
            leaves,
        ),
        "hsa-causal-ragged-trees": (lambda: causal_hierarchical_attention(*leaves, ragged), leaves),
        "hsa-causal-ragged-edges": (
            lambda: causal_hierarchical_attention(*leaves, ragged, kernel="edge"),
            leaves,
        ),
        "hsa-causal-ragged-torch": (
            on_torch_ops(lambda: causal_hierarchical_attention(*leaves, ragged)),
            leaves,
        ),
    }
    info = {
        "lengths": lengths,
        "tokens": sum(lengths),
        "hsa_path": default_path(windows, leaves),
        "ragged_path": default_path(ragged, leaves),
        "blocks": sum(len(level.blocks) for level in windows.levels),
    }
    return cases, info


def default_path(index, leaves) -> str:
    """The path ``hierarchical_attention`` takes by default on the forest ``index`` with
    ``leaves`` (:func:`~hiergraph.ops.hsa.attention.attention_path`), for the report."""
    path = attention_path(*leaves, index, None)
    if path == "padded":
        return f"padded ({index.padded.num_slots:,} slots)"
    names = {"uniform": "equal fanout", "forest": "forest kernel", "blocks": "block kernel"}
    return names[path]


def _peer(method: str) -> str:
    return "flat-causal" if "causal" in method else "flat"


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=7, out="hsa_lengths.json")
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, "hsa_lengths.json", args.quick)
    results = []
    for batch, length, branching in QUICK_ROWS if args.quick else ROWS:
        cases, info = make_cases(batch, length, branching)
        steps = {m: (timing.sum_backward(fn), tensors) for m, (fn, tensors) in cases.items()}
        samples = timing.interleaved(steps, args.rounds)
        median = timing.medians(samples)
        results.append({
            "batch": batch, "length": length, "branching": list(branching),
            "threads": args.threads, **info,
            "rounds": args.rounds, "median_s": median, "spread_s": timing.spreads(samples),
            "samples_s": samples,
            # causal methods against causal flat attention, the others against flat
            "flat_over": {m: median[_peer(m)] / median[m] for m in median},
        })  # fmt: skip
        print(
            f"{batch:>3} × {length:<5} "
            + "  ".join(f"{m} {v * 1e3:7.1f} ms" for m, v in median.items()),
            flush=True,
        )
    meta = {
        "heads": HEADS, "dim": DIM, "dtype": "float32", "threads": args.threads,
        "torch": torch.__version__, "allocator": args.allocator,
        "command": timing.round_command("hsa_lengths.py", args),
        "load_average": os.getloadavg(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
