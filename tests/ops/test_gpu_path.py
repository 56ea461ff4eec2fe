"""The accelerator path of ``hiergraph.ops``: CUDA = CPU, no host synchronisation in the hot
loop, bf16 autocast, and ``torch.compile`` without graph breaks.

Every op runs from prepared structure: a hierarchy's :class:`~hiergraph.plan.TreeIndex` is
built once on the CPU and moved to the device (``index.to(device)``), as a training loop
would; building it is data-dependent host work and is not part of the hot loop.

Without CUDA only the CPU checks run: bf16 autocast on CPU, the graph-break list of
``torch._dynamo.explain``, and (marked slow) a full inductor compile.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.decomposition import select_decomp_table
from torch_geometric.data import Batch

from hiergraph._device import cpu_as_accelerator
from hiergraph.data import from_nested, random_window_hierarchy, window_forest, window_hierarchy
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention, masked_softmax
from hiergraph.ops.cone import penumbral, penumbral_edge, umbral
from hiergraph.ops.hmatrix import hmatrix_attention
from hiergraph.ops.hsa.family_products import family_gram
from hiergraph.ops.hsa.lifted import lifted_attention
from hiergraph.ops.masked.banded import banded_attention
from hiergraph.ops.masked.edge_products import EdgeCSR, edge_aggregate, edge_dot

CUDA = torch.cuda.is_available()
# minutes on CPU (inductor compiles C++); the suite runs slow tests by default, so opt in
opt_in = pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def forest():
    """Two ragged trees and a small nested one, batched: mixed family sizes and depths."""
    gen = torch.Generator().manual_seed(0)
    trees = [
        random_window_hierarchy(37, (4, 3), generator=gen),
        from_nested([[0, 1, 2], [3, 4], [[5, 6], 7]]),
        random_window_hierarchy(20, (2, 2, 2), generator=gen),
    ]
    return Batch.from_data_list(trees)


def make_case(name: str, device: str, dtype: torch.dtype) -> tuple[Callable, list[torch.Tensor]]:
    """``(fn, inputs)``: ``fn(*inputs)`` runs op ``name``; inputs require grad."""
    gen = torch.Generator().manual_seed(1)

    def rand(*shape, positive=False):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64)
        t = t.abs() * 0.5 + 0.1 if positive else t
        return t.to(device, dtype).requires_grad_()

    if name == "hsa-uniform":  # equal window trees, heads-first memory: the reshaped path
        index = Batch.from_data_list([window_hierarchy(32, (4, 4))] * 3).tree_index()
        index = index.to(device)
        assert index.uniform is not None
        qkv = [rand(2, index.num_leaves, 8).detach().transpose(0, 1) for _ in "qkv"]
        return (lambda q, k, v: hierarchical_attention(q, k, v, index)), [
            t.requires_grad_() for t in qkv
        ]
    if name == "hsa-padded":  # window trees of different lengths: padded to equal fanout
        index = window_forest([37, 20, 64, 50], (4, 4)).tree_index().to(device)
        assert index.padded is not None and index.padded.pays_off(2, 16)
        return (lambda q, k, v: hierarchical_attention(q, k, v, index, include_self=True)), [
            rand(index.num_leaves, 2, 8) for _ in range(3)
        ]
    if name == "hsa-lifted":  # hub leaves under the roots of window trees of two lengths
        index = window_forest([24, 17], (2, 3, 4)).tree_index().to(device)
        assert index.padded is not None
        lifted = torch.zeros(41, dtype=torch.bool)
        lifted[[0, 5, 30, 40]] = True
        lifted, eps = lifted.to(device), rand(index.num_nodes, 1, 4)
        options = dict(include_self=True, leaf_mask=None, scale=0.3, size_bias=True)

        def fn(q, k, v, eps):
            return lifted_attention(q, k, v, index, lifted, 3, pos_emb=eps, **options)

        return fn, [rand(41, 2, 8), rand(41, 2, 8), rand(41, 2, 4), eps]
    if name == "hsa-lifted-ragged":  # hub leaves of ragged trees: on the forest's levels
        wide = from_nested([list(range(40))])  # too ragged to embed, even off the CPU
        index = Batch.from_data_list([*forest().to_data_list(), wide]).tree_index().to(device)
        assert index.uniform is None and index.padded is None
        lifted = torch.zeros(index.num_leaves, dtype=torch.bool)
        lifted[[0, 5, 30, 37, 40, 60]] = True
        lifted, eps = lifted.to(device), rand(index.num_nodes, 1, 4)
        options = dict(include_self=True, leaf_mask=None, scale=0.3, size_bias=True)

        def fn(q, k, v, eps):
            return lifted_attention(q, k, v, index, lifted, 3, pos_emb=eps, **options)

        leaves = index.num_leaves
        return fn, [rand(leaves, 2, 8), rand(leaves, 2, 8), rand(leaves, 2, 4), eps]
    if name == "hsa-strict-causal":  # strictly causal, equal fanout: reshaped views
        plan = window_forest([16, 16], (4, 2)).to(device).causal_plan()
        assert plan.tree_index.uniform is not None
        eps = rand(plan.num_nodes, 2, 4)
        return (lambda q, k, v, eps: causal_hierarchical_attention(q, k, v, plan, pos_emb=eps)), [
            rand(32, 2, 8), rand(32, 2, 8), rand(32, 2, 4), eps
        ]  # fmt: skip
    if name.startswith("hsa"):
        batch = forest()
        index = batch.tree_index().to(device)
        leaves, nodes = index.num_leaves, index.num_nodes
        q, k, v, eps = rand(leaves, 2, 8), rand(leaves, 2, 8), rand(leaves, 2, 4), rand(nodes, 4)
        mask = (torch.arange(leaves) % 7 != 3).to(device)
        options = {
            "hsa-dense": {"pos_emb": eps},
            "hsa-edge": {"pos_emb": eps, "kernel": "edge"},
            "hsa-causal": {"include_self": True, "leaky_causal": True, "leaf_mask": mask},
        }[name]
        inputs = [q, k, v, eps] if "pos_emb" in options else [q, k, v]

        def fn(q, k, v, *rest):
            opts = dict(options, pos_emb=rest[0]) if rest else options
            return hierarchical_attention(q, k, v, index, **opts)

        return fn, inputs
    if name == "hmatrix":
        pad = torch.zeros(2, 24, dtype=torch.bool, device=device)
        pad[1, 20:] = True
        return (lambda q, k, v: hmatrix_attention(q, k, v, 4, key_padding_mask=pad)), [
            rand(2, 2, 24, 8),
            rand(2, 2, 24, 8),
            rand(2, 2, 24, 4),
        ]
    if name == "banded":
        return (lambda q, k, v: banded_attention(q, k, v, 3, 2, lengths=[30, 17])), [
            rand(47, 2, 8),
            rand(47, 2, 8),
            rand(47, 2, 4),
        ]
    if name in ("penumbral", "umbral"):
        fn = penumbral if name == "penumbral" else umbral
        return fn, [rand(2, 12, 6) * 0.3, rand(2, 15, 6) * 0.3]
    if name == "penumbral-edge":
        edges = torch.randint(0, 12, (2, 40), generator=gen).to(device)
        return (lambda q, k: penumbral_edge(q, k, edges)), [rand(12, 2, 6), rand(12, 2, 6)]
    if name == "edge-products":  # MaskedAttentionConv's sparse products on a random graph
        graph = EdgeCSR(torch.randint(0, 12, (2, 40), generator=gen).to(device), (12, 12))

        def fn(q, k, v):
            return edge_aggregate(edge_dot(q, k, graph).sigmoid(), v, graph)

        return fn, [rand(12, 2, 6), rand(12, 2, 6), rand(12, 2, 4)]
    if name == "vcc":  # the static-shape encoder: partition, local window, VCC layer, restore
        from hiergraph.nn import VCCEncoder

        torch.manual_seed(0)
        options = dict(block_size=4, num_refined=2, local_layers=1, local_size=16, vip_slots=3)
        enc = VCCEncoder(1, 16, 2, 32, **options).to(device, dtype)
        vip = torch.zeros(2, 40, dtype=torch.bool, device=device)
        vip[:, [1, 7, 30]] = True
        mask = (torch.arange(40)[None] < torch.tensor([[40], [33]])).to(device)
        return (lambda x: enc(x, vip, mask)), [rand(2, 40, 16)]
    if name == "masked-softmax":
        mask = (torch.rand(3, 5, 9, generator=gen) > 0.3).to(device)
        return (lambda logits: masked_softmax(logits, mask)[1]), [rand(3, 5, 9)]
    raise ValueError(name)


OPS = [
    "hsa-dense",
    "hsa-uniform",
    "hsa-padded",
    "hsa-lifted",
    "hsa-lifted-ragged",
    "hsa-edge",
    "hsa-causal",
    "hsa-strict-causal",
    "hmatrix",
    "banded",
    "penumbral",
    "umbral",
    "penumbral-edge",
    "edge-products",
    "masked-softmax",
    "vcc",
]

# ops that trace as one graph (the README lists the breaks of the others)
TRACE_CLEAN = [
    "hsa-dense",
    "hsa-uniform",
    "hsa-padded",
    "hsa-lifted",
    "hsa-lifted-ragged",
    "hsa-edge",
    "hsa-causal",
    "hsa-strict-causal",
    "penumbral",
    "umbral",
    "masked-softmax",
    "vcc",
]


def run_with_grads(fn, inputs):
    out = fn(*inputs)
    grads = torch.autograd.grad(out.square().sum(), inputs, allow_unused=True)
    return out, grads


# ------------------------------------------------------------------------------- CUDA


@needs_cuda
@pytest.mark.parametrize("name", OPS)
def test_cuda_matches_cpu(name):
    out_cpu, grads_cpu = run_with_grads(*make_case(name, "cpu", torch.float64))
    out_gpu, grads_gpu = run_with_grads(*make_case(name, "cuda", torch.float64))
    torch.testing.assert_close(out_gpu.cpu(), out_cpu)
    for g_gpu, g_cpu in zip(grads_gpu, grads_cpu, strict=True):
        if g_cpu is not None:
            torch.testing.assert_close(g_gpu.cpu(), g_cpu)


@needs_cuda
@pytest.mark.parametrize("name", OPS)
def test_no_host_sync_in_hot_loop(name):
    fn, inputs = make_case(name, "cuda", torch.float32)
    run_with_grads(fn, inputs)  # warm-up: lazy initialisation may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):  # forward and backward, twice
            run_with_grads(fn, inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- autocast


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_autocast_bf16(name, device):
    """Under bf16 autocast the ops run, stay finite and track float32 to bf16 accuracy."""
    fn, inputs = make_case(name, device, torch.float32)
    reference, _ = run_with_grads(fn, inputs)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out, grads = run_with_grads(fn, inputs)
    assert torch.isfinite(out).all()
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out.float(), reference, rtol=0.05, atol=0.05)


# ------------------------------------------------------------------------------ compile


@pytest.mark.parametrize("device", DEVICES)
def test_hsa_compiles_as_one_graph(device):
    """``hierarchical_attention`` from a prepared TreeIndex traces as a single graph, on
    its first call: the plan holds what the default kernel reads, nothing is built on
    first use.

    ``fullgraph=True`` raises at the first graph break, naming it; the cheap ``eager``
    backend checks the trace without running inductor (see the slow test for that).
    """
    fn, inputs = make_case("hsa-dense", device, torch.float32)
    torch._dynamo.reset()
    out = torch.compile(fn, backend="eager", fullgraph=True)(*inputs)
    torch.testing.assert_close(out, fn(*inputs))


@pytest.mark.parametrize("device", DEVICES)
def test_vcc_encoder_compiles_as_one_graph(device):
    """``VCCEncoder`` with ``vip_slots`` has static shapes: one graph, forward and backward
    (input checks take their device-side branch, as on an accelerator)."""
    fn, inputs = make_case("vcc", device, torch.float32)
    with cpu_as_accelerator():
        expected, expected_grads = run_with_grads(fn, inputs)
        torch._dynamo.reset()
        out, grads = run_with_grads(torch.compile(fn, backend="eager", fullgraph=True), inputs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, expected_grads)


def graph_breaks(fn, inputs) -> list[str]:
    """``file:line reason`` of every graph break ``torch._dynamo.explain`` finds.

    One eager call first fills the lazily cached structure (e.g. ``TreeIndex.sibling_pairs``),
    as the first step of a training loop would.
    """
    fn(*inputs)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*inputs)
    out = []
    for reason in explanation.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "?"
        out.append(f"{where} {str(reason.reason).splitlines()[0]}")
    return out


@pytest.mark.slow
@opt_in
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TRACE_CLEAN)
def test_no_graph_breaks(name, device):
    breaks = graph_breaks(*make_case(name, device, torch.float32))
    assert breaks == [], f"{len(breaks)} graph breaks in {name}: {sorted(set(breaks))}"


@pytest.mark.slow
@opt_in
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_compiled_matches_eager(name, device):
    """Compiled by inductor with static shapes, every op and its gradients equal eager ones."""
    fn, inputs = make_case(name, device, torch.float32)
    torch._dynamo.reset()
    out, grads = run_with_grads(torch.compile(fn), inputs)
    ref, ref_grads = run_with_grads(fn, inputs)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def compiled_graph_ops(fn, inputs) -> set[str]:
    """The ATen ops of the forward and backward graphs that ``torch.compile`` traces for
    ``fn(*inputs)`` with inductor's decompositions (no code generated), after one eager
    call (see :func:`graph_breaks`)."""
    fn(*inputs)
    ops = set()

    def keep(graph_module, example_inputs):
        ops.update(str(n.target) for n in graph_module.graph.nodes if n.op == "call_function")
        return make_boxed_func(graph_module.forward)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, decompositions=select_decomp_table())
    torch._dynamo.reset()
    run_with_grads(torch.compile(fn, backend=backend, fullgraph=True), inputs)
    return ops


@pytest.mark.parametrize("name", [*TRACE_CLEAN, "family-gram"])
def test_compiled_graphs_scatter_no_diagonal(name):
    """No compiled graph writes into a diagonal view (``diagonal_scatter``, which the
    gradient of a diagonal view and an in-place fill of one become): inductor (PyTorch
    2.13) lowers it as a write into a fresh buffer and can fuse a read of that buffer
    ahead of the write, which gave the strictly causal op wrong ``q, k`` gradients
    silently (``test_compiled_training_gradients``). ``family-gram``: 1,024 families of 4
    on the CPU, which eager mode takes four at a time as diagonal blocks of one product."""
    if name == "family-gram":
        fn, inputs = family_gram, [torch.randn(1024, 4, 8, requires_grad=True) for _ in "xy"]
    else:
        fn, inputs = make_case(name, "cpu", torch.float64)
    ops = compiled_graph_ops(fn, inputs)
    assert ops, "no graph was captured"
    assert not {
        op for op in ops if op.startswith(("aten.diagonal_scatter", "aten.diagonal_backward"))
    }


#: The ops that ``torch.compile(dynamic=True)`` does not take on PyTorch 2.13: inductor stops
#: with a value-range error on the symbolic sizes of hub leaves over ragged trees (the
#: forest's own levels, where every block width is symbolic too).
NOT_DYNAMIC = {"hsa-lifted-ragged"}


@pytest.mark.slow
@opt_in
@pytest.mark.parametrize("name", [op for op in OPS if op not in NOT_DYNAMIC])
def test_compiled_with_dynamic_shapes_matches_eager(name, tmp_path, monkeypatch):
    """With every size symbolic (``dynamic=True``) the compiled op and its gradients equal
    eager ones in float64 (a float default argument read first in an autograd function's
    backward once made the HSA ops fail to trace)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no kernels of other runs
    fn, inputs = make_case(name, "cpu", torch.float64)
    torch._dynamo.reset()
    out, grads = run_with_grads(torch.compile(fn, dynamic=True), inputs)
    ref, ref_grads = run_with_grads(fn, inputs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-10)


if __name__ == "__main__":  # the graph-break table of the README
    for op in OPS:
        found = graph_breaks(*make_case(op, "cpu", torch.float32))
        print(f"{op}: {len(found)} breaks", *sorted(set(found)), sep="\n    ")
