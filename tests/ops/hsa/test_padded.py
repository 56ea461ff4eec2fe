"""HSA on a forest embedded in an equal-fanout forest == HSA on the forest itself."""

import math

import pytest
import torch
from torch_geometric.data import Batch

import hiergraph.ops.hsa.attention as hsa_attention
import hiergraph.ops.hsa.causal as hsa_causal
from hiergraph.data import from_nested, random_window_hierarchy, window_forest, window_hierarchy
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.inputs import head_pos_emb
from hiergraph.ops.hsa.padded import padded_hierarchical_attention
from hiergraph.plan import padded_forest
from hiergraph.plan.costs import KERNEL_PADDING_COST, PADDING_COST
from hiergraph.plan.padded_forest import PaddedForest
from tests.conftest import hsa_kernel, spy_calls
from tests.ops.hsa.test_uniform import F64, OPTIONS, _kwargs


def _forests():
    gen = torch.Generator().manual_seed(0)
    return {
        # different lengths: partial last families, and short trees with fewer levels
        "windows": window_forest([37, 5, 64, 20, 2], (4, 4)),
        # leaves on three depths, families of 1 to 4
        "nested": Batch.from_data_list(
            [from_nested([[0, 1, 2], [3, [4, 5]], 6]), from_nested([[0, [1, 2, 3, 4]], 5])]
        ),
        "ragged": Batch.from_data_list(
            [random_window_hierarchy(n, (3, 2), generator=gen) for n in (14, 9, 20)]
        ),
    }


def _inputs(tree, seed, heads=3, dim=5):
    gen = torch.Generator().manual_seed(seed)
    leaves = int(tree.is_leaf.sum())
    qkv = [torch.randn(leaves, heads, dim, generator=gen, **F64) for _ in range(3)]
    mask = torch.rand(leaves, generator=gen) > 0.3
    pos = torch.randn(tree.num_nodes, heads, 2, generator=gen, **F64)
    return qkv, mask, pos


def _assert_same_with_gradients(out, ref, inputs):
    """``out == ref`` and so are the gradients of ``sum(out^2)`` w.r.t. ``inputs`` (1e-12)."""
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    for a, b in zip(
        torch.autograd.grad(out.pow(2).sum(), inputs),
        torch.autograd.grad(ref.pow(2).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["windows", "nested", "ragged"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_equals_block_kernel_with_gradients(name, opts):
    tree = _forests()[name]
    index = tree.tree_index()
    forest = PaddedForest.from_tree_index(index, max_padding=math.inf)
    (q, k, v), mask, pos = _inputs(tree, seed=len(str(opts)))
    kw = _kwargs(opts, mask, pos)
    inputs = [q, k, v, pos] if opts["pos"] else [q, k, v]
    for t in inputs:
        t.requires_grad_()
    blocks = hierarchical_attention(q, k, v, index, kernel="blocks", **kw)
    padded = padded_hierarchical_attention(
        q,
        k,
        v,
        index,
        forest,
        None if kw["pos_emb"] is None else head_pos_emb(kw["pos_emb"], q, index.num_nodes),
        include_self=kw["include_self"],
        left_only=kw["leaky_causal"],
        leaf_mask=kw["leaf_mask"],
        tau=q.size(-1) ** -0.5,
        size_bias=kw["size_bias"],
    )
    _assert_same_with_gradients(padded, blocks, inputs)


def test_embedding_structure():
    tree = _forests()["nested"]
    index = tree.tree_index()
    forest = PaddedForest.from_tree_index(index, max_padding=math.inf)
    assert forest.shape == (2, 3, 3, 4) and forest.num_slots == 72
    # every leaf has its own slot; the slots are the real ones
    assert forest.leaf_slot.unique().numel() == index.num_leaves == int(forest.real.sum())
    assert forest.real[forest.leaf_slot].all()
    # leaf 6 of the first tree is its root's third child: a chain of only children below it
    assert forest.leaf_slot[6] == 2 * 3 * 4
    depth1, depth2, depth3 = forest.node_source
    assert (depth1 >= 0).sum() == 5  # the 3 + 2 children of the roots
    assert depth2[2 * 3] == depth3[2 * 3 * 4] == depth1[2]  # the chain stands for the leaf
    assert (depth3 >= 0).sum() == index.num_leaves


def test_which_forests_are_embedded_and_when_it_pays():
    assert window_forest([64] * 4, (4, 4)).tree_index().padded is None  # already uniform
    assert window_hierarchy(1, (4,)).tree_index().padded is None  # a tree that is a leaf
    assert from_nested([[0], [1]]).tree_index().padded is None  # only children everywhere
    too_ragged = window_forest([6000] + [10] * 20, (4, 4))  # 21 x 6,000 slots, 6,200 leaves
    assert too_ragged.tree_index().padded is None
    padded = window_forest([37, 5, 64, 20], (4, 4)).tree_index().padded
    assert padded.num_slots == 4 * 4 * 4 * 4 and padded.blocks > 0
    assert padded.pays_off(4, 128)
    assert not padded.pays_off(64, 4096)  # much work per leaf: the blocks cost little
    # twice the slots of the leaves, whose long runs of equal windows are slice blocks
    costly = window_forest([600, 10] * 8, (4, 4)).tree_index().padded  # 9,728 slots, 4,880 leaves
    assert costly is not None and not costly.pays_off(4, 128)


def test_more_padding_runs_on_the_embedding_off_the_cpu(monkeypatch):
    """A forest with 4 to 16 padded slots per leaf (up to ``ACCELERATOR_SLOTS`` slots) is
    embedded for accelerators only, where eager HSA is launch-bound and the embedding takes
    a fixed handful of operations per level: the CPU keeps its block kernel (and its cost
    model); another device takes the embedding while its slots cost less than the blocks
    (``ACCELERATOR_BLOCK_COST`` per block)."""
    index = window_forest([6000, 10, 10, 10, 10], (4, 4)).tree_index()  # 30,000 slots
    padded = index.padded
    assert 4 < padded.num_slots / index.num_leaves <= 16
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert index.padded_on(cpu) is None and index.padded_on(meta) is padded
    assert not padded.pays_off(4, 128) and padded.pays_off(4, 128, device=meta)
    q = torch.randn(index.num_leaves, 4, 64)
    assert hsa_attention.attention_path(q, q, q, index, None) != "padded"
    on_meta = q.to("meta")
    moved = index.to("meta")
    assert hsa_attention.attention_path(on_meta, on_meta, on_meta, moved, None) == "padded"
    # the strictly causal op and hubs keep the CPU's padding (no block kernel to beat there)
    plan = window_forest([600, 10, 10, 10, 10], (4, 4)).tree_index().causal_plan.to("meta")
    small = plan.tree_index
    assert small.padded.leaves_lead and 4 < small.padded.num_slots / small.num_leaves <= 16
    assert small.padded_on(meta) is not None and small.padded_on(meta, extended=False) is None
    slots = spy_calls(monkeypatch, hsa_causal, "on_slots")
    x = torch.empty(small.num_leaves, 1, 4, device="meta")
    causal_hierarchical_attention(x, x, x, plan)
    assert slots == []
    per_block = padded.num_slots / padded.blocks * 4 * 128 / (8 * 128)
    monkeypatch.setattr(padded_forest, "ACCELERATOR_BLOCK_COST", per_block)
    assert padded.pays_off(4, 128, device=meta)  # on the bound
    assert not padded.pays_off(4, 129, device=meta)  # more work per slot: the blocks
    monkeypatch.setattr(padded_forest, "ACCELERATOR_SLOTS", padded.num_slots - 1)
    assert window_forest([6000, 10, 10, 10, 10], (4, 4)).tree_index().padded is None


def test_a_slot_costs_less_where_the_kernel_runs_it(monkeypatch):
    """The embedding of a padded batch of 2 x 2048 tokens pays off where the compiled CPU
    kernel runs it (float32, 2 trees x 4 heads), and not on PyTorch operations, whose slots
    cost more (:mod:`hiergraph.plan.costs`); leaky-causal keys never take the kernel."""
    hsa_kernel()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    index = window_forest([1700, 1100], (16, 8, 4, 4)).tree_index()
    padded = index.padded
    q, k, v = (torch.randn(2800, 4, 64) for _ in range(3))
    assert hsa_attention.padding_cost(q, k, v, padded, None, False) == KERNEL_PADDING_COST
    assert hsa_attention.padding_cost(q, k, v, padded, None, True) == PADDING_COST
    dtypes = (q.double(), k, v, padded, None, False)
    assert hsa_attention.padding_cost(*dtypes) == PADDING_COST
    # learned position embeddings of inputs without gradients: no kernel (as the op decides)
    pos = torch.randn(index.num_nodes, 1, 8, requires_grad=True)
    assert hsa_attention.padding_cost(q, k, v, padded, pos, False) == PADDING_COST
    assert hsa_attention.padding_cost(q, k, v, padded, pos.detach(), False) == KERNEL_PADDING_COST
    assert padded.pays_off(4, 128, KERNEL_PADDING_COST) and not padded.pays_off(4, 128)
    monkeypatch.setattr(native, "_enabled", False)
    assert hsa_attention.padding_cost(q, k, v, padded, None, False) == PADDING_COST


@pytest.mark.parametrize("case", ["masked", "torch-ops", "forest-kernel"])
def test_hierarchical_attention_takes_the_padded_path(case, monkeypatch):
    """Where the compiled forest kernel does not run (a leaf mask, the kernel off), a nearly
    equal forest runs padded; where it does, it runs the forest itself."""
    tree = window_forest([37, 5, 64, 20], (4, 4))
    index = tree.tree_index()
    (q, k, v), mask, _ = _inputs(tree, seed=0)
    if case == "torch-ops":
        monkeypatch.setattr(native, "_enabled", False)
    else:
        hsa_kernel()
    calls = []
    monkeypatch.setattr(
        hsa_attention,
        "padded_hierarchical_attention",
        lambda *a, **kw: calls.append(1) or padded_hierarchical_attention(*a, **kw),
    )
    options = dict(leaf_mask=mask if case == "masked" else None)
    out = hierarchical_attention(q, k, v, index, **options)
    assert calls == ([] if case == "forest-kernel" else [1])
    ref = hierarchical_attention(q, k, v, index, kernel="blocks", **options)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("heads_first", [False, True])
def test_output_layout_follows_the_inputs(heads_first, torch_ops):
    """On the padded path (here: the compiled kernels off) the output is heads first in
    memory when the inputs are (the forest kernel writes node-major rows)."""
    tree = window_forest([37, 5, 64, 20], (4, 4))
    (q, k, v), _, _ = _inputs(tree, seed=1)
    if heads_first:
        q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
    out = hierarchical_attention(q, k, v, tree)
    assert out.transpose(0, 1).is_contiguous() == heads_first
    assert out.is_contiguous() != heads_first


def test_the_embedding_moves_with_the_plan():
    index = window_forest([37, 5, 64, 20], (4, 4)).tree_index()
    built = index.padded
    moved = index.to("meta")
    assert moved.padded.leaf_slot.device.type == "meta" and moved.padded.shape == built.shape


def test_second_derivatives_match_the_edge_kernel():
    """The padded path is the reshaped-view path: differentiable twice on ragged forests."""
    tree = _forests()["windows"]
    assert tree.tree_index().padded.pays_off(3, 10)
    (q, k, v), _, _ = _inputs(tree, seed=3)
    q.requires_grad_()
    second = []
    for kernel in ("dense", "edge"):
        out = hierarchical_attention(q, k, v, tree, kernel=kernel, include_self=True)
        (grad,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
        second.append(torch.autograd.grad(grad.sin().sum(), q)[0])
    torch.testing.assert_close(second[0], second[1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("opts", [{}, {"include_self": True, "leaky_causal": True}])
def test_a_fully_masked_tree_stays_finite(opts):
    tree = window_forest([37, 5, 64, 20], (4, 4))
    (q, k, v), _, _ = _inputs(tree, seed=4)
    mask = torch.ones(q.size(0), dtype=torch.bool)
    mask[37:42] = False  # every leaf of the second tree
    q.requires_grad_()
    outs = [
        hierarchical_attention(q, k, v, tree, leaf_mask=mask, kernel=kernel, **opts)
        for kernel in ("dense", "blocks")
    ]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(outs[0].sum(), q)
    assert torch.isfinite(grad).all() and (outs[0][37:42] == 0).all()


def test_padding_after_every_trees_leaves_is_detected():
    assert window_forest([37, 20, 64, 50], (4, 4)).tree_index().padded.leaves_lead
    # trees of fewer levels sink below their roots (a chain of only children there): their
    # leaves stay together at the last level, first in their padded tree
    short = window_forest([37, 5, 64, 2], (4, 4)).tree_index()
    assert short.padded.leaves_lead and short.padded.shape == (4, 4, 4, 4)
    slots = short.padded.leaf_slot[37:42]  # the tree of 5 leaves: the first 5 of its 64
    assert (slots - slots[0]).tolist() == list(range(5)) and slots[0] % 64 == 0
    nested = PaddedForest.from_tree_index(_forests()["nested"].tree_index(), math.inf)
    assert not nested.leaves_lead  # leaves on several depths of one tree: chains below them


@pytest.mark.parametrize("lengths", [[37, 20, 64, 50], [37, 5, 64, 2]])
@pytest.mark.parametrize("with_pos", [False, True])
def test_causal_op_on_the_padded_forest_equals_its_edge_path(lengths, with_pos, monkeypatch):
    """Strictly causal rows never read the padding after their tree's leaves: the padded
    forest needs no mask (when the padding is not after the leaves, the edge path runs)."""
    import hiergraph.ops.hsa.causal as hsa_causal
    from hiergraph.ops import causal_hierarchical_attention

    tree = window_forest(lengths, (4, 4))
    (q, k, v), _, pos = _inputs(tree, seed=5)
    inputs = [q, k, v, pos] if with_pos else [q, k, v]
    for t in inputs:
        t.requires_grad_()
    calls, uniform = [], hsa_causal.uniform_causal_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return uniform(*args, **kwargs)

    monkeypatch.setattr(hsa_causal, "uniform_causal_attention", counted)
    kw = dict(pos_emb=pos if with_pos else None)
    fast = causal_hierarchical_attention(q, k, v, tree, **kw)
    assert len(calls) == tree.tree_index().padded.leaves_lead
    edges = causal_hierarchical_attention(q, k, v, tree, kernel="edge", **kw)
    _assert_same_with_gradients(fast, edges, inputs)
