"""MaskedAttentionConv: Lemma 1 (masked SDPA == message passing), both paths,
the stochastic-relation invariants and the equivariance classification
(Mijangos et al.)."""

import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import scatter

import hiergraph.nn.masked_attention_conv as conv_module
from hiergraph.masks import (
    BandMask,
    automorphisms,
    block_diagonal_mask,
    causal_mask,
    check_equivariance,
    cross_mask,
    dilated_mask,
    edge_index_to_mask,
    equivariance_error,
    equivariance_errors,
    full_mask,
    global_tokens_mask,
    graph_mask,
    random_mask,
    relabel,
    sequence_batch,
    sibling_mask,
    window_mask,
)
from hiergraph.nn.masked_attention_conv import MaskedAttentionConv
from tests.conftest import relative_error, rounding_error
from tests.nn import sparse_inputs
from tests.nn.sparse_inputs import LAYOUTS

N = 24


MASKS = {
    "full": full_mask(N),
    "causal": causal_mask(N),
    "window": window_mask(N, 3),
    "causal_window": window_mask(N, 3, causal=True),
    "dilated": dilated_mask(N, 2, 3),
    "block_diagonal": block_diagonal_mask([5, 11, 8]),
    "cross": cross_mask(10, 14),
    "global_tokens": global_tokens_mask(window_mask(N - 2, 1), N - 2, 2),
    "memory_tokens": global_tokens_mask(window_mask(N - 2, 1), N - 2, 2, read_only=True),
    "random": random_mask(N, 90, seed=0),
    "graph": graph_mask(random_mask(N, 60, seed=1, self_loops=False), N, self_loops=False),
    "siblings": sibling_mask(torch.tensor([-1, 0, 0, 0, 1, 1, 2, 2, 2, 2] + [-1] * 14)),
}
BANDED = {"full", "causal", "window", "causal_window", "dilated", "block_diagonal"}


def make_conv(dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    params = {"in_channels": 6, "out_channels": 4, "heads": 2} | kwargs
    return MaskedAttentionConv(**params).to(dtype).eval()


def features(n=N, dim=6, dtype=torch.float64, seed=1):
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def shuffled(edge_index, *edge_tensors, seed=0):
    """``(perm, edge_index[:, perm], *(t[perm] for t in edge_tensors))``: the same
    edges in a random order, each per-edge tensor permuted alongside.

    Every mask builder emits edges sorted by target, which is the layer's working
    order: only a shuffled edge list makes it sort, so only this exercises the
    mapping of alpha, edge features and logit biases between the two orders."""
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(seed))
    return perm, edge_index[:, perm], *(t[perm] for t in edge_tensors)


def dense_sdpa(conv, x, edge_index):
    """The same layer with a dense mask and scaled_dot_product_attention (rows
    with no incoming edge are returned as NaN-free garbage; callers mask them)."""
    n, H, C = x.size(0), conv.heads, conv.out_channels
    q, k, v = (
        lin(x).view(n, H, C).transpose(0, 1)
        for lin in (conv.lin_query, conv.lin_key, conv.lin_value)
    )
    mask = edge_index_to_mask(edge_index, n, rows="query")
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~mask.any(1, keepdim=True))
    out = out.transpose(0, 1)
    return out.reshape(n, H * C) if conv.concat else out.mean(1)


# ---------------------------------------------------------------- Lemma 1 (T7)
@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("structured", [True, False])
def test_equals_dense_masked_sdpa_float32(name, structured):
    edge_index = MASKS[name]
    conv = make_conv(torch.float32, root_weight=False, structured=structured)
    x = features(dtype=torch.float32)
    out = conv(x, edge_index)
    has_in = torch.zeros(N, dtype=torch.bool)
    has_in[edge_index[1]] = True
    torch.testing.assert_close(
        out[has_in], dense_sdpa(conv, x, edge_index)[has_in], atol=1e-6, rtol=0
    )
    assert torch.equal(out[~has_in], torch.zeros_like(out[~has_in]))  # documented: zero


@pytest.mark.parametrize("name", sorted(BANDED))
def test_fast_path_is_taken_and_matches_edge_path(name, monkeypatch):
    calls = []
    real = conv_module.banded_attention
    monkeypatch.setattr(
        conv_module, "banded_attention", lambda *a, **k: calls.append(a[3:]) or real(*a, **k)
    )
    edge_index = MASKS[name]
    x = features().requires_grad_()
    fast = make_conv()
    out_fast = fast(x, edge_index)
    assert len(calls) == 1
    (grad_fast,) = torch.autograd.grad(out_fast.square().sum(), x)
    slow = make_conv(structured=False)
    out_slow = slow(x, edge_index)
    (grad_slow,) = torch.autograd.grad(out_slow.square().sum(), x)
    assert len(calls) == 1
    torch.testing.assert_close(out_fast, out_slow, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad_fast, grad_slow, atol=1e-12, rtol=0)
    for g_fast, g_slow in zip(
        torch.autograd.grad(fast(x, edge_index).sum(), list(fast.parameters())),
        torch.autograd.grad(slow(x, edge_index).sum(), list(slow.parameters())),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_slow, atol=1e-12, rtol=0)


def test_edge_path_for_unstructured_inputs(monkeypatch):
    calls = []
    real = conv_module.banded_attention
    monkeypatch.setattr(
        conv_module, "banded_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    conv = make_conv()
    conv(features(), MASKS["random"])
    conv(features(), MASKS["window"], return_attention_weights=True)
    conv(features(), MASKS["window"], edge_attr=torch.zeros(MASKS["window"].size(1)))
    assert not calls


def range_checks(monkeypatch) -> list:
    """One entry per id-range check of the shared edge_index check, from now on (the
    layer's own and that of band detection)."""
    import hiergraph.masks.band as band_module
    import hiergraph.ops.edge_index as edge_module

    calls, real = [], edge_module.check_edge_index

    def counting(*args, check_range=True, **kwargs):
        calls.extend([1] if check_range else [])
        return real(*args, check_range=check_range, **kwargs)

    monkeypatch.setattr(edge_module, "check_edge_index", counting)
    monkeypatch.setattr(band_module, "check_edge_index", counting)
    return calls


def test_banded_path_checks_the_ids_as_validate_says(monkeypatch):
    """Band detection checked the ids a second time, and with ``validate=False`` checked
    what the layer was told not to."""
    calls = range_checks(monkeypatch)
    make_conv()(features(), MASKS["window"].clone())
    assert len(calls) == 1
    make_conv(validate=False)(features(), MASKS["window"].clone())
    assert len(calls) == 1


def test_edge_path_checks_the_ids_once(monkeypatch):
    calls = range_checks(monkeypatch)
    make_conv()(features(), MASKS["random"].clone())
    assert len(calls) == 1  # not again in the edge kernels' EdgeCSR


def test_ids_are_checked_once_per_edge_index_and_never_read_off_the_cpu(monkeypatch):
    """A training loop over one graph checks its ids once (the layer remembers the
    tensor, as ConeConv does); on an accelerator no forward reads them on the host."""
    from hiergraph._device import cpu_as_accelerator
    from tests.host_sync import HostSyncRecorder

    calls = range_checks(monkeypatch)
    conv, x, edge_index = make_conv(structured=False), features(), MASKS["random"].clone()
    for _ in range(3):
        conv(x, edge_index)
    assert len(calls) == 1
    edge_index[0, 0] = edge_index[0, 0]  # written in place: checked again
    conv(x, edge_index)
    conv(x, edge_index.clone())  # another tensor: checked again
    assert len(calls) == 3
    make_conv(structured=False, validate=False)(x, edge_index)
    assert len(calls) == 3
    copy = __import__("copy").deepcopy(conv)  # the remembered tensor is not copied
    assert copy._edges.cache.ref is None and conv._edges.cache.ref is not None
    with cpu_as_accelerator(), HostSyncRecorder() as rec:
        make_conv(structured=False)(x, MASKS["random"].clone())  # a new tensor, first call
    assert rec.unique_syncs() == []
    bad = MASKS["random"].clone()
    bad[0, 3] = N
    with cpu_as_accelerator(), pytest.raises(RuntimeError, match="edge_index has ids out of"):
        make_conv(structured=False)(x, bad)  # the device-side assertion (CPU kernel: at once)


def test_int32_edge_index_equals_int64():
    conv, x = make_conv(), features()
    for name in ("random", "window"):  # the edge path and the banded path
        out, (ei, alpha) = conv(x, MASKS[name].int(), return_attention_weights=True)
        ref, (_, ref_alpha) = conv(x, MASKS[name], return_attention_weights=True)
        assert ei.dtype == torch.int32
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
        torch.testing.assert_close(alpha, ref_alpha, atol=0, rtol=0)
        torch.testing.assert_close(conv(x, MASKS[name].int()), conv(x, MASKS[name]))


# ---------------------------------------------------------------- sparse adjacency input
def adjacency(edge_index, num_src=N, num_dst=N, layout="coo", values=None):
    return sparse_inputs.adjacency(edge_index, num_src, num_dst, layout, values)


def dense_alpha(edge_index, alpha, num_src=N, num_dst=N):
    return sparse_inputs.dense_alpha(edge_index, alpha, num_src, num_dst)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["random", "window", "cross", "siblings"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_sparse_adjacency_equals_edge_index(layout, name, shuffle):
    """A torch.sparse ``adj_t`` gives the output and attention weights of the equivalent
    ``edge_index`` (float64, 1e-12), the weights as an adjacency of the same layout."""
    from hiergraph.ops.edge_index import adjacency_to_edge_index

    edge_index = shuffled(MASKS[name])[1] if shuffle else MASKS[name]
    adj, conv, x = adjacency(edge_index, layout=layout), make_conv(), features()
    torch.testing.assert_close(conv(x, adj), conv(x, edge_index), atol=1e-12, rtol=0)
    out, (adj_alpha, alpha) = conv(x, adj, return_attention_weights=True)
    ref, (ei, ref_alpha) = conv(x, edge_index, return_attention_weights=True)
    assert ei is edge_index
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert adj_alpha.layout == adj.layout and adj_alpha.shape == (N, N, 2)
    expected = dense_alpha(edge_index, ref_alpha)
    torch.testing.assert_close(adj_alpha.to_dense(), expected, atol=1e-12, rtol=0)
    stored, _ = adjacency_to_edge_index(adj, N, N)  # alpha in the adjacency's stored order
    torch.testing.assert_close(alpha, expected[stored[1], stored[0]], atol=1e-12, rtol=0)
    if layout == "coo-uncoalesced":  # stored as given: the caller's (shuffled) edge order
        torch.testing.assert_close(alpha, ref_alpha, atol=1e-12, rtol=0)


def test_adjacency_rows_are_targets():
    """``adj_t[target, source]``, the transpose of ``edge_index``'s layout: the causal mask's
    adjacency is lower triangular, and its transpose is anti-causal attention."""
    conv, x, causal = make_conv(), features(), MASKS["causal"]
    adj = adjacency(causal)
    assert torch.equal(adj.to_dense(), adj.to_dense().tril())
    torch.testing.assert_close(conv(x, adj), conv(x, causal), atol=1e-12, rtol=0)
    assert not torch.allclose(conv(x, adj.t().coalesce()), conv(x, causal))
    # bipartite: [num_dst, num_src]
    pairs = torch.randperm(70, generator=torch.Generator().manual_seed(0))[:30]  # distinct
    edge_index = torch.stack([pairs % 10, pairs // 10])
    pair = (features(10), features(7, seed=2))
    for layout in LAYOUTS:
        sparse = adjacency(edge_index, 10, 7, layout)
        expected = conv(pair, edge_index)
        torch.testing.assert_close(conv(pair, sparse), expected, atol=1e-12, rtol=0)
        with pytest.raises(ValueError, match=r"\[num_dst, num_src\] = \[7, 10\], got \[10, 7\]"):
            conv(pair, adjacency(edge_index.flip(0), 7, 10, layout))


@pytest.mark.parametrize("shuffle", [False, True])
def test_adjacency_values_as_edge_attr(shuffle):
    """As in PyG's MessagePassing: ``[E, ...]`` values of a hybrid tensor become
    ``edge_attr`` (edge features, or a logit bias without ``edge_dim``), scalar values
    are ignored, and an explicit ``edge_attr`` follows the stored order."""
    gen = torch.Generator().manual_seed(3)
    edge_index = MASKS["random"]
    features_e = torch.randn(edge_index.size(1), 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(edge_index.size(1), 2, generator=gen, dtype=torch.float64)
    if shuffle:
        _, edge_index, features_e, bias = shuffled(edge_index, features_e, bias)
    x = features()
    with_features = make_conv(edge_dim=3)
    expected = with_features(x, edge_index, features_e)
    sparse = adjacency(edge_index, layout="coo-uncoalesced", values=features_e)
    torch.testing.assert_close(with_features(x, sparse), expected, atol=1e-12, rtol=0)
    ones = adjacency(edge_index, layout="coo-uncoalesced")
    torch.testing.assert_close(with_features(x, ones, features_e), expected, atol=1e-12, rtol=0)
    conv = make_conv()
    sparse = adjacency(edge_index, layout="coo-uncoalesced", values=bias)
    torch.testing.assert_close(conv(x, sparse), conv(x, edge_index, bias), atol=1e-12, rtol=0)
    weighted = adjacency(edge_index, layout="csr", values=bias[:, 0])  # scalar: ignored
    torch.testing.assert_close(conv(x, weighted), conv(x, edge_index), atol=1e-12, rtol=0)


def test_sparse_tensor_adjacency():
    torch_sparse = pytest.importorskip("torch_sparse")
    edge_index, conv, x = shuffled(MASKS["random"])[1], make_conv(), features()
    adj_t = torch_sparse.SparseTensor(row=edge_index[1], col=edge_index[0], sparse_sizes=(N, N))
    torch.testing.assert_close(conv(x, adj_t), conv(x, edge_index), atol=1e-12, rtol=0)
    out, weights = conv(x, adj_t, return_attention_weights=True)
    _, (_, ref_alpha) = conv(x, edge_index, return_attention_weights=True)
    row, col, alpha = weights.coo()
    expected = dense_alpha(edge_index, ref_alpha)
    torch.testing.assert_close(alpha, expected[row, col], atol=1e-12, rtol=0)


def test_band_descriptor_in_place_of_edge_index():
    band = BandMask((9, 15), 2, 1, 2)
    conv, x = make_conv(), features()
    expected = make_conv(structured=False)(x, band.edge_index())
    torch.testing.assert_close(conv(x, band), expected, atol=1e-12, rtol=0)
    out, (edge_index, alpha) = conv(x, band, return_attention_weights=True)
    assert torch.equal(edge_index, band.edge_index()) and alpha.shape == (band.num_edges, 2)
    for flag in (None, False):  # no weights: the output alone (and the banded fast path)
        torch.testing.assert_close(conv(x, band, return_attention_weights=flag), out)
    with pytest.raises(ValueError, match="BandMask over 24 nodes"):
        conv(features(n=10), band)


# ---------------------------------------------------------------- PyG TransformerConv
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"concat": False},
        {"root_weight": False, "heads": 3},
        {"edge_dim": 3},
        {"bias": False, "heads": 1},
    ],
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_equals_transformer_conv(kwargs, shuffle):
    conv = make_conv(**kwargs)
    reference = TransformerConv(**({"in_channels": 6, "out_channels": 4, "heads": 2} | kwargs))
    reference = reference.double().eval()
    reference.load_state_dict(conv.state_dict(), strict=False)  # its lin_skip exists regardless
    x, edge_index = features(), MASKS["random"]
    edge_attr = (
        torch.randn(edge_index.size(1), 3, dtype=torch.float64) if "edge_dim" in kwargs else None
    )
    if shuffle:  # edges (and their features) in a random order, not sorted by target
        _, edge_index, *rest = shuffled(edge_index, *([] if edge_attr is None else [edge_attr]))
        edge_attr = rest[0] if rest else None
    out, (ei, alpha) = conv(x, edge_index, edge_attr, return_attention_weights=True)
    ref, (_, ref_alpha) = reference(x, edge_index, edge_attr, return_attention_weights=True)
    assert ei is edge_index  # alpha is reported in the caller's edge order
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(alpha, ref_alpha, atol=1e-12, rtol=0)


def test_bipartite_input_equals_transformer_conv():
    conv = make_conv(in_channels=(5, 6))
    reference = TransformerConv((5, 6), 4, heads=2).double().eval()
    reference.load_state_dict(conv.state_dict())
    x = (features(n=7, dim=5), features(n=9))
    edge_index = cross_mask(7, 9, joint=False)
    torch.testing.assert_close(conv(x, edge_index), reference(x, edge_index), atol=1e-12, rtol=0)


def test_lazy_sizes_work_under_to_hetero():
    """``in_channels=-1`` as PyG's convs: ``to_hetero`` builds one layer per edge type, and
    the target type's output equals that bipartite layer run alone."""
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = MaskedAttentionConv((-1, -1), 4, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    x = {"paper": features(n=7, dim=5, dtype=torch.float32), "author": features(n=9, seed=2)}
    x = {key: value.float() for key, value in x.items()}
    edges = {("paper", "written_by", "author"): cross_mask(7, 9, joint=False)}
    model = to_hetero(Net(), (list(x), list(edges)), aggr="sum")
    out = model(x, edges)
    (conv,) = model.conv.values()
    torch.testing.assert_close(out["author"], conv((x["paper"], x["author"]), *edges.values()))
    assert conv.lin_key.weight.shape == (8, 5) and conv.lin_query.weight.shape == (8, 6)
    with pytest.raises(ValueError, match=r"x_src must be a \[num_nodes, 5\]"):
        conv((x["author"], x["author"]), *edges.values())  # sizes fixed by the first call
    with pytest.raises(ValueError, match=r"a pair \(x_src, x_dst\), got tuple"):  # (unpacking)
        conv((x["paper"], x["author"], x["author"]), *edges.values())
    with pytest.raises(ValueError, match="x_src and x_dst must both be tensors"):
        conv((x["paper"], None), *edges.values())
    (ei,) = edges.values()  # (an error from a meta tensor's .item() in the band detection)
    with pytest.raises(ValueError, match="the edges are on meta but x is on cpu"):
        conv((x["paper"], x["author"]), ei.to("meta"))


# ---------------------------------------------------------------- Prop. 1 / Def. 10 (T8)
@pytest.mark.parametrize("name", ["full", "causal", "random", "graph", "cross", "siblings"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_attention_is_stochastic_and_convex(name, shuffle):
    perm, edge_index = shuffled(MASKS[name]) if shuffle else (None, MASKS[name])
    conv = make_conv(root_weight=False, heads=1)
    x = features()
    out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    if shuffle:  # the same weights as for the sorted mask, permuted with the edges
        sorted_out, (_, sorted_alpha) = conv(x, MASKS[name], return_attention_weights=True)
        torch.testing.assert_close(alpha, sorted_alpha[perm], atol=1e-12, rtol=0)
        torch.testing.assert_close(out, sorted_out, atol=1e-12, rtol=0)
    assert bool((alpha > 0).all())
    sums = scatter(alpha, edge_index[1], dim=0, dim_size=N, reduce="sum")
    has_in = torch.zeros(N, dtype=torch.bool)
    has_in[edge_index[1]] = True
    torch.testing.assert_close(sums[has_in], torch.ones_like(sums[has_in]), atol=1e-12, rtol=0)
    values = conv.lin_value(x)
    low = scatter(values[edge_index[0]], edge_index[1], dim=0, dim_size=N, reduce="min")
    high = scatter(values[edge_index[0]], edge_index[1], dim=0, dim_size=N, reduce="max")
    assert bool((out[has_in] >= low[has_in] - 1e-12).all())
    assert bool((out[has_in] <= high[has_in] + 1e-12).all())


@pytest.mark.parametrize("edge_dim", [None, 3], ids=["plain", "edge_features"])
def test_half_precision_sums_a_wide_softmax_in_float32(edge_dim):
    """A bf16 layer whose targets have 2,048 incoming edges (global tokens) errs against
    its float64 copy (same rounded weights and inputs) as little as the float64 output
    rounded once, give or take the bf16 projections: its logits, softmax and sums run in
    float32. With the softmax summed in bf16 the output erred by 41%."""
    gen = torch.Generator().manual_seed(0)
    n, targets = 2048, 16
    edge_index = torch.stack(
        [torch.arange(n).repeat(targets), torch.arange(targets).repeat_interleave(n)]
    )
    x = torch.randn(n, 32, generator=gen).bfloat16()
    edge_attr = None if edge_dim is None else torch.randn(n * targets, 3, generator=gen)
    layer = MaskedAttentionConv(32, 8, heads=4, edge_dim=edge_dim).bfloat16().eval()
    wide = copy.deepcopy(layer).double()
    out, (_, alpha) = layer(
        x, edge_index, None if edge_attr is None else edge_attr.bfloat16(), True
    )
    want, (_, want_alpha) = wide(
        x.double(), edge_index, None if edge_attr is None else edge_attr.bfloat16().double(), True
    )
    out, want = out[:targets], want[:targets]
    assert relative_error(out, want) <= 2 * rounding_error(want, torch.bfloat16)
    assert relative_error(alpha, want_alpha) <= 2 * rounding_error(want_alpha, torch.bfloat16)
    assert out.dtype == alpha.dtype == torch.bfloat16


@pytest.mark.parametrize("structured", [True, False])
def test_constant_values_give_constant_output(structured):
    conv = make_conv(root_weight=False, structured=structured)
    with torch.no_grad():
        conv.lin_value.weight.zero_()
        conv.lin_value.bias.fill_(0.7)
    out = conv(features(), MASKS["window"])
    torch.testing.assert_close(out, torch.full_like(out, 0.7), atol=1e-12, rtol=0)


def test_isolated_targets_get_root_term_only_and_no_nan():
    """Encoder rows of the joint cross graph have no incoming edge."""
    edge_index = cross_mask(4, 5)
    conv = make_conv()
    x = features(n=9).requires_grad_()
    out = conv(x, edge_index)
    torch.testing.assert_close(out[:4], conv.lin_skip(x[:4]), atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    empty = conv(x, torch.empty(2, 0, dtype=torch.long))
    torch.testing.assert_close(empty, conv.lin_skip(x), atol=1e-12, rtol=0)
    for bias in (x.new_zeros(0), x.new_zeros(0, conv.heads)):  # a logit bias of no edges
        empty = conv(x, torch.empty(2, 0, dtype=torch.long), bias)
        torch.testing.assert_close(empty, conv.lin_skip(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("shuffle", [False, True])
def test_additive_logit_bias_equals_dense_float_mask(shuffle):
    edge_index = MASKS["random"]
    conv = make_conv(root_weight=False)
    x = features()
    bias = torch.randn(edge_index.size(1), 2, dtype=torch.float64)
    if shuffle:  # each bias stays with its edge
        _, edge_index, bias = shuffled(edge_index, bias, seed=3)
    attn_bias = torch.full((2, N, N), float("-inf"), dtype=torch.float64)
    attn_bias[:, edge_index[1], edge_index[0]] = bias.T
    q, k, v = (
        lin(x).view(N, 2, 4).transpose(0, 1)
        for lin in (conv.lin_query, conv.lin_key, conv.lin_value)
    )
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias).transpose(0, 1).reshape(N, 8)
    out, (_, alpha) = conv(x, edge_index, bias, return_attention_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    weights = (q @ k.transpose(1, 2) / 2 + attn_bias).softmax(-1)  # [H, query, key], C = 4
    torch.testing.assert_close(alpha, weights[:, edge_index[1], edge_index[0]].T)
    shared = conv(x, edge_index, bias[:, 0])  # [E]: one bias for all heads
    torch.testing.assert_close(shared, conv(x, edge_index, bias[:, :1].expand(-1, 2).contiguous()))


# ---------------------------------------------------------------- locality (T2, T3, T4)
@pytest.mark.parametrize("structured", [True, False])
def test_causality_and_prefix_consistency(structured):
    conv = make_conv(structured=structured)
    x = features()
    out = conv(x, causal_mask(N))
    changed = x.clone()
    changed[15:] += 1.0
    torch.testing.assert_close(conv(changed, causal_mask(N))[:15], out[:15], atol=0, rtol=0)
    torch.testing.assert_close(conv(x[:10], causal_mask(10)), out[:10], atol=1e-12, rtol=0)
    prepended = torch.cat([features(n=3, seed=9), x])
    assert not torch.allclose(conv(prepended, causal_mask(N + 3))[3:], out)


@pytest.mark.parametrize("structured", [True, False])
def test_causal_window_locality_and_local_shift_equivariance(structured):
    p, m = 3, 5
    conv = make_conv(structured=structured)
    x = features().requires_grad_()
    out = conv(x, window_mask(N, p, causal=True))
    probe = torch.randn_like(out)  # generic weights: no accidental cancellation
    rows = [
        torch.autograd.grad((out[i] * probe[i]).sum(), x, retain_graph=True)[0] for i in range(N)
    ]
    reach = torch.stack(rows).abs().sum(dim=-1) > 0  # [query, key]: d out_i / d x_k != 0
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    assert torch.equal(reach, (j <= i) & (j >= i - p))
    shifted = conv(torch.cat([features(n=m, seed=5), x]), window_mask(N + m, p, causal=True))
    torch.testing.assert_close(shifted[m + p :], out[p:], atol=1e-12, rtol=0)
    assert not torch.allclose(shifted[m : m + p], out[:p])


def test_window_zero_is_pointwise_value():
    conv = make_conv(root_weight=False)
    x = features()
    torch.testing.assert_close(conv(x, window_mask(N, 0)), conv.lin_value(x), atol=1e-12, rtol=0)


# ---------------------------------------------------------------- batches (T10)
@pytest.mark.parametrize("structured", [True, False])
def test_batch_equals_separate_sequences(structured):
    lengths = [7, 3, 12, 1]
    x = features(n=sum(lengths))
    conv = make_conv(structured=structured)
    batch = sequence_batch(lengths, window_mask, x=x, p=2, causal=True)
    out = conv(batch.x, batch.edge_index)
    for g, n in enumerate(lengths):
        start = int(batch.ptr[g])
        alone = conv(x[start : start + n], window_mask(n, 2, causal=True))
        torch.testing.assert_close(out[start : start + n], alone, atol=1e-12, rtol=0)
    order = [2, 0, 3, 1]
    reordered = sequence_batch(
        [lengths[g] for g in order],
        window_mask,
        x=torch.cat([batch.get_example(g).x for g in order]),
        p=2,
        causal=True,
    )
    expected = torch.cat([out[int(batch.ptr[g]) : int(batch.ptr[g + 1])] for g in order])
    torch.testing.assert_close(
        conv(reordered.x, reordered.edge_index), expected, atol=1e-12, rtol=0
    )


# ---------------------------------------------------------------- equivariance (T1, T2, T5, T6)
ALL_PERMS_6 = torch.tensor(list(itertools.permutations(range(6))))


def equivariant_perms(conv, x, edge_index, relabel_graph=False):
    """Every permutation of S_6 that passes, as a [k, 6] tensor (float64, generic):
    all 720 in one batched call (``equivariance_errors``), checked against the
    one-at-a-time ``equivariance_error`` on a few of them."""
    errors = equivariance_errors(conv, x, edge_index, ALL_PERMS_6, relabel_graph)
    for i in (0, 1, 100, 719):
        one = equivariance_error(conv, x, edge_index, ALL_PERMS_6[i], relabel_graph)
        assert abs(one - float(errors[i])) <= 1e-12
    assert bool(((errors <= 1e-10) | (errors > 1e-6)).all())  # no borderline cases
    return ALL_PERMS_6[errors <= 1e-10]


@pytest.mark.parametrize(
    "edge_index,group_size",
    [
        (full_mask(6), 720),  # S_6
        (causal_mask(6), 1),  # identity only
        (window_mask(6, 1, causal=True), 1),  # identity only
        (window_mask(6, 3), 4),  # reversal and twins (note §4.4)
        (block_diagonal_mask([2, 2, 2]), 48),  # S_2 wr S_3
        (random_mask(6, 14, seed=2), None),  # Aut(mask), whatever it is
        (cross_mask(3, 3), 36),  # S_3 x S_3, no swap of the sides
    ],
    ids=["full", "causal", "causal_window", "window3", "blocks", "random", "cross_joint"],
)
def test_equivariant_set_is_exactly_aut(edge_index, group_size):
    """Brute force over the 720 permutations of n = 6: the layer is equivariant
    exactly to Aut(mask) (note §2 table)."""
    conv = make_conv(root_weight=False, structured=False)
    passed = equivariant_perms(conv, features(n=6), edge_index)
    assert torch.equal(passed, automorphisms(edge_index, 6))
    assert group_size is None or passed.size(0) == group_size
    if group_size == 36:
        assert bool((passed[:, :3] < 3).all())  # encoders stay encoders


def test_graph_attention_is_equivariant_under_joint_relabelling():
    edge_index = random_mask(6, 14, seed=3)
    conv = make_conv(structured=False)
    assert equivariant_perms(conv, features(n=6), edge_index, relabel_graph=True).size(0) == 720


def test_cross_attention_block_equivariance():
    """f(X[pX], Y[pY]) = f(X, Y)[pY] for all pX, pY (m = n = 3): equivariant in the
    decoder queries, invariant in the encoder keys/values."""
    conv = make_conv(in_channels=(5, 6))
    x = (features(n=3, dim=5), features(n=3))
    edge_index = cross_mask(3, 3, joint=False)
    perms = list(itertools.permutations(range(3)))
    for p_src, p_dst in itertools.product(perms, perms):
        assert check_equivariance(conv, x, edge_index, (torch.tensor(p_src), torch.tensor(p_dst)))


def test_check_equivariance_detects_failures_and_bad_use():
    conv, x = make_conv(), features(n=6)
    shift = torch.roll(torch.arange(6), 1)
    assert not check_equivariance(conv, x, causal_mask(6), shift)  # T3: shift fails
    assert check_equivariance(conv, x, full_mask(6), shift)
    conv.train()
    with pytest.raises(ValueError, match="training mode"):
        check_equivariance(conv, x, full_mask(6), shift)
    conv.eval()
    with pytest.raises(TypeError, match="pair of permutations"):
        check_equivariance(conv, x, full_mask(6), (shift, shift))
    with pytest.raises(ValueError, match=r"perms must be \[P, n = 6\] rows, each a perm"):
        equivariance_errors(conv, x, full_mask(6), shift)
    # not permutations: refused (they gave an error value)
    with pytest.raises(ValueError, match=r"perms must be .*, got \[\[0, 0, 1, 2, 3, 4\]\]"):
        equivariance_errors(conv, x, full_mask(6), torch.tensor([[0, 0, 1, 2, 3, 4]]))
    for perm in (torch.tensor([0, 0, 1, 2, 3, 4]), shift[:5], shift.float()):
        with pytest.raises(ValueError, match=r"^perm must be a permutation of 0 \.\. 5"):
            equivariance_error(conv, x, full_mask(6), perm)
    with pytest.raises(ValueError, match=r"^perm must be a permutation of 0 \.\. 2"):
        equivariance_error(conv, (x, x[:3]), full_mask(6)[:, :3], (shift, torch.zeros(3).long()))
    with pytest.raises(TypeError, match="single x"):
        equivariance_errors(conv, (x, x), full_mask(6), shift[None])
    assert torch.equal(relabel(full_mask(6), shift).sort(dim=1)[0], full_mask(6).sort(dim=1)[0])


# ---------------------------------------------------------------- dropout and training
@pytest.mark.parametrize("name", ["window", "random"])
def test_dropout_only_in_training(name):
    conv = make_conv(dropout=0.5)
    x = features()
    eval_out = conv(x, MASKS[name])
    torch.testing.assert_close(conv(x, MASKS[name]), eval_out)
    conv.train()
    out = conv(x, MASKS[name])
    assert torch.isfinite(out).all() and not torch.allclose(out, eval_out)


def test_dropout_drops_the_edge_feature_messages_with_the_same_mask():
    """Training mode with ``edge_dim``: the value and edge-feature messages are weighted
    by the same dropped-out alpha. Zero queries (uniform alpha), values that are the
    constant ``b`` and edge features embedded to ``b`` too: with the dropout mask fixed
    by the seed, each target then gets ``s b`` from either part (``s`` its kept weight)."""
    conv = make_conv(root_weight=False, edge_dim=1, dropout=0.5).train()
    b = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
    with torch.no_grad():
        for lin in (conv.lin_query, conv.lin_value):
            lin.weight.zero_()
            lin.bias.zero_()
        conv.lin_value.bias.copy_(b)
        conv.lin_edge.weight.copy_(b[:, None])
    x, edge_index = features(), shuffled(MASKS["random"])[1]
    ones = torch.ones(edge_index.size(1), 1, dtype=torch.float64)
    torch.manual_seed(7)
    values_only = conv(x, edge_index, 0 * ones)
    torch.manual_seed(7)
    both = conv(x, edge_index, ones)
    kept = values_only / b  # s per target and head: < 1 where dropout removed weight
    assert not torch.allclose(kept, torch.ones_like(kept))
    torch.testing.assert_close(both, 2 * values_only, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- per-graph structure
def structure_calls(monkeypatch) -> dict[str, int]:
    """Counts of band recognitions and edge-CSR builds of the layer, from now on."""
    calls = {"detect": 0, "csr": 0}
    detect, csr = BandMask.detect, conv_module.EdgeCSR

    def counting_detect(*args, **kwargs):
        calls["detect"] += 1
        return detect(*args, **kwargs)

    def counting_csr(*args, **kwargs):
        calls["csr"] += 1
        return csr(*args, **kwargs)

    monkeypatch.setattr(BandMask, "detect", staticmethod(counting_detect))
    monkeypatch.setattr(conv_module, "EdgeCSR", counting_csr)
    return calls


@pytest.mark.parametrize("name, what", [("window", "detect"), ("random", "csr")])
def test_structure_is_derived_once_per_graph(name, what, monkeypatch):
    """The band (fast path) or the target-sorted CSR (edge path) of a graph is derived on
    its first call and reused while the same unmodified tensor comes back."""
    calls = structure_calls(monkeypatch)
    conv, x = make_conv().train(), features().requires_grad_()
    edge_index = shuffled(MASKS[name])[1] if name == "random" else MASKS[name].clone()
    for _ in range(3):  # a training loop over one graph
        conv(x, edge_index).square().sum().backward()
    assert calls[what] == 1
    edge_index[0, 0] = edge_index[0, 0]  # written in place: derived again
    conv(x, edge_index)
    assert calls[what] == 2
    conv(x, edge_index.clone())  # another tensor
    assert calls[what] == 3
    conv(x, edge_index)  # the last graph only is kept: derived again
    conv(x, edge_index)
    assert calls[what] == 4
    conv(features(N + 3), edge_index)  # other node counts, the same tensor
    assert calls[what] == 5
    adj = adjacency(edge_index, layout="csr")  # an adjacency: keyed on the adjacency
    for _ in range(2):
        conv(x, adj)
    assert calls[what] == 6
    if name == "random":  # that the graph is no band is remembered as well
        assert calls["detect"] == 6


def test_band_and_edge_structures_of_one_graph_are_kept_together(monkeypatch):
    calls = structure_calls(monkeypatch)
    conv, x, edge_index = make_conv(), features(), MASKS["window"].clone()
    for _ in range(2):
        conv(x, edge_index)  # the fast path: the band
        conv(x, edge_index, return_attention_weights=True)  # the edge path: the CSR
    assert calls == {"detect": 1, "csr": 1}
    band = BandMask.detect(MASKS["window"], N)  # a BandMask input derives nothing
    calls["detect"] = 0
    for _ in range(2):
        conv(x, band, return_attention_weights=True)
    assert calls == {"detect": 0, "csr": 3}


@pytest.mark.parametrize("name", ["window", "random", "block_diagonal"])
@pytest.mark.parametrize("adj", [False, True])
def test_cached_structure_gives_the_same_outputs_and_gradients(name, adj):
    """float64: the cached path equals the path that derives the structure every call."""
    conv = make_conv().train()  # no dropout: deterministic in training mode too
    edge_index = shuffled(MASKS[name])[1] if name == "random" else MASKS[name]
    source = adjacency(edge_index, layout="csc") if adj else edge_index

    def run(clear: bool, **kwargs):
        if clear:
            conv._edges.cache.clear()  # the behaviour without the cache: derived every call
        x = features().requires_grad_()
        out = conv(x, source, **kwargs)
        out, alpha = (out[0], [out[1][1]]) if isinstance(out, tuple) else (out, [])
        grads = torch.autograd.grad(out.square().sum(), [x, *conv.parameters()])
        return [out, *alpha, *grads]

    for kwargs in ({}, {"return_attention_weights": True}):
        reference = run(clear=True, **kwargs)
        run(clear=False, **kwargs)
        for cached, fresh in zip(run(clear=False, **kwargs), reference, strict=True):
            torch.testing.assert_close(cached, fresh, atol=1e-12, rtol=0)
    run(clear=False)
    # the checked ids, the band (or its absence) and the CSR
    assert len(conv._edges.cache.structures) == 3


def test_cache_does_not_keep_graphs_alive():
    import gc
    import weakref

    conv, x = make_conv(), features()
    edge_index = MASKS["window"].clone()
    conv(x, edge_index)  # the band holds no tensor: dropped with the graph
    ref = weakref.ref(edge_index)
    del edge_index
    gc.collect()
    assert ref() is None and conv._edges.cache.structures is None
    edge_index = MASKS["random"].clone()  # sorted: the CSR holds the graph's own tensor
    conv(x, edge_index)
    ref = weakref.ref(edge_index)
    del edge_index
    gc.collect()
    conv(x, MASKS["random"].clone())  # the next graph replaces it
    gc.collect()
    assert ref() is None


def test_band_recognition_syncs_on_the_first_call_only():
    """On an accelerator, recognising the band reads ids on the host once per graph."""
    from tests.host_sync import first_and_second_call_syncs

    conv, x, edge_index = make_conv(), features().requires_grad_(), MASKS["window"].clone()
    first, second = first_and_second_call_syncs(lambda: conv(x, edge_index).sum().backward())
    assert any("band.py" in sync for sync in first)
    assert second == []


def test_inference_mode_caches_nothing_and_takes_inference_tensors():
    conv, x = make_conv(), features()
    with torch.inference_mode():
        ref = conv(x, MASKS["random"])
        inference_edges = MASKS["random"].clone()  # no version counter to key on
        assert torch.equal(conv(x, inference_edges), ref)
        with pytest.raises(ValueError, match="out of range"):  # and still checked
            conv(x, inference_edges + N)
    assert conv._edges.cache.structures is None
    out = conv(x.clone().requires_grad_(), MASKS["random"])  # training after inference
    out.sum().backward()
    torch.testing.assert_close(out.detach(), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["window", "random"])
def test_full_dropout_leaves_the_root_term(name):
    """dropout=1 (accepted, as by torch.nn.Dropout) drops every attention weight."""
    conv, x = make_conv(dropout=1.0).train(), features()
    torch.testing.assert_close(conv(x, MASKS[name]), conv.lin_skip(x), atol=1e-12, rtol=0)


# ---------------------------------------------------------------- bad inputs and repr
@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda c, x: c(x, MASKS["window"].float()), TypeError, "int64 or int32 tensor"),
        (lambda c, x: c(x, MASKS["window"][:1]), ValueError, r"shape \[2, E\]"),
        (lambda c, x: c(x, MASKS["window"] + N), ValueError, "out of range"),
        (lambda c, x: c(x, MASKS["random"], torch.zeros(3)), ValueError, "logit bias of shape"),
    ],
)
def test_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call(make_conv(), features())


def test_bad_edge_features_and_arguments():
    conv = make_conv(edge_dim=3)
    for mask in (MASKS["random"], MASKS["window"], window_mask(N, 1)):  # (banded: ignored)
        with pytest.raises(ValueError, match="pass edge_attr"):
            conv(features(), mask)
    for edge_dim, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match="edge_dim must be"):
            MaskedAttentionConv(6, 4, edge_dim=edge_dim)
    with pytest.raises(ValueError, match=r"\[E, edge_dim\]"):
        conv(features(), MASKS["random"], torch.zeros(90, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\]"):
        MaskedAttentionConv(6, 4, dropout=1.5)


def test_repr_and_reset():
    conv = MaskedAttentionConv(6, 4, heads=2)
    assert repr(conv) == "MaskedAttentionConv(6, 4, heads=2)"
    before = conv.lin_query.weight.clone()
    conv.reset_parameters()
    assert not torch.equal(before, conv.lin_query.weight)


def test_numpy_integer_sizes():
    """A NumPy ``in_channels`` passed the argument check and then failed to unpack as a
    pair ("cannot unpack non-iterable numpy.int64 object")."""
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.manual_seed(0)
    expected = MaskedAttentionConv(8, 4, heads=2)(x, edge_index)
    for in_channels in (np.int64(8), (np.int64(8), np.int32(8))):
        torch.manual_seed(0)
        conv = MaskedAttentionConv(in_channels, np.int64(4), heads=np.int64(2))
        assert torch.equal(conv(x, edge_index), expected)
