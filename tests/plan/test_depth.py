import random

import pytest
import torch

from hiergraph.data import SignalHierarchy
from hiergraph.plan.depth import node_depth


def walked_depth(parent: list[int]) -> tuple[list[int], list[bool]]:
    """The depth of every node and whether it reaches a root, by walking up its links."""
    depth, reaches = [], []
    for node in range(len(parent)):
        seen, hops = {node}, 0
        while parent[node] != node and parent[node] not in seen:
            node = parent[node]
            seen.add(node)
            hops += 1
        depth.append(hops)
        reaches.append(parent[node] == node)
    return depth, reaches


def random_parent(rng: random.Random, n: int, cycles: bool) -> list[int]:
    """A random forest of ``n`` nodes (a root is its own parent; long chains likely),
    and with ``cycles`` some links redirected at random."""
    parent = [
        i if i == 0 or rng.random() < 0.05 else rng.randrange(max(i - 3, 0), i) for i in range(n)
    ]
    if cycles:
        for i in rng.sample(range(n), 3):
            parent[i] = rng.randrange(n)
    return parent


@pytest.mark.parametrize("cycles", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_node_depth_follows_the_parent_links(seed, cycles):
    rng = random.Random(seed)
    parent = random_parent(rng, rng.randint(1, 300), cycles)
    depth, reaches = node_depth(torch.tensor(parent))
    expected_depth, expected_reaches = walked_depth(parent)
    assert reaches.tolist() == expected_reaches
    reached = [d for d, r in zip(expected_depth, expected_reaches, strict=True) if r]
    assert depth[reaches].tolist() == reached


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1025, 1026])
def test_node_depth_of_a_chain(n):
    """Every length around a power of two: the doubling takes enough steps."""
    depth, reaches = node_depth(torch.arange(n).sub(1).clamp(min=0))
    assert depth.tolist() == list(range(n)) and bool(reaches.all())


def test_the_plan_of_a_deep_caterpillar():
    """A chain of 2,000 inner nodes, each with a leaf: one level per depth, every level's
    counts right (levels cost their own nodes: the plan was O(N D) on such chains)."""
    depth = 2000
    parent = [-1]
    for _ in range(depth):
        inner = len(parent) - 1
        parent += [inner, inner]  # a leaf and the next inner node (the last one a leaf)
    tree = SignalHierarchy.from_parent(parent)
    assert sorted(tree.depth.tolist()) == [0] + [d for d in range(1, depth + 1) for _ in range(2)]
    index = tree.tree_index()
    assert index.num_levels == depth + 1 and index.num_leaves == depth + 1
    for d, level in enumerate(index.levels):
        assert sorted(level.count.tolist()) == ([depth + 1] if d == 0 else [1, depth + 1 - d])


def test_int32_structure_plans_as_int64():
    """(The breadth-first ranks took the parents' dtype: an int32 forest failed to plan.)"""
    from hiergraph.data import window_hierarchy
    from hiergraph.plan import TreeIndex

    tree = window_hierarchy(8, (2, 4))
    expected = TreeIndex.from_parent(tree.parent, tree.slot, tree.is_leaf)
    index = TreeIndex.from_parent(tree.parent.int(), tree.slot.int(), tree.is_leaf)
    assert index.rank.dtype == torch.long and torch.equal(index.rank, expected.rank)
    assert index.level_ptr == expected.level_ptr and torch.equal(index.order, expected.order)
