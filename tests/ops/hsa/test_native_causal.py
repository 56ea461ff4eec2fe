"""The compiled kernel of strictly causal HSA over any forest
(:func:`hiergraph.ops.hsa.native.causal_forest_attention`) against the edge lists on PyTorch
operations and the dense reference, and where it runs."""

import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, random_window_hierarchy, window_forest
from hiergraph.ops import causal_hierarchical_attention, causal_hierarchical_attention_matrix
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal import _edge_attention
from hiergraph.plan import CausalPlan
from tests.conftest import assert_same_nans, hsa_kernel, spy_calls, with_nan
from tests.ops.hsa.test_causal import ordered_spec


@pytest.fixture(autouse=True)
def kernel():
    hsa_kernel()


def forest(seed: int) -> Batch:
    """Mixed-depth random trees in reading order (only children, leaves at every depth), a
    single leaf, a chain and ragged window trees, batched."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = [from_nested(ordered_spec(rng, n)) for n in (9, 1, 17, 4)]
    trees.append(from_nested([[[0]], [1, [[2]]]]))
    trees += [random_window_hierarchy(n, (4, 3), generator=gen) for n in (40, 7)]
    return Batch.from_data_list(trees)


def inputs(num_leaves, num_nodes, heads, with_eps, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(num_leaves, heads, c, generator=gen, dtype=dtype).requires_grad_()
        for c in (4, 4, 5)
    )
    eps = None
    if with_eps:
        eps = torch.randn(num_nodes, heads, 3, generator=gen, dtype=dtype).requires_grad_()
    return q, k, v, eps


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("with_eps", [False, True], ids=["no-eps", "eps"])
@pytest.mark.parametrize("heads", [1, 3])
def test_equals_the_edge_lists_with_gradients(seed, with_eps, heads):
    batch = forest(seed)
    plan = CausalPlan.of(batch)
    q, k, v, eps = inputs(plan.num_leaves, plan.num_nodes, heads, with_eps, seed=seed)
    out = native.causal_forest_attention(q, k, v, eps, plan, tau=0.6, recorded=None)
    ref = _edge_attention(q, k, v, plan, eps, 0.6)[0]
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    wanted = [t for t in (q, k, v, eps) if t is not None]
    grad = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, wanted, grad), torch.autograd.grad(ref, wanted, grad), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_a_nan_query_reaches_the_outputs_the_edge_lists_give_it():
    """A NaN in one leaf's query makes NaN the outputs it makes NaN on the edge lists (its
    own, and the later leaves whose prefixes hold it); the others are unchanged."""
    plan = CausalPlan.of(forest(0))
    q, k, v, _ = inputs(plan.num_leaves, plan.num_nodes, 2, False)
    q = with_nan(q, 39)  # in the window tree of 40 leaves, 34 .. 73
    out = native.causal_forest_attention(q, k, v, None, plan, tau=0.6, recorded=None)
    assert out[40:].isnan().any() and not out[:39].isnan().any()
    assert_same_nans(out, _edge_attention(q, k, v, plan, None, 0.6)[0], atol=1e-12, rtol=0)


def test_equals_the_dense_reference():
    tree = from_nested([[0, 1, [2, 3]], [4], [[5, 6], 7], 8])
    q, k, v, eps = inputs(9, tree.num_nodes, 2, True)
    out = causal_hierarchical_attention(q, k, v, tree, pos_emb=eps)
    theta = causal_hierarchical_attention_matrix(q, k, tree, pos_emb=eps)
    torch.testing.assert_close(out, torch.einsum("hij,jhd->ihd", theta, v), atol=1e-12, rtol=0)


def test_shared_embeddings_float32_and_second_derivatives():
    tree = from_nested([[0, [1, 2, 3]], [4], [5, 6]])  # first children, a unary node
    q, k, v, _ = inputs(7, tree.num_nodes, 2, False)
    shared = torch.randn(tree.num_nodes, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, e: causal_hierarchical_attention(q, k, v, tree, pos_emb=e),
        (q, k, v, shared),
    )
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: causal_hierarchical_attention(q, k, v, tree),
        (q, k, v),
        fast_mode=True,
    )
    ref = causal_hierarchical_attention(q, k, v, tree, pos_emb=shared)
    out = causal_hierarchical_attention(
        *(t.detach().float() for t in (q, k, v)), tree, pos_emb=shared.detach().float()
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["kernel", "position", "bfloat16", "edge", "off", "uniform"])
def test_where_the_kernel_runs(case, monkeypatch):
    """Ragged forests on the CPU take the kernel (bf16 inputs too: they run in float32)
    unless the edge lists are asked for or the kernel is off; equal-fanout ones and window
    forests padded after their leaves run as reshaped views."""
    calls = spy_calls(monkeypatch, native, "causal_forest_attention")
    batch = forest(1) if case != "uniform" else window_forest([16, 9, 12], (4, 2))
    plan = CausalPlan.of(batch)
    q, k, v, eps = inputs(plan.num_leaves, plan.num_nodes, 2, case == "position")
    options = dict(pos_emb=eps)
    if case == "bfloat16":
        q, k, v = (t.detach().bfloat16() for t in (q, k, v))
    if case == "edge":
        options["kernel"] = "edge"
    if case == "off":
        monkeypatch.setattr(native, "_enabled", False)
    causal_hierarchical_attention(q, k, v, batch, **options)
    assert len(calls) == (case in ("kernel", "position", "bfloat16"))


def test_the_kernel_checks_its_plan():
    plan = CausalPlan.of(forest(0))
    q, k, v, _ = inputs(plan.num_leaves, plan.num_nodes, 2, False)
    q, k, v = (t.detach() for t in (q, k, v))
    arrays = list(plan.breadth_first)
    trees = plan.tree_index.level_ptr[1]
    ext = native.extension()
    ext.causal_forward(q, k, v, None, *arrays, trees, 0.5)  # consistent: runs
    path, depth, pair_ptr, first, last, count, rank, node = arrays
    broken = {
        0: torch.where(path == 3, 10**6, path),
        2: pair_ptr + 1,
        3: first.flip(0),
        5: count + 1,
        7: node - 1,
    }
    for i, bad in broken.items():
        args = [*arrays[:i], bad, *arrays[i + 1 :]]
        with pytest.raises(RuntimeError, match="inconsistent|must"):
            ext.causal_forward(q, k, v, None, *args, trees, 0.5)
    with pytest.raises(RuntimeError, match="inconsistent"):
        ext.causal_forward(q, k, v, None, *arrays, trees - 1, 0.5)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ext.causal_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, *arrays, trees, 0.5)
