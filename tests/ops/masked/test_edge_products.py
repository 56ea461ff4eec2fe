"""hiergraph.ops.masked.edge_products: the sparse per-edge products against gather/scatter
references (float64), their gradients, and the edge cases of the layer's edge path."""

import pytest
import torch

from hiergraph.ops.masked.edge_products import EdgeCSR, edge_aggregate, edge_dot

H, C = 2, 3


def random_graph(num_src, num_dst, num_edges, seed=0):
    """Unsorted edges with duplicates; target 0 never receives an edge."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(num_src, (num_edges,), generator=gen)
    dst = torch.randint(1, num_dst, (num_edges,), generator=gen)
    edge_index = torch.stack([src, dst])
    return torch.cat([edge_index, edge_index[:, :3]], dim=1)  # 3 duplicate edges


def feats(n, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, C, generator=gen, dtype=dtype).requires_grad_()


def reference_dot(a, b, edge_index):
    return (a[edge_index[1]] * b[edge_index[0]]).sum(-1)


def reference_aggregate(weight, b, edge_index, num_dst):
    out = b.new_zeros(num_dst, *b.shape[1:])
    return out.index_add(0, edge_index[1], weight[..., None] * b[edge_index[0]])


def test_sorting_and_transpose():
    edge_index = random_graph(5, 7, 20)
    graph = EdgeCSR(edge_index, (5, 7))
    key = graph.edge_index[1] * 5 + graph.edge_index[0]
    assert graph.perm is not None and bool((key[1:] >= key[:-1]).all())
    assert torch.equal(graph.edge_index, edge_index[:, graph.perm])
    assert graph.crow.tolist() == [0, *torch.bincount(graph.edge_index[1], minlength=7).cumsum(0)]
    crow_t, col_t, perm_t = graph.transpose()
    assert torch.equal(col_t, graph.edge_index[1][perm_t])
    assert bool((graph.edge_index[0][perm_t].diff() >= 0).all()) and crow_t[-1] == 23
    already = EdgeCSR(graph.edge_index, (5, 7))
    assert already.perm is None and already.edge_index is graph.edge_index  # no copy


@pytest.mark.parametrize("num_src,num_dst", [(6, 6), (4, 9), (9, 4)])
def test_products_match_references_and_gradcheck(num_src, num_dst):
    graph = EdgeCSR(random_graph(num_src, num_dst, 25), (num_src, num_dst))
    a, b = feats(num_dst, 1), feats(num_src, 2)
    weight = torch.randn(graph.num_edges, H, dtype=torch.float64, requires_grad=True)
    edges = graph.edge_index
    torch.testing.assert_close(edge_dot(a, b, graph), reference_dot(a, b, edges))
    out = edge_aggregate(weight, b, graph)
    torch.testing.assert_close(out, reference_aggregate(weight, b, edges, num_dst))
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # no incoming edge: 0, not NaN
    assert torch.autograd.gradcheck(lambda a, b: edge_dot(a, b, graph), (a, b))
    assert torch.autograd.gradcheck(lambda w, b: edge_aggregate(w, b, graph), (weight, b))


def test_float32_and_no_edges():
    graph = EdgeCSR(random_graph(8, 8, 40), (8, 8))
    a, b = feats(8, 3, torch.float32), feats(8, 4, torch.float32)
    torch.testing.assert_close(
        edge_dot(a, b, graph), reference_dot(a, b, graph.edge_index), atol=1e-6, rtol=0
    )
    empty = EdgeCSR(torch.empty(2, 0, dtype=torch.long), (8, 8))
    assert edge_dot(a, b, empty).shape == (0, H)
    weight = torch.empty(0, H, requires_grad=True)
    out = edge_aggregate(weight, b, empty)
    assert torch.equal(out, torch.zeros(8, H, C))
    out.sum().backward()
    assert torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_float32(dtype):
    """The CSR kernels take no half types: half inputs run in float32 and come back in
    their own dtype, equal to the float32 products of the same (rounded) values, with
    gradients of the inputs' dtypes; mixed inputs (fp32 weights, bf16 values, as under
    autocast) give the common dtype."""
    graph = EdgeCSR(random_graph(8, 8, 40), (8, 8))
    a, b = feats(8, 5, dtype), feats(8, 6, dtype)
    weight = torch.randn(graph.num_edges, H, requires_grad=True)
    dot = edge_dot(a, b, graph)
    assert dot.dtype == dtype
    exact = edge_dot(a.detach().float(), b.detach().float(), graph)
    torch.testing.assert_close(dot, exact.to(dtype), atol=0, rtol=0)
    out = edge_aggregate(weight, b, graph)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, edge_aggregate(weight, b.detach().float(), graph))
    (dot.float().sum() + out.sum()).backward()
    assert a.grad.dtype == b.grad.dtype == dtype and weight.grad.dtype == torch.float32


def test_bad_shapes():
    graph = EdgeCSR(random_graph(5, 7, 10), (5, 7))
    for size in (7, (5, 7, 1)):
        with pytest.raises(ValueError, match=r"size must be \(num_src, num_dst\)"):
            EdgeCSR(graph.edge_index, size)
    with pytest.raises(ValueError, match=r"a must have shape \[7, H, C\]"):
        edge_dot(feats(5, 0), feats(5, 1), graph)
    with pytest.raises(ValueError, match=r"b must have shape \[5, 2, C\]"):
        edge_dot(feats(7, 0), torch.randn(5, 3, C), graph)
    with pytest.raises(ValueError, match="same channel size"):
        edge_dot(feats(7, 0), torch.randn(5, H, C + 1), graph)
    with pytest.raises(TypeError, match="a and b must be floating-point, got torch.int64"):
        edge_dot(feats(7, 0).long(), feats(5, 1).long(), graph)  # (a sparse-kernel error)
    with pytest.raises(ValueError, match=r"weight must have shape \[E, H\] = \[13, 2\]"):
        edge_aggregate(torch.randn(13, 3), feats(5, 1), graph)
    with pytest.raises(TypeError, match="graph must be an EdgeCSR"):
        edge_dot(feats(7, 0), feats(5, 1), graph.edge_index)
    meta = feats(5, 1).to("meta")  # (a sparse-kernel registration error)
    with pytest.raises(ValueError, match="b is on meta but the graph's edges are on cpu"):
        edge_dot(feats(7, 0), meta, graph)
    with pytest.raises(ValueError, match="b is on meta but the graph's edges are on cpu"):
        edge_aggregate(torch.randn(graph.num_edges, H), meta, graph)
    empty = torch.zeros(2, 0, dtype=torch.long)
    for size, error in (((-1, 3), ValueError), ((2.0, 3), TypeError), ((2,), ValueError)):
        with pytest.raises(error, match=r"^size(: num_src and num_dst)? must be"):  # (accepted
            EdgeCSR(empty, size)  # before where there was no edge)


@pytest.mark.parametrize(
    "edges", [[[5], [0]], [[-1], [0]], [[0], [7]], [[0], [-1]]], ids=["src", "-src", "dst", "-dst"]
)
def test_ids_out_of_range_raise(edges):
    # the kernels read memory with these ids unchecked (garbage or a crash before the check)
    with pytest.raises(ValueError, match="out of range"):
        EdgeCSR(torch.tensor(edges), (5, 7))


def test_strided_sorted_edge_index_equals_contiguous():
    """Sorted edges held as a view with other strides (``pairs.t()``, a stepped slice) give
    the contiguous copy's results (the CSR kernels read the ids as a plain array)."""
    sorted_edges = EdgeCSR(random_graph(5, 7, 12), (5, 7)).edge_index
    a, b = feats(7, 0), feats(5, 1)
    weight = torch.randn(sorted_edges.size(1), H, dtype=torch.float64)
    expected = EdgeCSR(sorted_edges, (5, 7))
    doubled = torch.stack([sorted_edges, sorted_edges], 2).flatten(1)[:, ::2]
    for view in (sorted_edges.t().contiguous().t(), doubled):
        assert not view.is_contiguous() and torch.equal(view, sorted_edges)
        graph = EdgeCSR(view, (5, 7))
        torch.testing.assert_close(edge_dot(a, b, graph), edge_dot(a, b, expected))
        torch.testing.assert_close(
            edge_aggregate(weight, b, graph), edge_aggregate(weight, b, expected)
        )


def test_more_edges_than_node_pairs():
    """Duplicates can make E exceed num_src * num_dst, which the CSR sampled product
    refuses: the products still sum every edge, gradients included."""
    edges = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]])  # 6 edges over 4 pairs
    graph = EdgeCSR(edges, (2, 2))
    a, b = feats(2, 0), feats(2, 1)
    weight = torch.randn(6, H, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(edge_dot(a, b, graph), reference_dot(a, b, graph.edge_index))
    torch.testing.assert_close(
        edge_aggregate(weight, b, graph), reference_aggregate(weight, b, graph.edge_index, 2)
    )
    assert torch.autograd.gradcheck(lambda a, b: edge_dot(a, b, graph), (a, b))
    assert torch.autograd.gradcheck(lambda w, b: edge_aggregate(w, b, graph), (weight, b))


def test_int32_edge_index_equals_int64():
    edge_index = random_graph(5, 7, 10)
    a, b = feats(7, 0), feats(5, 1)
    narrow = EdgeCSR(edge_index.int(), (5, 7))
    assert narrow.edge_index.dtype == torch.long  # the sort key dst * num_src + src is int64
    torch.testing.assert_close(
        edge_dot(a, b, narrow), edge_dot(a, b, EdgeCSR(edge_index, (5, 7))), rtol=0, atol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int16])
@pytest.mark.parametrize("check", [True, False])
def test_non_integer_ids_raise_even_unchecked(dtype, check):
    edge_index = random_graph(5, 7, 10).to(dtype)
    with pytest.raises(TypeError, match="int64 or int32"):
        EdgeCSR(edge_index, (5, 7), check=check)


@pytest.mark.parametrize("num_edges", [0, 1, 2, 3])
def test_short_edge_lists_in_reverse_order_are_sorted(num_edges):
    """Every list not sorted by target gets sorted, the shortest ones too (two edges)."""
    edge_index = torch.tensor([[0, 1, 2], [2, 1, 0]])[:, :num_edges]  # targets descending
    graph = EdgeCSR(edge_index, (3, 3))
    key = graph.edge_index[1] * 3 + graph.edge_index[0]
    assert bool((key[1:] >= key[:-1]).all())
    if num_edges > 1:
        assert graph.perm is not None
        assert torch.equal(graph.edge_index, edge_index[:, graph.perm])
    a, b = feats(3, 1), feats(3, 2)
    weight = torch.randn(num_edges, H, dtype=torch.float64)
    torch.testing.assert_close(edge_dot(a, b, graph), reference_dot(a, b, graph.edge_index))
    torch.testing.assert_close(
        edge_aggregate(weight, b, graph), reference_aggregate(weight, b, graph.edge_index, 3)
    )
