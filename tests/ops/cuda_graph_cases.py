"""Every op of ``test_gpu_path``, forward and backward, captured as one CUDA graph and
replayed, against its eager result, in float32 and bfloat16; plus HSA and SDPA at the
shapes of the GPU benchmark's first case. Between the capture and the replays, freed device
and pinned host memory is reallocated and filled with junk (:func:`churn`), so a graph that
reads memory it does not own fails.

A capture that goes wrong can leave the process's CUDA context unusable (an illegal memory
access is sticky), so the cases run in their own process, one after another, each announced
before it starts: ``python -m tests.ops.cuda_graph_cases`` prints ``START op dtype`` and
then ``OK op dtype`` or ``FAIL op dtype: why``; a crash names its case by the last
``START``. ``tests/ops/test_cuda_graphs.py`` runs it. ``--eager`` replaces the capture by
plain calls (the harness itself, checked on the CPU).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from tests.conftest import load_benchmark
from tests.ops.test_gpu_path import OPS, make_case

timing = load_benchmark("timing")  # the capture helper gpu.py times with

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def benchmark_case(name: str, device: str, dtype: torch.dtype) -> tuple[Callable, list]:
    """The shapes of ``benchmarks/gpu.py``'s first HSA case (64 trees of 128 leaves, windows
    of 16, 8 heads of 64, heads-first inputs): HSA, and SDPA over the same leaves (the peer
    timed beside it, to tell a PyTorch capture failure from one of ours)."""
    from torch_geometric.data import Batch

    from hiergraph.data import window_hierarchy
    from hiergraph.ops import hierarchical_attention

    gen = torch.Generator().manual_seed(0)
    if name == "sdpa-64x128":
        qkv = [torch.randn(64, 8, 128, 64, generator=gen) for _ in "qkv"]
        inputs = [t.to(device, dtype).requires_grad_() for t in qkv]
        return torch.nn.functional.scaled_dot_product_attention, inputs
    index = Batch.from_data_list([window_hierarchy(128, (16,))] * 64).tree_index().to(device)
    qkv = [torch.randn(8, index.num_leaves, 64, generator=gen) for _ in "qkv"]
    inputs = [t.to(device, dtype).transpose(0, 1).requires_grad_() for t in qkv]
    return (lambda q, k, v: hierarchical_attention(q, k, v, index)), inputs


BENCHMARK_CASES = ["hsa-64x128", "sdpa-64x128"]
CASES = OPS + BENCHMARK_CASES
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # relative to the largest entry


def step_of(fn: Callable, inputs: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Forward and backward of ``out.square().sum()``, gradients dropped first (so a captured
    backward allocates them in the graph's memory and each replay rewrites them)."""

    def step() -> torch.Tensor:
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        out.float().square().sum().backward()
        return out

    return step


def churn(device: str) -> None:
    """Allocate and fill device and pinned host memory with junk, then free it: a replay
    that reads memory its graph does not own (a freed plan tensor, the freed host source of
    a captured copy) then reads junk."""
    junk = [torch.full((1 << 14,), -(1 << 40), dtype=torch.long, device=device)
            for _ in range(64)]  # fmt: skip
    if device == "cuda":
        junk += [torch.full((n,), -(1 << 40), dtype=torch.long).pin_memory() for n in range(1, 65)]
        torch.cuda.synchronize()


def mismatch(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Why ``got`` differs from ``want`` beyond ``dtype``'s tolerance, or ``None``."""
    got, want = got.float().cpu(), want.float().cpu()
    if not torch.isfinite(got).all():
        return "non-finite values"
    error = (got - want).abs().max().item() if got.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 0.0
    return f"max error {error:.3g} of {scale:.3g}" if error > TOLERANCE[dtype] * scale else None


def check(name: str, dtype: torch.dtype, device: str, eager_only: bool) -> str | None:
    """Replays of ``name``'s captured step against an eager step; returns why they differ."""
    build = benchmark_case if name in BENCHMARK_CASES else make_case
    fn, inputs = build(name, device, dtype)
    inputs = [t.detach().requires_grad_() for t in inputs]  # leaves: gradients in .grad
    step = step_of(fn, inputs)
    want = step().detach().clone()
    want_grads = [None if t.grad is None else t.grad.clone() for t in inputs]
    run = step if eager_only else timing.cuda_graphed(step, torch.device(device))
    churn(device)
    for _ in range(2):  # a second replay: nothing left over from the first
        got = run()
    if device == "cuda":
        torch.cuda.synchronize()
    problems = [mismatch(got, want, dtype)] + [
        None if w is None else mismatch(t.grad, w, dtype)
        for t, w in zip(inputs, want_grads, strict=True)
    ]
    names = ["out"] + [f"grad {i}" for i in range(len(inputs))]
    found = [f"{where}: {p}" for where, p in zip(names, problems, strict=True) if p]
    return "; ".join(found) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eager", action="store_true", help="no capture (CPU harness check)")
    parser.add_argument("--ops", nargs="+", default=CASES, choices=CASES)
    args = parser.parse_args(argv)
    device = "cpu" if args.eager else "cuda"
    failed = 0
    for name in args.ops:
        for label, dtype in DTYPES.items():
            print(f"START {name} {label}", flush=True)
            try:
                why = check(name, dtype, device, args.eager)
            except Exception as error:  # noqa: BLE001 - reported, then the next case
                why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            failed += why is not None
            print(f"FAIL {name} {label}: {why}" if why else f"OK {name} {label}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
