"""Strictly causal HSA over equal-fanout forests (reshaped views) against the edge-list op
and the dense causal reference."""

import math
import os

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_forest, window_hierarchy
from hiergraph.ops import causal_hierarchical_attention, causal_hierarchical_attention_matrix
from hiergraph.ops.hsa import causal, family_fused, family_products
from hiergraph.ops.hsa.causal_uniform import _prefix_offsets
from hiergraph.ops.hsa.heads_first import family_layout, heads_first
from hiergraph.ops.hsa.uniform import bottom_up, counts_below
from tests.conftest import spy_calls

F64 = dict(dtype=torch.float64)
SHAPES = [(3, 32, (4, 8)), (2, 48, (4, 3, 4)), (1, 8, (8,)), (2, 24, (2, 3, 2, 2))]


def _case(batch, length, branching, seed, heads=3):
    gen = torch.Generator().manual_seed(seed)
    tree = window_forest([length] * batch, branching)
    q, k, v = (torch.randn(batch * length, heads, 5, generator=gen, **F64) for _ in range(3))
    pos = torch.randn(tree.num_nodes, heads, 2, generator=gen, **F64)
    return tree, q, k, v, pos


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("with_pos", [False, True])
def test_equals_the_edge_list_op_with_gradients(shape, with_pos):
    tree, q, k, v, pos = _case(*shape, seed=len(shape[2]))
    plan = tree.causal_plan()
    assert plan.tree_index.uniform is not None  # the reshaped path runs
    pos = pos if with_pos else None
    inputs = [t.requires_grad_() for t in (q, k, v)]
    fast = causal_hierarchical_attention(q, k, v, plan, pos_emb=pos)
    slow = causal_hierarchical_attention(q, k, v, plan, pos_emb=pos, kernel="edge")
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    grads = [torch.autograd.grad(out.pow(2).sum(), inputs) for out in (fast, slow)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_equals_the_dense_reference():
    tree, q, k, v, pos = _case(2, 24, (2, 3, 4), seed=3)
    out = causal_hierarchical_attention(q, k, v, tree, pos_emb=pos)
    theta = causal_hierarchical_attention_matrix(q, k, tree, pos_emb=pos)
    ref = torch.einsum("hij,jhd->ihd", theta, v)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_earlier_rows_are_bit_identical_when_later_tokens_change():
    tree, q, k, v, pos = _case(1, 48, (4, 3, 4), seed=4)
    out = causal_hierarchical_attention(q, k, v, tree, pos_emb=pos)
    gen = torch.Generator().manual_seed(5)
    for i in (0, 3, 11, 30, 46):
        q2, k2, v2 = (t.clone() for t in (q, k, v))
        for t in (q2, k2, v2):
            t[i + 1 :] = torch.randn(t[i + 1 :].shape, generator=gen, **F64)
        out2 = causal_hierarchical_attention(q2, k2, v2, tree, pos_emb=pos)
        assert torch.equal(out[: i + 1], out2[: i + 1])
        assert torch.isfinite(out2).all() and not torch.equal(out[i + 1 :], out2[i + 1 :])


@pytest.mark.parametrize("branching", [(4, 3, 4), (2, 3, 2, 2)], ids=str)
def test_leaf_prefixes_and_family_offsets_are_the_cumulative_sums_within_every_ancestor(
    branching,
):
    """Every leaf's prefix within its leaf family (``cumsum``) plus its family's offset is
    ``cumsum`` over the ancestor's whole run of leaves."""
    length = math.prod(branching)
    tree, q, k, v, _ = _case(2, length, branching, seed=7)
    fanout = tree.tree_index().uniform[1:]
    below = counts_below(None, fanout)
    leaves = [heads_first(t) for t in (q, k, v)]
    rho = [family_layout(t, fanout[-1]) for t in leaves]
    options = dict(include_self=False, left_only=True, size_bias=True)
    rhos = bottom_up(rho, below, fanout, None, 1.0, **options).rhos
    offsets = _prefix_offsets(rhos, fanout, below)
    within = family_layout(leaves[0], fanout[-1]).cumsum(2)  # [H, L / b, b, d]
    assert offsets[-1] is None
    for d in range(len(fanout) - 1):
        got = within if offsets[d] is None else within + offsets[d].unsqueeze(2)
        want = family_layout(leaves[0], below[d]).cumsum(2).flatten(1, 2)
        torch.testing.assert_close(got.flatten(1, 2), want, atol=1e-13, rtol=0)


def test_second_derivatives():
    tree, q, k, v, pos = _case(1, 12, (2, 3), seed=6, heads=2)  # shape (1, 2, 3, 2)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: causal_hierarchical_attention(q, k, v, tree, pos_emb=pos),
        tuple(t.requires_grad_() for t in (q, k, v)),
        fast_mode=True,
    )


def test_a_ragged_forest_takes_the_edge_list_path(monkeypatch):
    """Window trees of different lengths run padded (``tests/ops/hsa/test_padded.py``); a
    tree with leaves on several depths cannot keep its padding after its leaves."""
    tree = Batch.from_data_list(
        [from_nested([[0, 1, 2], [3, [4, 5]], 6]), window_hierarchy(28, (4, 8))]
    )
    index = tree.causal_plan().tree_index
    assert index.uniform is None and (index.padded is None or not index.padded.leaves_lead)

    def reshaped(*args):
        raise AssertionError("the reshaped path ran")

    monkeypatch.setattr(causal, "uniform_causal_attention", reshaped)
    q, k, v = (torch.randn(35, 2, 4, **F64) for _ in range(3))  # 7 + 28 leaves
    out = causal_hierarchical_attention(q, k, v, tree)
    ref = torch.einsum("hij,jhd->ihd", causal_hierarchical_attention_matrix(q, k, tree), v)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_the_edge_kernel_never_takes_the_reshaped_path(monkeypatch):
    tree, q, k, v, pos = _case(2, 16, (4, 4), seed=7)

    def reshaped(*args):
        raise AssertionError("kernel='edge' ran the reshaped path")

    monkeypatch.setattr(causal, "uniform_causal_attention", reshaped)
    assert torch.isfinite(causal_hierarchical_attention(q, k, v, tree, kernel="edge")).all()
    with pytest.raises(AssertionError, match="reshaped"):
        causal_hierarchical_attention(q, k, v, tree)
    with pytest.raises(ValueError, match="kernel must be"):
        causal_hierarchical_attention(q, k, v, tree, kernel="blocks")


def test_giant_families_take_the_edge_lists(monkeypatch):
    """Every leaf's prefix logits against its ancestor's family, [L, H, b] = 64 * 1 * 8
    elements here, must fit the block limit (or q.numel() = 320, if larger)."""

    def reshaped(*args):
        raise AssertionError("the reshaped path ran")

    monkeypatch.setattr(causal, "uniform_causal_attention", reshaped)
    tree, q, k, v, _ = _case(1, 64, (8, 8), seed=8, heads=1)
    monkeypatch.setattr("hiergraph.ops.hsa.family_dense.MAX_BLOCK_ELEMENTS", 511)
    assert torch.isfinite(causal_hierarchical_attention(q, k, v, tree)).all()
    monkeypatch.setattr("hiergraph.ops.hsa.family_dense.MAX_BLOCK_ELEMENTS", 512)
    with pytest.raises(AssertionError, match="reshaped path ran"):
        causal_hierarchical_attention(q, k, v, tree)


def _compiled_and_eager_gradients(lengths, branching, dynamic):
    """Gradients of ``q, k, v`` (float64) of the strictly causal op over window trees of
    ``lengths``, compiled by inductor and eagerly: ``[(compiled, eager)]`` per input."""
    forest = window_forest(lengths, branching)
    plan = forest.causal_plan()
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(sum(lengths), 2, 8, generator=gen, **F64).requires_grad_() for _ in range(3)]
    torch._dynamo.reset()
    compiled = torch.compile(causal_hierarchical_attention, dynamic=dynamic)
    grads = []
    for fn in (compiled, causal_hierarchical_attention):
        out = fn(*qkv, plan)
        grads.append(torch.autograd.grad(out.square().sum(), qkv))
    return list(zip(*grads, strict=True))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
@pytest.mark.parametrize(
    "lengths, branching, dynamic",
    [([128], (4, 4), False), ([64, 64, 64, 64], (4, 4), False), ([37, 20, 64, 50], (4, 4), True)],
)
def test_compiled_training_gradients(lengths, branching, dynamic):
    """Compiled by inductor, the strictly causal op's gradients equal eager ones: on a tree
    of depth 3 with 8 top children (static shapes) and on padded forests (dynamic shapes)
    they once missed the share of the leaves' self energies (a diagonal view's gradient:
    see ``tests/ops/test_gpu_path.py::test_compiled_graphs_scatter_no_diagonal``)."""
    for compiled, eager in _compiled_and_eager_gradients(lengths, branching, dynamic):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("pos", ["none", "per-head", "shared"])
def test_wide_leaf_families_in_the_fused_kernel_equal_the_edge_list_op(shape, pos, monkeypatch):
    """Leaf families counted as wide (``WIDE_LEFT_LEAVES`` lowered to 2) run in the fused
    attention kernel: outputs, gradients and second derivatives equal the edge-list op's
    (float64)."""
    tree, q, k, v, pe = _case(*shape, seed=9)
    pe = {"none": None, "per-head": pe, "shared": pe[:, :1]}[pos]
    inputs = [t.requires_grad_() for t in (q, k, v) + (() if pe is None else (pe,))]

    def derivatives(kernel):
        out = causal_hierarchical_attention(q, k, v, tree, pos_emb=pe, kernel=kernel)
        first = torch.autograd.grad(out.sin().sum(), inputs, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), inputs)
        return [out, *first, *second]

    ref = derivatives("edge")
    monkeypatch.setattr(family_fused, "WIDE_LEFT_LEAVES", 2)
    calls = spy_calls(monkeypatch, family_fused, "leaf_family_attention")
    for got, want in zip(derivatives("dense"), ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)
    assert len(calls) == 1


@pytest.mark.parametrize("leaves,fused", [(255, False), (256, True)])
def test_wide_leaf_families_run_in_the_fused_kernel(leaves, fused, monkeypatch):
    tree = Batch.from_data_list([from_nested(list(range(leaves)))] * 2)
    q, k, v = (torch.randn(2 * leaves, 2, 8) for _ in range(3))
    calls = spy_calls(monkeypatch, family_fused, "leaf_family_attention")
    causal_hierarchical_attention(q, k, v, tree)
    assert bool(calls) == fused == (leaves >= family_fused.WIDE_LEFT_LEAVES)


@pytest.mark.parametrize("branching", [(2, 4), (256,)], ids=["pairs", "wide"])
def test_off_the_cpu_leaf_families_take_the_batched_products(branching, monkeypatch):
    """Off the CPU (the ``meta`` device: shapes only) leaf families of two and wide ones
    run on the batched products, not the CPU's pair passes or its fused attention kernel,
    forward and backward in the CPU's shapes."""
    plan = window_forest([512, 512], branching).causal_plan()
    assert plan.tree_index.uniform is not None
    fused = spy_calls(monkeypatch, family_fused, "leaf_family_attention")
    pairs = spy_calls(monkeypatch, family_products, "pair_member")
    q, k, v = (torch.empty(1024, 2, c, device="meta", requires_grad=True) for c in (8, 8, 4))
    out = causal_hierarchical_attention(q, k, v, plan.to("meta"))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert out.shape == (1024, 2, 4) and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert fused == [] and pairs == []
