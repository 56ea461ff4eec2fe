"""Hand-built structures with an inconsistent forest fail when their plan is built."""

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import (
    SignalHierarchy,
    from_nested,
    validate_structure,
    window_forest,
    window_hierarchy,
)
from hiergraph.ops import hierarchical_attention


def hand_built(parent, slot, is_leaf) -> SignalHierarchy:
    """A hierarchy made with the bare constructor, as a user might (no builder checks)."""
    as_tensor = lambda v, dtype: v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=dtype)  # noqa: E731
    h = SignalHierarchy(
        parent=as_tensor(parent, torch.long),
        slot=as_tensor(slot, torch.long),
        is_leaf=as_tensor(is_leaf, torch.bool),
    )
    h.num_nodes = len(parent)
    return h


# Node 3 is the root; 2 is an internal node under it; 0 and 1 are leaves under 2.
GOOD = ([2, 2, 3, 3], [0, 1, 0, 0], [True, True, False, False])


@pytest.mark.parametrize(
    "parent, slot, is_leaf, error, match",
    [
        # a node marked leaf that has children
        ([2, 2, 3, 3], [0, 1, 0, 0], [True, True, True, False], ValueError,
         r"node 2 is marked as a leaf .* has 2 children, e\.g\. node 0"),
        # a node marked internal without children
        ([3, 3, 3, 3], [0, 1, 2, 0], [True, True, False, False], ValueError,
         r"node 2 is marked as internal .* no children"),
        # parent out of range
        ([2, 7, 3, 3], [0, 1, 0, 0], [True, True, False, False], ValueError,
         r"parent ids must lie in \[0, 3\].*node 1 has parent 7"),
        ([2, -1, 3, 3], [0, 1, 0, 0], [True, True, False, False], ValueError,
         r"node 1 has parent -1"),
        # cycles: 1 -> 2 -> 1, reached from 0
        ([1, 2, 1, 3], [0, 0, 0, 0], [True, False, False, True], ValueError,
         r"cycle: node 0 never reaches a root \(0 -> 1 -> 2 -> 1\)"),
        # slots: negative, shared, wrong length, wrong dtype
        ([2, 2, 3, 3], [0, -4, 0, 0], [True, True, False, False], ValueError,
         r"slots must be >= 0.*node 1 has slot -4"),
        ([2, 2, 3, 3], [0, 1, 0], [True, True, False, False], ValueError,
         r"slot must have shape \[4\].*got \(3,\)"),
        ([2, 2, 3, 3], torch.tensor([0.0, 1.0, 0.0, 0.0]), [True, True, False, False],
         TypeError, r"slot must hold integer.*float32"),
        # parent of the wrong dtype / length, is_leaf not bool
        (torch.tensor([2.0, 2.0, 3.0, 3.0]), [0, 1, 0, 0], [True, True, False, False],
         TypeError, r"parent must hold integer.*float32"),
        ([2, 2, 3, 3], [0, 1, 0, 0], torch.tensor([1, 1, 0, 0]), TypeError,
         r"is_leaf must be a bool tensor.*int64"),
        ([2, 2, 3, 3], [0, 1, 0, 0], [True, True, False], ValueError,
         r"is_leaf must have shape \[4\]"),
    ],
)  # fmt: skip
def test_tree_index_rejects_an_inconsistent_hand_built_hierarchy(
    parent, slot, is_leaf, error, match
):
    h = hand_built(parent, slot, is_leaf)
    with pytest.raises(error, match=match):
        h.tree_index()
    with pytest.raises(error, match=match):  # and so does every op that plans with it
        q = torch.randn(2, 1, 3)
        hierarchical_attention(q, q, q, h)


def test_tree_index_names_missing_structure():
    h = SignalHierarchy(parent=torch.tensor([1, 1]), is_leaf=torch.tensor([True, False]))
    h.num_nodes = 2
    with pytest.raises(ValueError, match="missing: slot"):
        h.tree_index()


def test_validate_structure_rejects_siblings_sharing_a_slot():
    parent, slot = torch.tensor([2, 2, 3, 3]), torch.tensor([5, 5, 0, 0])
    is_leaf = torch.tensor(GOOD[2])
    with pytest.raises(ValueError, match=r"nodes 0 and 1 share a slot \(5\) under parent 2"):
        validate_structure(parent, slot, is_leaf)
    validate_structure(parent, slot, is_leaf, distinct_slots=False)
    with pytest.raises(ValueError, match="share a slot"):  # the builders insist on it
        SignalHierarchy.from_parent([-1, 0, 0, 1], slot=[0, 3, 3, 0])


def test_validate_structure_rejects_non_tensors_and_mixed_devices():
    with pytest.raises(TypeError, match="parent must be a torch.Tensor, got list"):
        validate_structure([0], torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.bool))
    parent = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="one device"):
        validate_structure(parent, parent.to("meta"), torch.ones(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="1-D"):
        validate_structure(parent.view(1, 1), parent, torch.ones(1, dtype=torch.bool))


def test_consistent_structures_pass_and_plan_as_before():
    validate_structure(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                       torch.zeros(0, dtype=torch.bool))  # fmt: skip
    h = hand_built(*GOOD)
    assert h.tree_index().num_leaves == 2
    one_node = hand_built([0], [0], [True])  # a lone root is a leaf
    assert one_node.tree_index().num_leaves == 1
    batch = Batch.from_data_list(
        [
            from_nested([[0, 1], [2, [3, 4]]]),
            window_hierarchy(9, (3,)),
            SignalHierarchy.from_parent([-1]),
        ]
    )
    for built in (batch, window_forest(torch.tensor([5, 1, 8]), (2, 2))):
        validate_structure(built.parent, built.slot, built.is_leaf)
        built.tree_index()


def _count_checks(monkeypatch) -> list:
    import hiergraph.data.signal_hierarchy as module

    calls, check = [], module.validate_structure
    monkeypatch.setattr(
        module, "validate_structure", lambda *a, **k: calls.append(1) or check(*a, **k)
    )
    return calls


def test_structure_is_validated_once_per_plan(monkeypatch):
    calls = _count_checks(monkeypatch)
    h = hand_built(*GOOD)
    q = torch.randn(2, 2, 4)
    for _ in range(3):
        hierarchical_attention(q, q, q, h)
    assert len(calls) == 1  # the plan is cached: no per-forward check
    h.slot = h.slot.clone()
    hierarchical_attention(q, q, q, h)
    assert len(calls) == 2
    h.is_leaf = torch.tensor([True, True, True, False])  # replaced after the plan was built
    h.slot = h.slot.clone()
    with pytest.raises(ValueError, match="node 2 is marked as a leaf"):
        hierarchical_attention(q, q, q, h)


def test_builder_output_is_not_checked_again(monkeypatch):
    """The builders' trees are consistent by construction: no second check when planned, and
    none per forward pass where a layer rebuilds its tree each time (hubs)."""
    from hiergraph.nn import HierarchicalSelfAttention

    calls = _count_checks(monkeypatch)
    h = window_hierarchy(12, (3, 2), x=torch.randn(12, 8))
    h.tree_index()
    from_nested([[0, 1], [2, [3, 4]]]).tree_index()
    assert calls == []
    attn = HierarchicalSelfAttention(8, heads=2, hubs=2)
    for _ in range(2):
        attn(h.x, h)
    assert calls == []
    h.parent[0] = h.parent[0]  # written in place: checked like a hand-built tree
    h.tree_index()
    assert len(calls) == 1


def test_builder_output_moved_to_another_device_is_not_checked_again(monkeypatch):
    """Moving a builder's tree keeps its mark (values are unchanged): no check on the
    device (where it would read values back to the host); a tree edited after the move is
    checked."""
    calls = _count_checks(monkeypatch)
    moved = window_forest(torch.tensor([5, 8]), (2, 2)).to("meta")
    moved._validate()  # the check tree_index() runs first (meta tensors hold no values)
    assert calls == []
    moved.slot = moved.slot.clone()
    with pytest.raises((NotImplementedError, RuntimeError)):  # checked: meta holds no values
        moved._validate()
    assert calls == [1]


def test_from_parent_reports_in_the_callers_node_ids():
    # node ids are the caller's (before from_parent renumbers leaves first)
    with pytest.raises(ValueError, match=r"node 1 is marked as a leaf .* children, e\.g\. node 3"):
        SignalHierarchy.from_parent([-1, 0, 0, 1], is_leaf=[False, True, True, True])
    with pytest.raises(ValueError, match=r"node 2 is marked as internal"):
        SignalHierarchy.from_parent([-1, 0, 0], is_leaf=[False, True, False])
    with pytest.raises(ValueError, match=r"is_leaf must have shape \[3\]"):
        SignalHierarchy.from_parent([-1, 0, 0], is_leaf=[False, True])
    with pytest.raises(ValueError, match=r"-1 marks the root\): node 2 has parent 9"):
        SignalHierarchy.from_parent([-1, 0, 9])
    with pytest.raises(ValueError, match=r"cycle: node 2 never reaches a root \(2 -> 3 -> 2\)"):
        SignalHierarchy.from_parent([-1, 0, 3, 2])
    with pytest.raises(ValueError, match=r"cycle: node 1 is its own parent"):
        SignalHierarchy.from_parent([-1, 1])
    with pytest.raises(ValueError, match=r"slot must have shape \[3\]"):
        SignalHierarchy.from_parent([-1, 0, 0], slot=[0, 1])


def test_siblings_sharing_a_slot_are_found_among_large_slots():
    """Nodes 1 and 3 share slot 4 under node 0. With a slot of 2**62 elsewhere, a combined
    key ``parent * (max slot + 1) + slot`` wraps so that node 2 (slot 0 under node 4) gets
    the same key and sorts between them, hiding the pair."""
    parent = torch.tensor([6, 0, 4, 0, 6, 4, 6])
    slot = torch.tensor([0, 4, 0, 4, 1, 2**62, 0])
    is_leaf = torch.tensor([False, True, True, True, False, True, False])
    with pytest.raises(ValueError, match="nodes 1 and 3 share a slot"):
        validate_structure(parent, slot, is_leaf)


def test_validation_returns_the_depths_it_found():
    """Its cycle check finds every node's depth; the plan and from_parent reuse them."""
    from hiergraph.plan.depth import node_depth

    tree = from_nested([[0, 1], [2, [3, 4]]])
    depth = validate_structure(tree.parent, tree.slot, tree.is_leaf)
    assert depth.dtype == torch.long and torch.equal(depth, node_depth(tree.parent)[0])
    assert torch.equal(depth, tree.depth)
    empty = torch.zeros(0, dtype=torch.long)
    assert validate_structure(empty, empty, empty.bool()).numel() == 0
