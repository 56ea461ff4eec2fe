"""Size-capped label propagation and the community tree built from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.utils import stochastic_blockmodel_graph, to_undirected

from hiergraph.transforms.graph_partition import label_propagation, label_propagation_tree


def random_graph(n, p, seed):
    gen = torch.Generator().manual_seed(seed)
    adj = torch.rand(n, n, generator=gen) < p
    adj = (adj | adj.T) & ~torch.eye(n, dtype=torch.bool)
    return adj.nonzero().T


def leaf_sets(parent, n):
    """Leaves below every node (dense reference: walk up from every leaf)."""
    below = {v: set() for v in range(parent.numel())}
    for leaf in range(n):
        v = leaf
        while v != -1:
            below[v].add(leaf)
            v = int(parent[v])
    return below


@pytest.mark.parametrize("max_size", [1, 2, 5])
def test_clusters_respect_the_cap_and_are_named_by_their_smallest_member(max_size):
    edges = random_graph(40, 0.2, seed=max_size)
    label = label_propagation(40, edges, torch.ones(edges.size(1)), max_size, seed=1)
    assert int(torch.bincount(label).max()) <= max_size
    for c in label.unique().tolist():
        assert int((label == c).nonzero().min()) == c
    again = label_propagation(40, edges, torch.ones(edges.size(1)), max_size, seed=1)
    assert torch.equal(label, again)


def test_a_node_joins_the_label_it_is_linked_to_most():
    # node 0 -- node 1 (weight 1), node 0 -- node 2 (weight 5): 0 and 2 end together
    edges = torch.tensor([[0, 1, 0, 2], [1, 0, 2, 0]])
    label = label_propagation(3, edges, torch.tensor([1.0, 1.0, 5.0, 5.0]), 2, iterations=20)
    assert label[0] == label[2] != label[1]


@pytest.mark.parametrize("seed", range(20))
def test_linked_singletons_merge_instead_of_swapping(seed):
    # two isolated edges: when both ends of an edge move in the same round, each onto the
    # other's label, they used to swap labels (four singletons for most seeds)
    edges = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
    label = label_propagation(4, edges, torch.ones(4), max_size=4, seed=seed)
    assert label.tolist() == [0, 0, 2, 2]


@pytest.mark.parametrize("max_family", [2, 4, 16])
def test_tree_is_valid_and_family_sizes_capped(max_family):
    edges = random_graph(60, 0.08, seed=max_family)
    parent = label_propagation_tree(60, edges, max_family)
    t = parent.numel()
    assert int((parent == -1).sum()) == 1
    children = torch.bincount(parent[parent >= 0], minlength=t)
    assert bool((children[:60] == 0).all())  # graph nodes are the leaves
    assert bool((children[60:] >= 2).all()) and int(children.max()) <= max_family
    internal = parent[parent >= 0]
    assert bool((internal >= 60).all())
    assert bool((parent[parent >= 0] > torch.arange(t)[parent >= 0]).all())  # after children
    assert set().union(*[s for v, s in leaf_sets(parent, 60).items() if parent[v] == -1]) == set(
        range(60)
    )


def test_planted_blocks_are_subtrees():
    torch.manual_seed(0)
    blocks = [12, 12, 12, 12]
    probs = torch.full((4, 4), 0.01).fill_diagonal_(0.9)
    edges = to_undirected(stochastic_blockmodel_graph(blocks, probs))
    parent = label_propagation_tree(48, edges, max_family=16)
    below = leaf_sets(parent, 48)
    for b in range(4):
        assert set(range(12 * b, 12 * (b + 1))) in below.values()


def test_edgeless_and_tiny_graphs():
    parent = label_propagation_tree(10, torch.empty(2, 0, dtype=torch.long), max_family=3)
    children = torch.bincount(parent[parent >= 0], minlength=parent.numel())
    assert int(children.max()) <= 3 and int((parent == -1).sum()) == 1
    assert label_propagation_tree(1, torch.empty(2, 0, dtype=torch.long), 4).tolist() == [1, -1]
    assert label_propagation_tree(3, torch.tensor([[0], [1]]), 4).tolist() == [3, 3, 3, -1]


@pytest.mark.parametrize("bad", [1, 0, 2.5, True])
def test_tree_rejects_families_below_two(bad):
    # max_family = 1 could never merge anything: it used to loop forever
    with pytest.raises(ValueError, match="max_family must be an int >= 2"):
        label_propagation_tree(4, torch.tensor([[0, 2], [1, 3]]), bad)


def test_tree_takes_a_numpy_max_family():
    """``max_family=np.int64(4)`` was refused as "max_family must be an int >= 2, got 4"
    (``GraphHierarchy("lp")`` accepted it and failed at the first graph)."""
    edges = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    expected = label_propagation_tree(6, edges, 4)
    assert torch.equal(label_propagation_tree(6, edges, np.int64(4)), expected)
