"""Operations dispatched off the CPU per step of HSA and H-matrix attention, counted on the CPU.

    python benchmarks/dispatch_count.py                # gpu.py's HSA cases, this checkout
    python benchmarks/dispatch_count.py --quick        # small cases, for a smoke test

Writes ``benchmarks/results/dispatch_count.json`` and ``.png`` (``--out``: another JSON
path, the plot beside it). A ``--quick`` run writes into ``benchmarks/results/`` only when
``--out`` names it, else into a fresh temporary folder, printed.

A small HSA step on a GPU is launch-bound: ``benchmarks/gpu.py``'s HSA cases of 64 x 128 to
16K leaves (8 heads x 64) took 3.4–11 ms eager on an H200 and 0.5–1.4 ms replayed as one
CUDA graph, so their eager time is the host's cost of issuing operations, about a fixed
cost per operation the dispatcher sees, views included. This script counts those
operations on the CPU: every case of ``gpu.py``'s HSA section (its ``hsa`` and
``hsa-heads-first`` methods, float32 and bfloat16; the strictly causal op,
``hsa-causal``, on its batches; its batch of sequences of different lengths, ``mixed``,
padded to equal fanout; its ``ragged`` batch of windows of random sizes, padded and on the
block kernel, ``hsa-blocks``), and H-matrix attention at its section's lengths, runs on
PyTorch's ``meta`` device
(tensors with shapes and no data: the code takes the branches it takes off the CPU and
does no arithmetic), forward and ``out.sum().backward()`` into fresh gradients (as ``gpu.py``
steps), under a ``TorchDispatchMode``
that counts every aten operation reaching the dispatcher. *Views* are those that return a
view of an input (``OpOverload.is_view``); *path* says whether the step ran as one
autograd node with a written backward (``fused``: HSA's equal-fanout op, H-matrix
attention always) or recorded every operation (``recorded``). The counts are exact and
deterministic: one step per case, after one warm-up step.

``--library DIR`` imports ``hiergraph`` from ``DIR`` (another checkout's sources) instead
of the installed package, so that two versions of the library are counted by the same
cases; ``--label`` names the result.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import timing  # imports no hiergraph (--library chooses which)

QUICK_CASES = ((4, 128), (1, 2048))
DTYPES = ("float32", "bfloat16")
METHODS = ("hsa", "hsa-heads-first")
TOP = 8  # most frequent operations kept per row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small cases")
    parser.add_argument("--library", type=Path, help="import hiergraph from this directory")
    parser.add_argument("--label", default="this checkout", help="what --library holds")
    timing.add_out_option(parser, "dispatch_count.json")
    parser.add_argument("--threads", type=int, help="torch threads (the counts do not vary)")
    args = parser.parse_args()
    args.out = timing.output_path(args.out, "dispatch_count.json", args.quick)
    if args.library is not None:  # before anything imports hiergraph
        sys.path.insert(0, str(args.library.resolve()))
    import gpu
    import torch

    import hiergraph

    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = gpu.QUICK if args.quick else gpu.FULL
    rows = []
    for case, method, make in steps(gpu, sizes, QUICK_CASES if args.quick else None):
        for dtype in DTYPES:
            row = {"case": case, "dtype": dtype, "method": method}
            rows.append(row | count_step(*make(getattr(torch, dtype))))
            print(*row.values(), rows[-1]["ops"], rows[-1]["path"], flush=True)
    package = Path(hiergraph.__file__).parent
    sources = sorted(package.rglob("*.py"))
    meta = {
        "device": "meta",
        "label": args.label,
        "library_sha1": hashlib.sha1(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12],
        "heads": sizes.heads,
        "head_dim": sizes.dim,
        "quick": args.quick,
        "torch": torch.__version__,
        "command": "python benchmarks/dispatch_count.py"
        + (" --quick" if args.quick else "")
        + ("" if args.library is None else f" --library DIR --label '{args.label}'"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, f"Operations per forward+backward off the CPU ({args.label})", args.out)


def steps(gpu, sizes, hsa_cases=None):
    """``(case, method, make)`` of every counted step, ``make(dtype)`` its forward on the
    ``meta`` device and the leaves that get gradients: ``gpu.py``'s HSA cases
    (``hsa_cases``, default all of them) in both layouts, the strictly causal op on its
    batches, its batches of sequences of different lengths (equal and random windows), its
    H-matrix lengths."""
    import torch

    meta = torch.device("meta")
    run = SimpleNamespace(sizes=sizes, device=meta)

    def built(method):
        return lambda dtype: method.build(dtype, meta)

    for trees, leaves in hsa_cases or gpu.hsa_cases(sizes):
        methods = gpu.hsa_methods(run, trees, leaves)
        for name in METHODS:
            yield f"{trees}x{leaves}", name, built(methods[name])
    for trees, leaves in sizes.hsa_batches:  # the strictly causal op (decoder training)
        causal = gpu.hsa_causal_methods(run, trees, leaves)["hsa-causal"]
        yield f"{trees}x{leaves}", "hsa-causal", built(causal)
    trees, leaves = sizes.hsa_batches[0]  # the same batch, sequences of different lengths
    mixed = gpu.hsa_lengths_methods(run, trees, leaves)["hsa"]
    yield f"{trees}x{leaves} mixed", "hsa", built(mixed)
    trees, leaves = sizes.hsa_batches[min(1, len(sizes.hsa_batches) - 1)]  # random windows
    for name, method in gpu.hsa_lengths_methods(run, trees, leaves, ragged=True).items():
        if name.startswith("hsa"):
            yield f"{trees}x{leaves} ragged", name, built(method)
    for length in sizes.hmatrix:
        yield f"L={length}", "hmatrix", built(gpu.hmatrix_methods(length)["hmatrix"])


def count_step(fn, leaves: list) -> dict:
    """The operations dispatched by one step of ``fn`` (forward, ``out.sum().backward()``
    into fresh gradients of ``leaves``, as ``gpu.py`` times it and as a training loop
    whose optimiser sets them to ``None`` runs it), after a warm-up step: ``ops``,
    ``views``, the ``path`` and the :data:`TOP` most frequent operations."""
    import timing
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: collections.Counter = collections.Counter()
            self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            self.views += func.is_view
            return func(*args, **(kwargs or {}))

    def step() -> torch.Tensor:
        timing.reset_grads(leaves)
        out = fn()
        out.sum().backward()
        return out

    out = step()
    with Counter() as counter:
        step()
    fused = any(
        name in type(node).__name__
        for node in graph_nodes(out.grad_fn)
        for name in ("_FusedUniform", "_HMatrixCore")
    )
    return {
        "ops": sum(counter.ops.values()),
        "views": counter.views,
        "path": "fused" if fused else "recorded",
        "top": dict(counter.ops.most_common(TOP)),
    }


def graph_nodes(node) -> list:
    """Every autograd node reachable from ``node``."""
    seen, stack = [], [node]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return seen


def plot(rows: list[dict], title: str, out: Path) -> None:
    """Grouped bars: operations per step of every (method, dtype), per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    series = list(dict.fromkeys((r["method"], r["dtype"]) for r in rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * len(cases)), 4))
    for i, (method, dtype) in enumerate(series):
        ops = {r["case"]: r["ops"] for r in rows if (r["method"], r["dtype"]) == (method, dtype)}
        xs = [j + i * width for j in range(len(cases))]
        ax.bar(xs, [ops.get(c, 0) for c in cases], width, label=f"{method} {dtype}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.set_ylabel("dispatched operations per step")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
