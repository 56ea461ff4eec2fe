"""HSA inference (the forward alone, no autograd) at the lengths most models run, CPU.

    python benchmarks/hsa_inference.py             # four rows, 2 threads
    python benchmarks/hsa_inference.py --quick     # two small rows, for a smoke test

Rows: the batches of window trees of ``benchmarks/hsa_short.py`` (``B`` sequences of ``L``
tokens, 4 heads of 64 channels) and a padded batch shaped like a pretrained encoder's
(16 sequences of at most 256 tokens, 12 heads of 32; synthetic lengths: twelve of 256
tokens and four of 180–250, right padded, as a batch of truncated news articles). Every
method runs under ``torch.no_grad()`` in float32:

* ``flat``: ``scaled_dot_product_attention`` on the ``[B, H, L, d]`` batch (with the
  padding mask as an additive mask on the padded row);
* ``hsa``: :func:`~hiergraph.ops.hierarchical_attention` on contiguous ``[L, H, d]``
  inputs (the layout of a ``Linear`` projection), or on the padded row
  :func:`~hiergraph.integrations.padded_window_hsa` on ``[B, H, T, d]`` views of
  ``[B, T, H, d]`` memory (a Hugging Face layer's); without gradients the batches of
  trees run the compiled kernel of :mod:`hiergraph.ops.hsa.native`, the padded batch
  (whose padding is masked leaves) the fused op's passes alone;
* ``hsa-torch``: the ``hsa`` call of a batch of trees on PyTorch operations alone (the
  kernel turned off): the fused op's passes;
* ``hsa-heads-first``: the same op on inputs whose memory is heads first (tree rows);
* ``hsa-recorded``: the ``hsa`` call with those passes switched off, so that it runs the
  op every operation of which autograd would record (the inference path before the
  passes ran alone).

Rounds are interleaved (each round runs every method once); medians and spreads (min–max)
go to ``benchmarks/results/hsa_inference.json`` and a bar plot beside it (``--out``:
another JSON path). A ``--quick`` run writes there only when ``--out`` names it, else into
a fresh temporary folder, printed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from unittest import mock

import timing
import torch
import torch.nn.functional as F
from hsa_short import bar_plot, on_torch_ops

from hiergraph.data import window_forest
from hiergraph.integrations import padded_window_hsa
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import uniform

#: (batch, length, branching, heads, channels, lengths of a padded batch or None)
ROWS = (
    (64, 128, (16, 8), 4, 64, None),
    (32, 512, (16, 8, 4), 4, 64, None),
    (8, 2048, (16, 8, 4, 4), 4, 64, None),
    (16, 256, (2, 4, 8, 16), 12, 32, (256,) * 12 + (180, 200, 230, 250)),
)
QUICK_ROWS = ((8, 64, (8, 8), 4, 16, None), (4, 32, (2, 4, 4), 4, 8, (32, 32, 20, 9)))


def recorded(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` with the fused passes switched off: every operation runs as autograd would
    record it."""

    def call() -> torch.Tensor:
        with mock.patch.object(uniform, "fused_forward", lambda *args: False):
            return fn()

    return call


def make_cases(batch, length, branching, heads, dim, lengths) -> dict[str, Callable]:
    """``{method: fn}`` for one row; every ``fn()`` returns the attention output."""
    gen = torch.Generator().manual_seed(0)
    if lengths is not None:  # [B, H, T, d] views of [B, T, H, d] memory, right padded
        q, k, v = (
            torch.randn(batch, length, heads, dim, generator=gen).transpose(1, 2) for _ in range(3)
        )
        valid = torch.arange(length) < torch.tensor(lengths)[:, None]
        additive = torch.zeros(batch, 1, 1, length).masked_fill(~valid[:, None, None], -math.inf)
        hsa = lambda: padded_window_hsa(q, k, v, valid, branching)  # noqa: E731
        return {
            "flat": lambda: F.scaled_dot_product_attention(q, k, v, additive),
            "hsa": hsa,
            "hsa-recorded": recorded(hsa),
        }
    index = window_forest([length] * batch, branching).tree_index()
    leaves = batch * length
    nodes = [torch.randn(leaves, heads, dim, generator=gen) for _ in range(3)]
    first = [torch.randn(heads, leaves, dim, generator=gen).transpose(0, 1) for _ in range(3)]
    flat = [torch.randn(batch, heads, length, dim, generator=gen) for _ in range(3)]
    hsa = lambda: hierarchical_attention(*nodes, index)  # noqa: E731
    return {
        "flat": lambda: F.scaled_dot_product_attention(*flat),
        "hsa": hsa,
        "hsa-torch": on_torch_ops(hsa),
        "hsa-heads-first": lambda: hierarchical_attention(*first, index),
        "hsa-recorded": recorded(hsa),
    }


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=25, out="hsa_inference.json")
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, "hsa_inference.json", args.quick)
    results = []
    for batch, length, branching, heads, dim, lengths in QUICK_ROWS if args.quick else ROWS:
        cases = make_cases(batch, length, branching, heads, dim, lengths)
        with torch.no_grad():
            samples = timing.interleaved({m: (fn, ()) for m, fn in cases.items()}, args.rounds)
            fast, slow = cases["hsa"](), cases["hsa-recorded"]()  # after the warm-up calls
        median = timing.medians(samples)
        results.append({
            "batch": batch, "length": length, "branching": list(branching), "heads": heads,
            "dim": dim, "lengths": None if lengths is None else list(lengths),
            "rounds": args.rounds, "median_s": median, "spread_s": timing.spreads(samples),
            "samples_s": samples,
            "flat_over": {m: median["flat"] / median[m] for m in median},
            "recorded_over": {m: median["hsa-recorded"] / median[m] for m in median},
            "max_abs_diff_vs_recorded": (fast - slow).abs().max().item(),
        })  # fmt: skip
        print(
            f"{batch:>3} × {length:<5} "
            + "  ".join(f"{m} {s * 1e3:7.2f} ms" for m, s in median.items())
            + f"  | flat/hsa {median['flat'] / median['hsa']:.2f}"
            + f"  recorded/hsa {median['hsa-recorded'] / median['hsa']:.2f}"
        )
    meta = {"dtype": "float32", "threads": args.threads, "torch": torch.__version__,
            "command": timing.round_command("hsa_inference.py", args),
            "allocator": args.allocator, "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    labels = [f"{r['batch']}×{r['length']}" for r in results]
    title = f"HSA inference vs flat SDPA, CPU, {args.threads} threads"
    bar_plot(results, labels, title, args.out.with_suffix(".png"), log=True, what="forward")


if __name__ == "__main__":
    main()
