"""VCC segment tree (Alg. 1 and 2): structure, state, selection, update (Zeng et al. §3.4,
App. 6.3)."""

import pytest
import torch

from hiergraph.data import window_hierarchy
from hiergraph.ops.vcc.segment_tree import (
    SegmentTree,
    build_tree_state,
    expand_to_children,
    full_tree_branching,
    materialize,
    select_segments,
    two_resolution_budgets,
    update_tree,
)

PTR = torch.tensor([0, 10, 10, 37, 38])  # lengths 10, 0 (all VIP), 27, 1


def _tokens(ptr=PTR, d=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(int(ptr[-1]), d, generator=gen, dtype=torch.float64)


def _first_dim_score(mean, batch, count):
    return mean[:, 0]


def test_structure_is_window_hierarchy():
    n, branching = 37, (4, 2)
    tree = SegmentTree.from_ptr(torch.tensor([0, n]), branching)
    hierarchy = window_hierarchy(n, branching)
    offsets = [0]
    for level in range(tree.num_levels + 1):
        offsets.append(offsets[-1] + tree.batch[level].numel())
    parent = torch.cat(
        [tree.parent[lvl] + offsets[lvl + 1] for lvl in range(tree.num_levels)]
        + [torch.tensor([offsets[-2]])]
    )
    assert torch.equal(parent, hierarchy.parent)
    assert tree.count[1].tolist() == [4] * 9 + [1]
    assert tree.count[2].tolist() == [8] * 4 + [5]


def test_state_round_trip_and_means():
    x = _tokens()
    tree = SegmentTree.from_ptr(PTR, (3, 2))
    state = build_tree_state(x, tree)
    torch.testing.assert_close(materialize(state, tree), x, rtol=0, atol=1e-14)
    for b, (lo, hi) in enumerate(zip(PTR[:-1].tolist(), PTR[1:].tolist(), strict=True)):
        if hi > lo:
            root = state.root[tree.batch[-1] == b][0]
            torch.testing.assert_close(root, x[lo:hi].mean(0))
    # level-2 means recovered top-down are exact segment means (short last segments included)
    means2 = expand_to_children(state.root, tree.child_ptr[3]) - state.delta[2]
    for i in range(tree.batch[2].numel()):
        lo, size = int(tree.start[2][i]), int(tree.count[2][i])
        torch.testing.assert_close(means2[i], x[lo : lo + size].mean(0))


@pytest.mark.parametrize(
    "branching, budgets", [((3, 2), (None, 1, 2)), ((4,), (None, 2)), ((2, 2, 2), (1, 1, 1, 1))]
)
def test_selection_is_a_partition_with_segment_means(branching, budgets):
    x = _tokens()
    tree = SegmentTree.from_ptr(PTR, branching)
    sel = select_segments(build_tree_state(x, tree), tree, budgets, _first_dim_score)
    assert torch.equal(sel.start, torch.cat([sel.count.new_zeros(1), sel.count.cumsum(0)[:-1]]))
    assert int(sel.count.sum()) == x.size(0)
    assert torch.equal(sel.ptr.diff(), torch.bincount(sel.batch, minlength=4))
    for i in range(sel.count.numel()):
        lo, size = int(sel.start[i]), int(sel.count[i])
        torch.testing.assert_close(sel.value[i], x[lo : lo + size].mean(0))
        assert PTR[sel.batch[i]] <= lo and lo + size <= PTR[sel.batch[i] + 1]


def test_budget_counts():
    # k-ary tree over n_c = k^L tokens: |J| = 1 + (k - 1) * sum(h_s)
    k, levels = 3, 3
    ptr = torch.tensor([0, k**levels])
    tree = SegmentTree.from_ptr(ptr, (k,) * levels)
    budgets = (1, 1, 2, 3)  # root (unary), then h_s per level
    sel = select_segments(build_tree_state(_tokens(ptr), tree), tree, budgets, _first_dim_score)
    assert sel.count.numel() == 1 + (k - 1) * (1 + 2 + 3)
    # two resolutions: r - n_p = n_c / k + h (k - 1)
    k, h, n_c = 4, 3, 32
    tree = SegmentTree.from_ptr(torch.tensor([0, n_c]), (k,))
    state = build_tree_state(_tokens(torch.tensor([0, n_c])), tree)
    sel = select_segments(state, tree, two_resolution_budgets(h), _first_dim_score)
    assert sel.count.numel() == n_c // k + h * (k - 1)
    assert full_tree_branching(27, 3) == (3, 3, 3) and full_tree_branching(28, 3) == (3,) * 4


def test_selection_takes_top_scores_per_sequence_and_batches():
    x = _tokens()
    tree = SegmentTree.from_ptr(PTR, (4,))
    state = build_tree_state(x, tree)
    sel = select_segments(state, tree, (None, 2), _first_dim_score)
    means = expand_to_children(state.root, tree.child_ptr[2]) - state.delta[1]
    for b in range(4):
        blocks = (tree.batch[1] == b).nonzero().squeeze(1)
        top = blocks[torch.argsort(means[blocks, 0], descending=True)[:2]]
        assert torch.equal(
            sel.split[0].sort().values[torch.isin(sel.split[0], blocks)], top.sort().values
        )
    # one sequence alone selects the same segments as inside the batch
    lo, hi = int(PTR[2]), int(PTR[3])
    alone = SegmentTree.from_ptr(torch.tensor([0, hi - lo]), (4,))
    sel_alone = select_segments(
        build_tree_state(x[lo:hi], alone), alone, (None, 2), _first_dim_score
    )
    in_batch = sel.batch == 2
    assert torch.equal(sel.start[in_batch] - lo, sel_alone.start)
    torch.testing.assert_close(sel.value[in_batch], sel_alone.value)


def test_ties_are_deterministic():
    x = torch.zeros(16, 2, dtype=torch.float64)
    tree = SegmentTree.from_ptr(torch.tensor([0, 16]), (4,))
    sel = select_segments(build_tree_state(x, tree), tree, (None, 2), _first_dim_score)
    assert sel.split[0].tolist() == [0, 1]  # equal scores: lower index first


@pytest.mark.parametrize("branching, budgets", [((3, 2), (None, 1, 2)), ((4,), (None, 2))])
def test_update_is_explicit_decompression(branching, budgets):
    """Alg. 2 == X + S_c^dagger (Y - S_c C); Claim 6.4 (uniform shift) and 6.5 (means)."""
    x = _tokens()
    tree = SegmentTree.from_ptr(PTR, branching)
    state = build_tree_state(x, tree)
    sel = select_segments(state, tree, budgets, _first_dim_score)
    new_rows = sel.value + torch.randn_like(sel.value)
    new_state = update_tree(state, tree, sel, new_rows)
    update = (new_rows - sel.value)[sel.token_to_row]
    torch.testing.assert_close(materialize(new_state, tree), x + update, rtol=0, atol=1e-13)
    # the stored tree equals the tree rebuilt from the new tokens
    rebuilt = build_tree_state(x + update, tree)
    torch.testing.assert_close(new_state.root, rebuilt.root)
    for ours, ref in zip(new_state.delta, rebuilt.delta, strict=True):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-13)
    # deviations of tokens inside unrefined segments are untouched (Claim 6.4)
    coarse = sel.count[sel.token_to_row] > 1
    assert torch.equal(new_state.delta[0][coarse], state.delta[0][coarse])
    # Claim 6.5: the segment means of the new tokens are the new rows
    from torch_geometric.utils import segment

    torch.testing.assert_close(segment(x + update, sel.token_ptr, reduce="mean"), new_rows)


def test_update_touches_only_selected_paths():
    x = _tokens(torch.tensor([0, 64]))
    tree = SegmentTree.from_ptr(torch.tensor([0, 64]), (4, 4))
    state = build_tree_state(x, tree)
    sel = select_segments(state, tree, (None, 1, 1), _first_dim_score)
    new_state = update_tree(state, tree, sel, sel.value + 1.0)
    changed = [
        (a != b).any(1).sum().item() for a, b in zip(new_state.delta, state.delta, strict=True)
    ]
    assert changed[0] <= 4 and changed[1] <= 4 + 3 and changed[2] <= 4  # O(r) nodes


def test_gradients_of_the_tree_path():
    """Gradients through build, Alg. 1, Alg. 2 and materialise == those of X + S^+ f(S X)."""
    tree = SegmentTree.from_ptr(PTR, (3, 2))
    weight = torch.randn(38, 3, dtype=torch.float64)
    x = _tokens().requires_grad_()
    state = build_tree_state(x, tree)
    sel = select_segments(state, tree, (None, 1, 1), _first_dim_score)
    new = update_tree(state, tree, sel, sel.value.tanh() * 2)
    (grad,) = torch.autograd.grad((materialize(new, tree) * weight).sum(), x)
    s_c = torch.zeros(sel.count.numel(), 38, dtype=torch.float64)
    s_c[sel.token_to_row, torch.arange(38)] = 1.0 / sel.count[sel.token_to_row].double()
    sx = s_c @ x
    ref = x + (s_c.T * sel.count.double()) @ (sx.tanh() * 2 - sx)
    (grad_ref,) = torch.autograd.grad((ref * weight).sum(), x)
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-12)
    y = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    ptr = torch.tensor([0, 2, 2, 5, 9, 10])
    assert torch.autograd.gradcheck(lambda y: expand_to_children(y, ptr), (y,))


def test_bad_inputs():
    with pytest.raises(ValueError, match="branching"):
        SegmentTree.from_ptr(PTR, (1,))
    with pytest.raises(ValueError, match="non-decreasing"):
        SegmentTree.from_ptr(torch.tensor([0, 5, 3]), (2,))
    with pytest.raises(ValueError, match="int64"):
        SegmentTree.from_ptr(torch.tensor([0.0, 5.0]), (2,))
    tree = SegmentTree.from_ptr(PTR, (4,))
    with pytest.raises(ValueError, match="tree's tokens"):
        build_tree_state(torch.zeros(5, 2), tree)
    state = build_tree_state(_tokens(), tree)
    with pytest.raises(ValueError, match="2 entries"):
        select_segments(state, tree, (None, 1, 1), _first_dim_score)
    with pytest.raises(ValueError, match="int >= 0"):
        select_segments(state, tree, (None, -1), _first_dim_score)
    with pytest.raises(ValueError, match="score_fn is required"):
        select_segments(state, tree, (None, 1))
    sel = select_segments(state, tree, (None, 0))
    with pytest.raises(ValueError, match="selection's shape"):
        update_tree(state, tree, sel, sel.value[:-1])
    # a score of another shape than the candidates' (an IndexError deep inside)
    for score_fn in (lambda m, b, c: m.sum(), lambda m, b, c: m, lambda m, b, c: 1.0):
        with pytest.raises(ValueError, match=r"score_fn must return one score per candidate"):
            select_segments(state, tree, (None, 1), score_fn)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_update_weighs_counts_in_float32(dtype):
    """Alg. 2 on half inputs: the size-weighted means of refined nodes (segments of 3000
    and 65536 tokens, counts past fp16's 65504) are taken in float32 and rounded once, so
    the update matches the float32 one within half rounding."""
    ptr = torch.tensor([0, 3000, 73000])
    tree = SegmentTree.from_ptr(ptr, (16, 16, 16, 16))
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(73000, 2, generator=gen) + 0.5).to(dtype)
    state = build_tree_state(x, tree)
    sel = select_segments(state, tree, (None, 2, 2, 2, 2), _first_dim_score)
    assert int(tree.count[4].max()) == 65536 and int(sel.count.max()) >= 3000
    value = sel.value + torch.rand(sel.value.shape, generator=gen).to(dtype)
    out = update_tree(state, tree, sel, value)
    ref = update_tree(build_tree_state(x.float(), tree), tree, sel, value.float())
    assert out.root.dtype == dtype
    torch.testing.assert_close(out.root.float(), ref.root, rtol=8e-3, atol=0)
    for ours, full in zip(out.delta, ref.delta, strict=True):
        torch.testing.assert_close(ours.float(), full, rtol=0, atol=0.02)
