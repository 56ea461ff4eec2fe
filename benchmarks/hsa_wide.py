"""HSA on hierarchies with wide families (hundreds to thousands of siblings) vs SDPA, CPU.

    python benchmarks/hsa_wide.py            # the rows below, 2 threads, 5 rounds
    python benchmarks/hsa_wide.py --quick    # one small row, for a smoke test

A *star* of ``W`` leaves is one family under a root: HSA over it is softmax attention of
every leaf over the others, the same work as flat attention over ``W`` tokens. Rows
(**synthetic** trees, random ``q, k, v``, 4 heads of 64, float32, forward+backward):
batches of equal stars of 256 to 4,096 leaves (4,096 tokens per batch), stars of different
sizes (a ragged forest), and one tree of 8 families of 512 leaves. Methods:

* ``hsa``: :func:`~hiergraph.ops.hierarchical_attention` as it runs by default: with a
  gradient, the compiled kernels of :mod:`hiergraph.ops.hsa.native` take families of
  fewer than :data:`~hiergraph.ops.hsa.native.WIDE_FANOUT` members, and the forest kernel
  leaves forests whose wide families dominate
  (:func:`~hiergraph.ops.hsa.family_dense.wide_dominates`) to the reshaped views or the block
  kernel, whose blocks of :data:`~hiergraph.ops.hsa.family_dense.WIDE_BLOCK` or more members run
  in PyTorch's fused CPU attention kernel;
* ``hsa-kernels``: the same op without those three rules (the compiled kernels at every
  width, no fused attention kernel);
* ``hsa-torch``: PyTorch operations alone (the compiled kernels off), no fused attention
  kernel: reshaped views where they fit, else batched products;
* ``hsa-blocks``: the block kernel (``kernel="blocks"``), wide blocks in the fused kernel;
* ``sdpa``: ``scaled_dot_product_attention`` over each tree's leaves as one sequence
  (zero-padded, with a key padding mask, where the trees differ in size): flat attention,
  the peer of a star;
* ``hsa-causal``: strictly causal HSA (``causal=True``), by default: equal forests past the
  reshaped views' usual logit limit run as reshaped views
  (:func:`~hiergraph.ops.hsa.causal.runs_as_views`), whose wide leaf families run in the
  fused kernel (:func:`~hiergraph.ops.hsa.family_fused.leaf_family_attention`);
* ``hsa-causal-kernel``: the same without that rule (on the CPU the compiled causal kernel);
* ``sdpa-causal``: ``sdpa`` with a causal mask, the peer of the causal methods.

Rounds are interleaved (every method once per round) with freed memory kept for reuse.
Results: ``benchmarks/results/hsa_wide.json`` and ``.png`` (``--out``: another JSON path,
the plot beside it). A ``--quick`` run writes there only when ``--out`` names it, else
into a fresh temporary folder, printed.
"""

from __future__ import annotations

import json
import math
import os
from unittest import mock

import timing
import torch
import torch.nn.functional as F
from hsa_short import bar_plot
from torch_geometric.data import Batch

from hiergraph.data import from_nested
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import causal, family_dense, native
from hiergraph.ops.hsa.attention import attention_path

HEADS, DIM = 4, 64

#: ``(name, family sizes per tree)``: a tree of one list is a star, of several a root over
#: those families.
ROWS = (
    ("16 stars of 256", [[256]] * 16),
    ("8 stars of 512", [[512]] * 8),
    ("4 stars of 1,024", [[1024]] * 4),
    ("2 stars of 2,048", [[2048]] * 2),
    ("1 star of 4,096", [[4096]]),
    ("stars of 600-1,024", [[600], [700], [900], [1024]]),
    ("1 tree of 8 x 512", [[512] * 8]),
)
QUICK_ROWS = (("2 stars of 512", [[512]] * 2),)


def tree(sizes: list[int]):
    """A star of ``sizes[0]`` leaves, or a root over stars of ``sizes``."""
    start = [sum(sizes[:i]) for i in range(len(sizes))]
    families = [list(range(s, s + n)) for s, n in zip(start, sizes, strict=True)]
    return from_nested(families[0] if len(families) == 1 else families)


def without_wide_rules(fn, kernels: bool = True):
    """``fn`` with no family counted as wide (no fused attention kernel, compiled kernels
    at every width); without ``kernels``, the compiled kernels off too."""

    def call():
        with (
            mock.patch.object(family_dense, "WIDE_BLOCK", math.inf),
            mock.patch.object(family_dense, "WIDE_PAIRS_PER_LEAF", math.inf),
            mock.patch.object(native, "WIDE_FANOUT", math.inf),
        ):
            previous = native.set_enabled(kernels and native.enabled())
            try:
                return fn()
            finally:
                native.set_enabled(previous)

    return call


def make_cases(trees: list[list[int]]) -> tuple[dict, str]:
    """``{method: (step, leaf tensors)}`` for a row, and the default path."""
    gen = torch.Generator().manual_seed(0)
    batch = Batch.from_data_list([tree(sizes) for sizes in trees])
    index = batch.tree_index()
    q, k, v = (torch.randn(index.num_leaves, HEADS, DIM, generator=gen) for _ in "qkv")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    lengths = [sum(sizes) for sizes in trees]
    width = max(lengths)
    flat = [torch.randn(len(trees), HEADS, width, DIM, generator=gen) for _ in "qkv"]
    flat = [t.requires_grad_() for t in flat]
    key_ok = torch.arange(width) < torch.tensor(lengths)[:, None]  # [B, W]
    mask = None if min(lengths) == width else key_ok[:, None, None, :]
    causal_mask = torch.ones(width, width, dtype=torch.bool).tril() & key_ok[:, None, None, :]
    causal_sdpa = dict(is_causal=True) if mask is None else dict(attn_mask=causal_mask)

    def hsa(kernel="dense"):
        return hierarchical_attention(q, k, v, index, kernel=kernel)

    def hsa_causal():
        return hierarchical_attention(q, k, v, batch, causal=True, include_self=True)

    def causal_kernel():  # no reshaped views past their usual logit limit
        with mock.patch.object(causal, "MAX_VIEW_ELEMENTS", 0):
            return hsa_causal()

    cases = {
        "hsa": hsa,
        "hsa-kernels": without_wide_rules(hsa),
        "hsa-torch": without_wide_rules(hsa, kernels=False),
        "hsa-blocks": lambda: hsa("blocks"),
        "sdpa": lambda: F.scaled_dot_product_attention(*flat, attn_mask=mask),
        "hsa-causal": hsa_causal,
        "hsa-causal-kernel": causal_kernel,
        "sdpa-causal": lambda: F.scaled_dot_product_attention(*flat, **causal_sdpa),
    }
    steps = {
        name: (timing.sum_backward(fn), flat if name.startswith("sdpa") else [q, k, v])
        for name, fn in cases.items()
    }
    return steps, attention_path(q, k, v, index, None)


def peer(method: str) -> str:
    """The SDPA method ``method`` is compared with: causal SDPA for the causal ones."""
    return "sdpa-causal" if "causal" in method else "sdpa"


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=5, out="hsa_wide.json")
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, "hsa_wide.json", args.quick)
    torch.manual_seed(0)
    rows = []
    for name, trees in QUICK_ROWS if args.quick else ROWS:
        steps, path = make_cases(trees)
        samples = timing.interleaved(steps, args.rounds)
        median = timing.medians(samples)
        rows.append({
            "name": name, "trees": trees, "leaves": sum(map(sum, trees)),
            "widest": max(map(max, trees)), "path": path, "median_s": median,
            "spread_s": timing.spreads(samples), "samples_s": samples,
            "over_sdpa": {m: t / median[peer(m)] for m, t in median.items()},
        })  # fmt: skip
        print(f"{name:20} {path:7} " + "  ".join(
            f"{m} {t * 1e3:8.1f} ms" for m, t in median.items()), flush=True)  # fmt: skip
    meta = {
        "heads": HEADS, "dim": DIM, "dtype": "float32", "threads": args.threads,
        "rounds": args.rounds, "wide_block": family_dense.WIDE_BLOCK,
        "wide_pairs_per_leaf": family_dense.WIDE_PAIRS_PER_LEAF, "wide_fanout": native.WIDE_FANOUT,
        "torch": torch.__version__,
        "command": timing.round_command("hsa_wide.py", args), "allocator": args.allocator,
        "load_average": os.getloadavg(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    title = f"HSA with wide families, CPU, {args.threads} threads (float32, {HEADS} x {DIM})"
    bar_plot(rows, [r["name"] for r in rows], title, args.out.with_suffix(".png"), log=True)


if __name__ == "__main__":
    main()
