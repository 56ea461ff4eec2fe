"""GraphHierarchy: community trees over graph nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.datasets.graph_generator import GridGraph
from torch_geometric.loader import DataLoader
from torch_geometric.utils import stochastic_blockmodel_graph

from hiergraph.data import SignalHierarchy, from_nested
from hiergraph.data.domain import Domain
from hiergraph.transforms import (
    GraphHierarchy,
    HierarchicalGraph,
    hierarchy_stats,
    sibling_edges,
)
from tests.saving import reloaded


def sbm(blocks=(12, 12, 12, 12), p_in=0.5, p_out=0.02, seed=0, features=3):
    torch.manual_seed(seed)
    probs = torch.full((len(blocks), len(blocks)), p_out).fill_diagonal_(p_in)
    edge_index = stochastic_blockmodel_graph(list(blocks), probs)
    n = sum(blocks)
    return Data(x=torch.randn(n, features), edge_index=edge_index, y=torch.arange(n), num_nodes=n)


def family_sizes(tree):
    nodes = torch.arange(tree.num_nodes)
    return torch.bincount(tree.parent[tree.parent != nodes], minlength=tree.num_nodes)


def has_metis() -> bool:
    import importlib.util

    import torch_geometric.typing as pyg_typing

    return pyg_typing.WITH_METIS or importlib.util.find_spec("pymetis") is not None


METHODS = [
    "louvain",
    "lp",
    pytest.param("metis", marks=pytest.mark.skipif(not has_metis(), reason="no METIS backend")),
]


@pytest.mark.parametrize("method", METHODS)
def test_leaves_are_nodes_in_order_and_graph_untouched(method):
    data = sbm()
    before = {k: v.clone() for k, v in data.items() if torch.is_tensor(v)}
    out = GraphHierarchy(method, seed=1)(data)
    tree = out.hierarchy()
    assert tree.num_leaves == data.num_nodes
    assert bool(tree.is_leaf[: data.num_nodes].all()) and not bool(
        tree.is_leaf[data.num_nodes :].any()
    )
    for key, value in before.items():
        assert torch.equal(out[key], value) and torch.equal(data[key], value)
    assert out.num_nodes == data.num_nodes
    # all non-roots are members of graph-domain families
    assert bool(
        (tree.domain[: tree.num_nodes - 1] == int(Domain.GRAPH)).sum() == tree.num_nodes - 1
    )
    assert tree.num_trees == 1


def test_hierarchy_orders_children_by_slot_as_signal_hierarchy_does():
    # slots near the int64 limit: a combined key parent * (T + 1) + slot would overflow
    parent, slot = torch.tensor([2, 2, 2]), torch.tensor([2**63 - 2, 0, 0])
    graph = HierarchicalGraph(tree_parent=parent, tree_slot=slot)
    expected = SignalHierarchy.from_parent(torch.tensor([2, 2, -1]), slot=slot).edge_index
    assert torch.equal(expected, torch.tensor([[1, 0], [2, 2]]))
    assert torch.equal(graph.hierarchy().edge_index, expected)


def test_hierarchy_of_inference_tensors_and_its_cache():
    out = GraphHierarchy("lp", seed=1)(sbm())
    tree = out.hierarchy()
    assert out.hierarchy() is tree  # cached while the tree_* attributes are unchanged
    out.tree_slot = out.tree_slot.clone()
    assert out.hierarchy() is not tree
    # any tree_* attribute replaced, removed or added (a stale cache kept the old one)
    out.tree_graph_pe = torch.zeros_like(out.tree_graph_pe)
    assert out.hierarchy().graph_pe.abs().sum() == 0
    del out.tree_node_type
    assert "node_type" not in out.hierarchy()
    out.tree_node_type = torch.ones_like(out.tree_parent)
    assert torch.equal(out.hierarchy().node_type, out.tree_node_type)
    tree = out.hierarchy()
    out.tree_depth[0] = out.tree_depth[0]  # written in place: built again
    assert out.hierarchy() is not tree
    with torch.inference_mode():  # transformed under inference mode: derived on every call
        made = GraphHierarchy("lp", seed=1)(sbm())
        first = made.hierarchy()
        assert made.hierarchy() is not first and torch.equal(first.parent, tree.parent)


def test_a_saved_dataset_of_graphs_reads_back_with_their_trees(tmp_path):
    graphs = [GraphHierarchy(seed=0)(sbm(seed=seed)) for seed in (0, 1)]
    graphs[0].hierarchy().tree_index()  # caches that collation leaves behind
    dataset = reloaded(graphs, str(tmp_path / "data.pt"), HierarchicalGraph)
    for graph, loaded in zip(graphs, dataset, strict=True):
        assert isinstance(loaded, HierarchicalGraph)
        assert torch.equal(loaded.hierarchy().parent, graph.hierarchy().parent)
        assert torch.equal(loaded.tree_graph_pe, graph.tree_graph_pe)


def test_a_file_cannot_pair_a_graph_with_another_tree(tmp_path):
    """A saved graph's cached tree (``hierarchy()``) is not read back: a file read
    weights-only could otherwise hand out a tree other than its ``tree_*`` attributes."""
    from hiergraph.datasets.processed import SAFE_CLASSES

    graph = GraphHierarchy(seed=0)(sbm())
    graph.hierarchy()
    names, (tensors, versions), _ = graph.__dict__["_hierarchy_cache"]
    forged = (names, (tensors, (1,) * len(versions)), from_nested([[0, 1], [2]]))  # loaded: 1
    graph.__dict__["_hierarchy_cache"] = forged
    torch.save(graph, tmp_path / "graph.pt")
    with torch.serialization.safe_globals(SAFE_CLASSES):
        loaded = torch.load(tmp_path / "graph.pt", weights_only=True)
    assert "_hierarchy_cache" not in loaded.__dict__
    assert torch.equal(loaded.hierarchy().parent, loaded.tree_parent)


def test_recovers_planted_blocks():
    data = sbm(p_in=0.9, p_out=0.0)
    tree = GraphHierarchy(levels=1, max_family=16)(data).hierarchy()
    parent = tree.parent[: data.num_nodes]
    for b in range(4):
        assert parent[12 * b : 12 * (b + 1)].unique().numel() == 1
    assert parent.unique().numel() == 4


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_for_a_seed(method):
    data = sbm(seed=3)
    a, b = GraphHierarchy(method, seed=7)(data), GraphHierarchy(method, seed=7)(data)
    for key in ("tree_parent", "tree_slot", "tree_graph_pe"):
        assert torch.equal(a[key], b[key])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("max_family", [2, 3, 5])
def test_max_family_respected(method, max_family):
    data = sbm(blocks=(20, 15, 9), p_in=0.6)
    out = GraphHierarchy(method, max_family=max_family)(data)
    sizes = family_sizes(out.hierarchy())
    assert int(sizes.max()) <= max_family
    stats = hierarchy_stats(out)
    assert stats["family_max"] <= max_family and stats["num_leaves"] == 44
    with torch.device("meta"):  # made on the tree's device, not the default one
        assert hierarchy_stats(out) == stats
    if torch.cuda.is_available():
        assert hierarchy_stats(out.to("cuda")) == stats


@pytest.mark.parametrize("method", ["louvain", "lp"])
def test_numpy_integer_arguments(method):
    """NumPy ints passed the argument checks, then networkx refused a NumPy ``seed``
    (Louvain) and label propagation a NumPy ``max_family`` ('lp'), at the first graph."""
    data = sbm(blocks=(6, 6), seed=1)
    kwargs = dict(max_family=4, seed=3, pe_dim=2, iterations=5)
    expected = GraphHierarchy(method, **kwargs)(data)
    out = GraphHierarchy(method, **{k: np.int64(v) for k, v in kwargs.items()})(data)
    assert torch.equal(out.tree_parent, expected.tree_parent)
    assert torch.equal(out.tree_graph_pe, expected.tree_graph_pe)


@pytest.mark.parametrize("method", ["louvain", "lp"])
def test_edgeless_and_single_node_graphs(method):
    data = Data(x=torch.randn(10, 2), edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=10)
    sizes = family_sizes(GraphHierarchy(method, max_family=4)(data).hierarchy())
    assert int(sizes.max()) <= 4
    one = GraphHierarchy(method)(
        Data(x=torch.randn(1, 2), edge_index=torch.empty(2, 0).long(), num_nodes=1)
    )
    assert one.hierarchy().num_leaves == 1 and one.hierarchy().num_nodes == 2


@pytest.mark.parametrize("method", ["louvain", "lp"])
def test_sibling_edges_join_siblings_and_cover_graph_edges(method):
    data = GridGraph(5, 6)()
    tree = GraphHierarchy(method, max_family=4, pe_dim=0)(data).hierarchy()
    pairs = sibling_edges(tree, data.edge_index)
    assert bool((tree.parent[pairs[0]] == tree.parent[pairs[1]]).all())
    # every non-self-loop graph edge maps to one sibling pair (dense reference: ancestor sets)
    anc = {}
    for leaf in range(data.num_nodes):
        path, v = [leaf], leaf
        while int(tree.parent[v]) != v:
            v = int(tree.parent[v])
            path.append(v)
        anc[leaf] = path
    expected = set()
    for u, v in data.edge_index.t().tolist():
        if u == v:
            continue
        common = set(anc[u]) & set(anc[v])
        a = next(x for x in anc[u] if int(tree.parent[x]) in common and x not in common)
        b = next(x for x in anc[v] if int(tree.parent[x]) in common and x not in common)
        expected.add((a, b))
    assert set(map(tuple, pairs.t().tolist())) == expected


def test_graph_pe_shape_and_batching_of_small_graphs():
    graphs = [
        GraphHierarchy(max_family=4, pe_dim=3)(sbm(blocks=(5, 4 + i), seed=i)) for i in range(3)
    ]
    batch = Batch.from_data_list(graphs)
    assert batch.tree_graph_pe.shape == (batch.tree_parent.numel(), 3)
    forest = batch.hierarchy()
    assert forest.num_trees == 3 and forest.num_leaves == batch.num_nodes
    # the leaves of the forest, in leaf order, are the nodes of the batched graph
    leaf_ids = forest.is_leaf.nonzero().view(-1)
    offset, tree_offset = 0, 0
    for g in graphs:
        t = g.hierarchy()
        own = leaf_ids[offset : offset + g.num_nodes] - tree_offset
        assert torch.equal(own, torch.arange(g.num_nodes))
        assert torch.equal(
            forest.parent[tree_offset : tree_offset + t.num_nodes] - tree_offset, t.parent
        )
        offset, tree_offset = offset + g.num_nodes, tree_offset + t.num_nodes
    loaded = next(iter(DataLoader(graphs, batch_size=3)))
    assert torch.equal(loaded.tree_parent, batch.tree_parent)


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        GraphHierarchy(method="spectral")
    with pytest.raises(ValueError, match="max_family"):
        GraphHierarchy(max_family=1)
    with pytest.raises(ValueError, match="iterations"):
        GraphHierarchy("lp", iterations=0)
    with pytest.raises(TypeError, match="seed must be an int >= 0, got None"):  # (per method)
        GraphHierarchy("lp", seed=None)
    for resolution in (float("nan"), -1.0):  # (accepted)
        with pytest.raises(ValueError, match="resolution must be a finite number > 0"):
            GraphHierarchy(resolution=resolution)
    for method in ("louvain", "lp"):
        with pytest.raises(ValueError, match="at least one node, got 0"):
            GraphHierarchy(method)(
                Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=0)
            )
    for name in ("levels", "pe_dim"):  # a bool is no count (True passed before)
        with pytest.raises(TypeError, match=f"{name} must be an int >= 0.*got True"):
            GraphHierarchy(**{name: True})
        with pytest.raises(ValueError, match=f"{name} must be an int >= 0.*got -1"):
            GraphHierarchy(**{name: -1})
    with pytest.raises(ValueError, match="GraphHierarchy"):
        HierarchicalGraph(x=torch.randn(2, 1)).hierarchy()


def test_metis_needs_a_backend(monkeypatch):
    import importlib.util

    import torch_geometric.typing as pyg_typing

    monkeypatch.setattr(pyg_typing, "WITH_METIS", False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pymetis" else real(name, *a)
    )
    with pytest.raises(ImportError, match="louvain"):
        GraphHierarchy(method="metis")


@pytest.mark.skipif(not has_metis(), reason="no METIS backend")
def test_metis_families_follow_the_planted_blocks():
    data = sbm(blocks=(16,) * 8, p_in=0.6, p_out=0.01)
    tree = GraphHierarchy("metis", max_family=16, seed=0)(data).hierarchy()
    parent = tree.parent[: data.num_nodes]
    block = torch.arange(data.num_nodes) // 16
    # most leaf families lie inside one planted block (METIS cuts few edges)
    inside = [block[parent == p].unique().numel() == 1 for p in parent.unique()]
    assert sum(inside) >= 0.75 * len(inside)
    assert int(family_sizes(tree).max()) <= 16


def test_sibling_edges_reject_edges_between_trees():
    forest = Batch.from_data_list([from_nested([0, 1, 2]), from_nested([0, 1])])
    leaves = forest.is_leaf.nonzero().view(-1)
    first, last = leaves[forest.batch[leaves] == 0][0], leaves[forest.batch[leaves] == 1][0]
    inside = torch.stack([leaves[:2], leaves[1:3]])
    assert sibling_edges(forest, inside).size(1) == 2
    with pytest.raises(ValueError, match="different trees"):
        sibling_edges(forest, torch.tensor([[first], [last]]))
    root = int(forest.parent[first])  # (it and its child were returned as siblings)
    with pytest.raises(ValueError, match=f"must join leaves of the tree: node {root} is internal"):
        sibling_edges(forest, torch.tensor([[root], [first]]))
    # a non-contiguous edge_index (a view of [E, 2] pairs, as PyG's transforms give)
    assert torch.equal(
        sibling_edges(forest, inside.T.contiguous().T), sibling_edges(forest, inside)
    )


def test_stats_of_a_tree_without_families_and_of_no_tree():
    stats = hierarchy_stats(from_nested(0))
    assert stats["num_families"] == 0 and stats["height"] == 0 and stats["num_leaves"] == 1
    assert all(math.isnan(stats[f"family_{key}"]) for key in ("min", "mean", "median", "max"))
    with pytest.raises(TypeError, match="a HierarchicalGraph or a SignalHierarchy"):
        hierarchy_stats(Data(x=torch.zeros(3, 1)))
