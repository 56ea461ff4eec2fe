"""``check_edge_index``: the one edge_index check of every layer and op, its options, and
the sparse adjacency converters (the layers' memory of checked graphs: tests/nn/test_edges.py)."""

import pytest
import torch

import hiergraph.ops.edge_index as edge_module
from hiergraph._device import cpu_as_accelerator
from hiergraph.ops.edge_index import (
    adjacency_to_edge_index,
    check_edge_index,
    edge_index_to_adjacency,
    edge_values_to_adjacency,
    is_adjacency,
)
from tests.host_sync import HostSyncRecorder


def test_type_and_shape_only_never_read_values():
    meta = torch.empty(2, 7, dtype=torch.long, device="meta")  # reading its values raises
    check_edge_index(meta, 3, 4, check_range=False)
    check_edge_index(meta, 3, 4)  # off the CPU the range is a device-side assertion
    with pytest.raises(ValueError, match=r"shape \[2, E\], got \(3, 7\)"):
        check_edge_index(torch.empty(3, 7, dtype=torch.long, device="meta"), 3, check_range=False)
    with pytest.raises(TypeError, match="int64 or int32 tensor .* got a torch.float32 tensor"):
        check_edge_index(torch.empty(2, 7, device="meta"), 3, check_range=False)
    bad = torch.tensor([[0, 9], [1, 2]])
    check_edge_index(bad, 3, check_range=False)
    with pytest.raises(ValueError, match=r"sources \(row 0, keys\) span 0\.\.9 for num_src = 3"):
        check_edge_index(bad, 3)


def test_int32_ids_are_always_accepted():
    ids = torch.tensor([[0, 2], [1, 3]], dtype=torch.int32)
    check_edge_index(ids, 3, 4)
    with pytest.raises(ValueError, match=r"targets \(row 1, queries\) span 1\.\.3 for num_dst = 3"):
        check_edge_index(ids, 3, 3)
    with pytest.raises(
        TypeError, match="int64 or int32 tensor of shape \\[2, E\\] or a SparseTensor"
    ):
        check_edge_index(ids.to(torch.int16), 4, alternative="a SparseTensor")


def test_range_is_a_device_side_assertion_off_the_cpu():
    """On an accelerator the ids are never read on the host: a device-side assertion
    (``torch._assert_async``; its CPU kernel raises at once) instead of a ValueError."""
    good, bad = torch.tensor([[0, 2], [1, 3]]), torch.tensor([[0, 5], [1, 3]])
    with cpu_as_accelerator():
        with HostSyncRecorder() as rec:
            check_edge_index(good, 3, 4)
        assert rec.unique_syncs() == []
        with pytest.raises(RuntimeError, match=r"out of range: sources \(row 0\) must lie in"):
            check_edge_index(bad, 3, 4)
        check_edge_index(bad, 3, 4, check_range=False)
    with pytest.raises(ValueError, match=r"sources \(row 0, keys\) span 0\.\.5"):
        check_edge_index(bad, 3, 4)


def test_a_sparse_tensor_is_not_an_edge_index():
    adj = torch.tensor([[0, 1], [1, 0]]).to_sparse()
    with pytest.raises(TypeError, match="got a torch.sparse_coo tensor"):
        check_edge_index(adj, 2)


def test_ops_export_the_edge_kernels_and_the_check():
    from hiergraph.ops import EdgeCSR, check_edge_index, edge_aggregate, edge_dot

    graph = EdgeCSR(torch.tensor([[0, 1, 1], [1, 0, 1]]), (2, 2))
    a = torch.randn(2, 1, 3, dtype=torch.float64)
    weight = torch.softmax(edge_dot(a, a, graph), dim=0)
    assert edge_aggregate(weight, a, graph).shape == (2, 1, 3)
    assert check_edge_index is edge_module.check_edge_index


EDGES = torch.tensor([[3, 0, 2, 0, 1, 3], [1, 2, 0, 0, 2, 1]])  # unsorted, one repeated edge


@pytest.mark.parametrize("layout", ["coo", "coo-uncoalesced", "csr", "csc"])
def test_adjacency_orientation_and_round_trip(layout):
    """``adj_t[target, source]``: row = target = ``edge_index[1]``, column = source."""
    num_src, num_dst = 4, 3
    values = torch.arange(1.0, 7.0)
    if layout == "coo-uncoalesced":  # stored as given: the repeated edge twice, unsorted
        adj = torch.sparse_coo_tensor(EDGES.flip(0), values, (3, 4), check_invariants=True)
    else:
        coo = torch.sparse_coo_tensor(EDGES.flip(0), values, (3, 4), check_invariants=True)
        coo = coo.coalesce()
        adj = {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout]
    assert is_adjacency(adj) and not is_adjacency(EDGES)
    edge_index, stored = adjacency_to_edge_index(adj, num_src, num_dst)
    dense = torch.zeros(num_dst, num_src).index_put_(
        (edge_index[1], edge_index[0]), stored, accumulate=True
    )
    torch.testing.assert_close(dense, adj.to_dense())
    if layout == "coo-uncoalesced":
        assert torch.equal(edge_index, EDGES) and torch.equal(stored, values)
    weights = torch.randn(edge_index.size(1), 2)
    out = edge_values_to_adjacency(adj, weights)
    assert out.layout == adj.layout and out.shape == (num_dst, num_src, 2)
    again, again_values = adjacency_to_edge_index(out, num_src, num_dst)
    assert torch.equal(again, edge_index) and torch.equal(again_values, weights)
    # per-edge values of an edge_index, as an adjacency of the same layout
    rebuilt, ordered = edge_index_to_adjacency(EDGES, values, num_src, num_dst, adj.layout)
    torch.testing.assert_close(rebuilt.to_dense(), adj.to_dense())
    ids, rebuilt_values = adjacency_to_edge_index(rebuilt, num_src, num_dst)
    assert torch.equal(rebuilt_values, ordered)
    with pytest.raises(ValueError, match=r"\[num_dst, num_src\] = \[4, 3\], got \[3, 4\]"):
        adjacency_to_edge_index(adj, num_dst, num_src)  # source and target counts swapped


def test_adjacency_to_edge_index_reads_no_values():
    adj = torch.sparse_coo_tensor(EDGES.flip(0), torch.ones(6), (3, 4), check_invariants=True)
    adj = adj.to_sparse_csr()
    with cpu_as_accelerator(), HostSyncRecorder() as rec:
        adjacency_to_edge_index(adj, 4, 3)
    assert rec.unique_syncs() == []
    with pytest.raises(ValueError, match="2 sparse dimensions"):
        adjacency_to_edge_index(torch.ones(2, 3, 4).to_sparse(3), 4, 3)
    with pytest.raises(TypeError, match="sparse adjacency"):
        adjacency_to_edge_index(EDGES, 4, 3)


def edge_callers():
    """Every public function that takes an ``edge_index`` over 4 nodes, as ``f(edge_index)``."""
    from torch_geometric.data import Data

    from hiergraph.masks import edge_index_to_mask, global_tokens_mask, graph_mask, relabel
    from hiergraph.nn import ConeConv, MaskedAttentionConv
    from hiergraph.ops import EdgeCSR, penumbral_edge, umbral_edge
    from hiergraph.transforms import GraphHierarchy
    from hiergraph.transforms.graph_partition import label_propagation_tree

    torch.manual_seed(0)
    x, q = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 2, 3, dtype=torch.float64)
    masked = MaskedAttentionConv(6, 2, heads=2, structured=False).double()
    cone = ConeConv(6, 2, heads=2).double()
    return {
        "graph_mask": lambda e: graph_mask(e, 4),
        "global_tokens_mask": lambda e: global_tokens_mask(e, 4, 1),
        "edge_index_to_mask": lambda e: edge_index_to_mask(e, 4, rows="query"),
        "relabel": lambda e: relabel(e, torch.tensor([2, 0, 3, 1])),
        "EdgeCSR": lambda e: EdgeCSR(e, (4, 4)).edge_index,
        "penumbral_edge": lambda e: penumbral_edge(q, q, e),
        "umbral_edge": lambda e: umbral_edge(q, q, e),
        "MaskedAttentionConv": lambda e: masked(x, e),
        "ConeConv": lambda e: cone(x, e),
        "label_propagation_tree": lambda e: label_propagation_tree(4, e, 2),
        "GraphHierarchy": lambda e: (
            GraphHierarchy(max_family=2)(Data(edge_index=e, num_nodes=4)).tree_parent
        ),
    }


@pytest.mark.parametrize("name", list(edge_callers()))
def test_every_edge_input_has_the_one_policy(name):
    """int32 ids give the int64 result everywhere; a bad id gets the shared message."""
    f = edge_callers()[name]
    expected = f(EDGES)
    got = f(EDGES.int())
    torch.testing.assert_close(got, expected, rtol=0, atol=0, check_dtype=False)
    bad = EDGES.clone()
    bad[0, 2] = 4
    with pytest.raises(ValueError, match=r"sources \(row 0, keys\) span 0\.\.4 for num_src = 4"):
        f(bad)
    with pytest.raises(TypeError, match=r"int64 or int32 tensor of shape \[2, E\]"):
        f(EDGES.float())
