"""The causal plan: a view of the tree index, checked against a walk of the tree."""

import random

import pytest
import torch
from torch_geometric.data import Batch, Data

from hiergraph.data import from_nested
from hiergraph.plan import CausalPlan, TreeIndex
from tests.conftest import random_spec


def _reading_order(spec, counter=None):
    """``spec`` with its leaves renumbered left to right (a depth-first leaf order)."""
    counter = counter if counter is not None else iter(range(10**6))
    if isinstance(spec, list):
        return [_reading_order(child, counter) for child in spec]
    return next(counter)


@pytest.mark.parametrize("seed", range(4))
def test_fields_match_a_walk_of_the_tree(seed):
    rng = random.Random(seed)
    trees = [from_nested(_reading_order(random_spec(rng, rng.randint(1, 25)))) for _ in range(3)]
    h = Batch.from_data_list(trees)
    plan = h.causal_plan()
    parent, slot, depth = h.parent.tolist(), h.slot.tolist(), h.depth.tolist()
    leaves = h.is_leaf.nonzero().view(-1).tolist()
    below = {node: [] for node in range(h.num_nodes)}  # leaf positions below every node
    for i, leaf in enumerate(leaves):
        node = leaf
        assert plan.ancestors[i, depth[leaf] + 1 :].eq(-1).all()
        while True:
            assert plan.ancestors[i, depth[node]] == node
            below[node].append(i)
            if parent[node] == node:
                break
            node = parent[node]
    for node, rows in below.items():
        assert (plan.first_leaf[node], plan.last_leaf[node]) == (min(rows), max(rows))
        assert plan.count[node] == len(rows)
        siblings = [c for c in range(h.num_nodes) if c != parent[c] == parent[node] != node]
        assert plan.sibling_rank[node] == sum(slot[c] < slot[node] for c in siblings)
    left = {(c, s) for c in range(h.num_nodes) for s in range(h.num_nodes)
            if c != parent[c] == parent[s] != s and slot[s] < slot[c]}  # fmt: skip
    assert set(zip(plan.sib_query.tolist(), plan.sib_key.tolist(), strict=True)) == left
    assert plan.leaf_node.tolist() == leaves
    assert plan.leaf_depth.tolist() == [depth[leaf] for leaf in leaves]


def test_rank_is_the_old_name_of_sibling_rank():
    """``TreeIndex.rank`` is a breadth-first position; the plan's place among siblings is
    ``sibling_rank``, and its old name ``rank`` still reads it, with a FutureWarning."""
    plan = from_nested([[0, 1], [2, [3, 4]], 5]).causal_plan()
    with pytest.warns(FutureWarning, match="CausalPlan.rank is now called sibling_rank"):
        assert plan.rank is plan.sibling_rank


def test_is_a_cached_view_of_the_tree_index():
    h = from_nested([[0, 1], [2, [3, 4]], 5])
    index = h.tree_index()
    plan = h.causal_plan()
    assert plan is index.causal_plan is CausalPlan.of(index) is CausalPlan.of(h)
    assert plan.tree_index is index
    fresh = CausalPlan.from_hierarchy(h)
    assert fresh is not plan and torch.equal(fresh.ancestors, plan.ancestors)


def test_moves_with_the_tree_index():
    index = from_nested([[0, 1], [2, 3, 4]]).tree_index()
    plan = index.causal_plan
    moved = index.to("cpu")
    assert "causal_plan" in moved.__dict__  # carried along, not rebuilt on first use
    assert moved.causal_plan is not plan and moved.causal_plan.tree_index is moved
    assert torch.equal(moved.causal_plan.count, plan.count)


def test_a_leaf_order_that_is_not_depth_first_is_refused():
    with pytest.raises(ValueError, match="depth-first order"):
        from_nested([[0, 2], [1, 3]]).causal_plan()
    with pytest.raises(TypeError, match="no 'parent' attribute"):
        CausalPlan.from_hierarchy(object())
    # what TreeIndex.of refuses, CausalPlan.of refuses (it built an uncached plan of any
    # object with parent, slot and is_leaf, which the bidirectional op refused)
    tree = Data(parent=torch.tensor([1, 1]), slot=torch.zeros(2, dtype=torch.long),
                is_leaf=torch.tensor([True, False]))  # fmt: skip
    for hierarchy in (object(), tree):
        with pytest.raises(TypeError, match="hierarchy must be a SignalHierarchy"):
            CausalPlan.of(hierarchy)


def test_the_plan_of_an_empty_forest():
    """(Its level sizes, an empty list, made a float tensor: repeat_interleave failed.)"""
    empty = torch.zeros(0, dtype=torch.long)
    plan = TreeIndex.from_parent(empty, empty, empty.bool()).causal_plan
    assert plan.num_nodes == 0 and plan.num_leaves == 0 and plan.ancestors.shape == (0, 1)
