"""The HSA layer with hub leaves on batches of window trees, CPU.

    python benchmarks/hsa_hubs.py              # the three rows of hsa_short.py, 2 threads
    python benchmarks/hsa_hubs.py --no-compile # eager only (no inductor warm-up)
    python benchmarks/hsa_hubs.py --quick      # one small row, for a smoke test

For every row (``B`` sequences of ``L`` tokens, one :func:`~hiergraph.data.window_forest`
of equal trees; then the same with lengths drawn from ``[L/2, L]``, whose forest runs on its
equal-fanout embedding, :attr:`~hiergraph.plan.TreeIndex.padded`, and from ``[L/8, L]``,
whose trees differ in height and run on the forest's own levels) it times forward+backward
of a :class:`~hiergraph.nn.HierarchicalSelfAttention` layer (256 channels, 4 heads of 64,
float32, no position embeddings), the same weights in every method:

* ``no-hubs``: ``hubs=0``, plain HSA over the window trees;
* ``hubs``: ``hubs=g``, on the batch's own plan, its embedding or its levels (no lifted
  tree is built: :mod:`hiergraph.ops.hsa.lifted`);
* ``hubs-rebuilt``: ``hubs=g`` with the hubs lifted into a new tree with
  :func:`~hiergraph.data.lift_leaves` on every pass (what the layer did before it ran them
  in place), run with ``kernel="blocks"`` (a lifted window tree is ragged: the default
  kernel runs it as blocks too);
* ``hubs-compiled`` (equal trees only): the ``hubs`` layer through
  ``torch.compile(fullgraph=True, dynamic=False)`` (inductor on CPU; the batch's plan is
  built first), its compile time recorded separately.

Rounds are interleaved (every method once per round) with freed memory kept for reuse; the
JSON keeps every sample. Results: ``benchmarks/results/hsa_hubs.json`` and ``.png``
(``--out``: another JSON path, the plot beside it). A ``--quick`` run writes into
``benchmarks/results/`` only when ``--out`` names it, else into a fresh temporary folder,
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import timing
import torch
from hsa_short import ROWS, bar_plot

from hiergraph.data import window_forest
from hiergraph.nn import HierarchicalSelfAttention
from hiergraph.nn import hierarchical_attention as attention_layer

CHANNELS, HEADS, DIM = 256, 4, 64
QUICK_ROWS = ((4, 64, (8, 8)),)


#: Lengths of a row's batches: ``[L / s, L]`` for every ``s`` (1: all ``L``).
SPREADS = (1, 2, 8)


def row_lengths(batch: int, length: int, spread: int) -> list[int]:
    """``batch`` lengths: drawn uniformly from ``[length / spread, length]`` with a fixed
    seed (all ``length`` for ``spread`` 1)."""
    if spread == 1:
        return [length] * batch
    gen = torch.Generator().manual_seed(0)
    return torch.randint(length // spread, length + 1, (batch,), generator=gen).tolist()


def runs_on(index) -> str:
    """Where ``hubs`` runs the forest ``index``: its own plan (equal fanout), its
    equal-fanout embedding, or its levels."""
    if index.uniform is not None:
        return "plan"
    padded = index.padded_on(torch.device("cpu"), extended=False)  # as the op reads it
    return "embedding" if padded is not None and not padded.sunk else "levels"


def rebuilt(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` with the layer's hubs lifted into a new tree (not run in place)."""

    def call() -> torch.Tensor:
        with mock.patch.object(attention_layer, "runs_lifted", lambda index: False):
            return fn()

    return call


def make_cases(
    lengths: list[int], branching: tuple[int, ...], hubs: int, compile_layer: bool
) -> tuple[dict, float | None, str]:
    """``{method: (fn, leaf tensors)}`` for one row (every ``fn()`` returns the layer
    output), the compile time of ``hubs-compiled`` (``None`` without it) and
    :func:`runs_on` of the row's forest."""
    forest = window_forest(lengths, branching)
    index = forest.tree_index()  # the plan, built before any trace
    x = torch.randn(sum(lengths), CHANNELS, generator=torch.Generator().manual_seed(0))
    x.requires_grad_()
    options = dict(heads=HEADS, head_channels=DIM)
    layers = {
        "no-hubs": HierarchicalSelfAttention(CHANNELS, **options),
        "hubs": HierarchicalSelfAttention(CHANNELS, hubs=hubs, **options),
        "hubs-rebuilt": HierarchicalSelfAttention(CHANNELS, hubs=hubs, kernel="blocks", **options),
    }
    weights = layers["no-hubs"].state_dict()
    cases = {}
    for method, layer in layers.items():
        layer.load_state_dict(weights)
        cases[method] = ((lambda layer=layer: layer(x, forest)), [x, *layer.parameters()])
    cases["hubs-rebuilt"] = (rebuilt(cases["hubs-rebuilt"][0]), cases["hubs-rebuilt"][1])
    compile_s = None
    if compile_layer:
        torch._dynamo.reset()  # every row compiles its own static-shape graph
        layer = layers["hubs"]
        compiled = torch.compile(layer, fullgraph=True, dynamic=False)
        start = time.perf_counter()
        compiled(x, forest).sum().backward()
        compile_s = time.perf_counter() - start
        cases["hubs-compiled"] = ((lambda: compiled(x, forest)), [x, *layer.parameters()])
    return cases, compile_s, runs_on(index)


def plot(rows: list[dict], path: Path) -> None:
    labels = [
        f"{r['batch']}×{r['length']}" + (f"\n≥ L/{r['spread']}" if r["ragged"] else "")
        for r in rows
    ]
    title = f"HSA layer with {rows[0]['hubs']} hubs, CPU, {rows[0]['threads']} threads"
    bar_plot(rows, labels, title, path, log=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hubs", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="one small row")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    timing.add_out_option(parser, "hsa_hubs.json")
    args = parser.parse_args()
    args.out = timing.output_path(args.out, "hsa_hubs.json", args.quick)
    torch.set_num_threads(args.threads)
    timing.apply_allocator("reuse")
    torch.manual_seed(0)
    results = []
    rows = [(*row, s) for row in (QUICK_ROWS if args.quick else ROWS) for s in SPREADS]
    for batch, length, branching, spread in rows:
        lengths = row_lengths(batch, length, spread)
        ragged = spread > 1
        compile_layer = args.compile and not ragged  # a new batch shape compiles again
        cases, compile_s, where = make_cases(lengths, branching, args.hubs, compile_layer)
        steps = {
            method: (timing.grad_backward(fn, torch.randn_like(fn().detach())), tensors)
            for method, (fn, tensors) in cases.items()
        }
        samples = timing.interleaved(steps, args.rounds)
        median = timing.medians(samples)
        results.append({
            "batch": batch, "length": length, "branching": list(branching),
            "ragged": ragged, "spread": spread, "runs_on": where, "tokens": sum(lengths),
            "hubs": args.hubs, "threads": args.threads, "rounds": args.rounds,
            "median_s": median, "samples_s": samples,
            "rebuilt_over": {m: median["hubs-rebuilt"] / t for m, t in median.items()},
            "compile_s": compile_s,
        })  # fmt: skip
        print(f"{batch:>3} × {length:<5} {where:9} " + "  ".join(
            f"{m} {t * 1e3:7.1f} ms" for m, t in median.items()))  # fmt: skip
    flags = [f"--threads {args.threads}", f"--rounds {args.rounds}", f"--hubs {args.hubs}"]
    flags += ["--quick"] * args.quick + ["--no-compile"] * (not args.compile)
    command = " ".join(["python benchmarks/hsa_hubs.py", *flags])
    meta = {"channels": CHANNELS, "heads": HEADS, "dim": DIM, "dtype": "float32",
            "torch": torch.__version__, "command": command, "allocator": "reuse",
            "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
