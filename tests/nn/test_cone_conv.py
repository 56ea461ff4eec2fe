"""ConeConv against a dense masked reference (float64), PyG conventions, sparse adjacency."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import coalesce, to_dense_adj

from hiergraph.nn.cone_conv import ConeConv
from hiergraph.ops.cone import penumbral, umbral
from tests.conftest import spy_calls
from tests.nn import sparse_inputs
from tests.nn.sparse_inputs import LAYOUTS

N, F_IN = 9, 6


def graph(seed=0, num_edges=25, shuffle=False):
    """A coalesced random graph with some existing self loops and an isolated node;
    ``shuffle``: its edges in a random order (coalesce sorts them by source)."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N - 1, (2, num_edges), generator=gen)  # node N-1 isolated
    edge_index = torch.cat([edge_index, torch.tensor([[0, 3], [0, 3]])], dim=1)
    x = torch.randn(N, F_IN, generator=gen, dtype=torch.float64)
    edge_index = coalesce(edge_index, num_nodes=N)
    return x, shuffled(edge_index) if shuffle else edge_index


def shuffled(edge_index, seed=11):
    """The edges in a random order (alpha is then checked against it edge by edge)."""
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(seed))
    return edge_index[:, perm]


def dense_scores(variant, q, k, conv):
    """Scores ``[heads, N, N]`` (query i, key j) from dense references."""
    q, k = q.transpose(0, 1), k.transpose(0, 1)
    if variant == "dot":
        return q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if variant == "penumbral":
        return penumbral(q, k, r=conv.r, gamma=conv.gamma, squared=conv.squared)
    return umbral(q, k, r=conv.r, gamma=conv.gamma, height_scale=conv.height_scale)


def dense_reference(conv, x, edge_index, drop=lambda projected: projected):
    """Masked dense softmax attention over ``A + I``; returns output and weights ``[H, N, N]``.

    ``drop`` is applied to the projected features (values, then separate queries/keys)."""
    H, C = conv.heads, conv.out_channels
    value = drop(conv.lin(x).view(N, H, C))
    if conv.share_qk:
        query = key = value
    else:
        query, key = drop(conv.lin_qk(x)).view(N, 2, H, conv.qk_channels).unbind(1)
    allowed = to_dense_adj(edge_index, max_num_nodes=N)[0].T.bool() | torch.eye(N, dtype=torch.bool)
    return masked_attention(conv, query, key, value, allowed)


def masked_attention(conv, query, key, value, allowed):
    """Dense softmax attention of ``query [N_dst, H, d]`` over the ``allowed [N_dst, N_src]``
    keys; returns the layer's output and the weights ``[H, N_dst, N_src]``."""
    scores = dense_scores(conv.variant, query, key, conv).masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    out = (weights @ value.transpose(0, 1)).transpose(0, 1)  # [N_dst, H, C]
    out = out.flatten(1) if conv.concat else out.mean(dim=1)
    return out + conv.bias, weights


@pytest.mark.parametrize("variant", ["penumbral", "umbral", "dot"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"heads": 3, "concat": True},
        {"heads": 2, "concat": False, "gamma": 2.5, "r": 0.6},
        {"heads": 2, "share_qk": False, "qk_channels": 5},
        {"heads": 1, "squared": True, "height_scale": 0.25},
        {"heads": 2, "squared": True, "height_scale": None},  # the authors' conventions
    ],
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_dense_masked_reference(variant, kwargs, shuffle):
    torch.manual_seed(0)
    x, edge_index = graph(shuffle=shuffle)
    conv = ConeConv(F_IN, 4, variant=variant, **kwargs).double()
    out, (ei, alpha) = conv(x, edge_index, return_attention_weights=True)
    ref, weights = dense_reference(conv, x, edge_index)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(alpha, weights[:, ei[1], ei[0]].T)
    sums = torch.zeros(N, conv.heads, dtype=alpha.dtype).index_add_(0, ei[1], alpha)
    torch.testing.assert_close(sums, torch.ones_like(sums))
    for flag in (None, False):  # no weights: the output alone
        torch.testing.assert_close(conv(x, edge_index, return_attention_weights=flag), out)


def bipartite_graph(num_src=9, num_dst=5, num_edges=20, seed=5, shuffle=False):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.stack(
        [torch.randint(0, num_src, (num_edges,), generator=gen),
         torch.randint(0, num_dst, (num_edges,), generator=gen)]
    )  # fmt: skip
    return (shuffled(coalesce(edge_index)) if shuffle else coalesce(edge_index)), gen


@pytest.mark.parametrize("variant", ["penumbral", "umbral", "dot"])
@pytest.mark.parametrize("share_qk", [True, False])
def test_bipartite_pair_equals_the_graph_on_the_union(variant, share_qk):
    """``x = (x_src, x_dst)`` with ``x_dst`` the first sources: the targets' rows of the
    homogeneous layer on ``x_src`` (self loops of the first ``N_dst`` nodes on both sides)."""
    torch.manual_seed(6)
    edge_index, gen = bipartite_graph()
    x_src = torch.randn(9, F_IN, generator=gen, dtype=torch.float64)
    conv = ConeConv(F_IN, 4, heads=2, variant=variant, share_qk=share_qk).double()
    out, (ei, alpha) = conv((x_src, x_src[:5].clone()), edge_index, return_attention_weights=True)
    full, (full_ei, full_alpha) = conv(x_src, edge_index, return_attention_weights=True)
    assert out.shape == (5, 8)
    torch.testing.assert_close(out, full[:5], atol=1e-12, rtol=0)
    into_targets = full_ei[1] < 5
    torch.testing.assert_close(ei, full_ei[:, into_targets])
    torch.testing.assert_close(alpha, full_alpha[into_targets], atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["penumbral", "umbral", "dot"])
@pytest.mark.parametrize("share_qk", [True, False])
@pytest.mark.parametrize("shuffle", [False, True])
def test_bipartite_two_input_sizes_match_dense_reference(variant, share_qk, shuffle):
    torch.manual_seed(7)
    edge_index, gen = bipartite_graph(shuffle=shuffle)
    x_src = torch.randn(9, F_IN, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    conv = ConeConv((F_IN, 3), 4, heads=2, variant=variant, share_qk=share_qk, qk_channels=5)
    conv = conv.double()
    out, (ei, alpha) = conv((x_src, x_dst), edge_index, return_attention_weights=True)
    d = conv.qk_channels
    value = conv.lin(x_src).view(9, 2, 4)
    key = value if share_qk else conv.lin_qk(x_src).view(9, 2, d)
    query = conv.lin_dst(x_dst).view(5, 2, d)
    allowed = to_dense_adj(edge_index, max_num_nodes=9)[0].T.bool()[:5]
    allowed[:, :5] |= torch.eye(5, dtype=torch.bool)  # self loops of the first 5 nodes
    ref, weights = masked_attention(conv, query, key, value, allowed)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(alpha, weights[:, ei[1], ei[0]].T, atol=1e-12, rtol=0)
    out.square().sum().backward()
    assert conv.lin_dst.weight.grad.abs().sum() > 0  # the queries' own projection is trained


def test_lazy_sizes_work_under_to_hetero():
    """``in_channels=-1`` as PyG's convs: ``to_hetero`` builds one layer per edge type, and
    the target type's output equals that bipartite layer run alone."""
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ConeConv((-1, -1), 4, heads=2, variant="umbral", add_self_loops=False)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    edge_index, gen = bipartite_graph()
    x = {"paper": torch.randn(9, F_IN, generator=gen), "author": torch.randn(5, 3, generator=gen)}
    edges = {("paper", "written_by", "author"): edge_index}
    metadata = (list(x), list(edges))
    model = to_hetero(Net(), metadata, aggr="sum")
    out = model(x, edges)
    (conv,) = model.conv.values()
    torch.testing.assert_close(out["author"], conv((x["paper"], x["author"]), edge_index))
    assert conv.lin.weight.shape == (8, F_IN) and conv.lin_dst.weight.shape == (8, 3)


def test_without_self_loops_isolated_node_gets_zero_message():
    torch.manual_seed(1)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2, add_self_loops=False).double()
    out = conv(x, edge_index)
    torch.testing.assert_close(out[N - 1], conv.bias)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_gradcheck(variant, shuffle):
    torch.manual_seed(2)
    x, edge_index = graph(num_edges=12, shuffle=shuffle)
    conv = ConeConv(F_IN, 3, heads=2, variant=variant).double()
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda inp: conv(inp, edge_index), (x,))


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
def test_finite_gradients_with_self_loops_float32(variant):
    torch.manual_seed(3)
    x, edge_index = graph()
    x = (x.float() * 50).requires_grad_()
    conv = ConeConv(F_IN, 4, heads=2, variant=variant)
    conv(x, edge_index).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in conv.parameters())


@pytest.mark.parametrize("shuffle", [False, True])
def test_learned_per_head_temperature_matches_dense_reference(shuffle):
    torch.manual_seed(9)
    x, edge_index = graph(shuffle=shuffle)
    conv = ConeConv(F_IN, 4, heads=3, variant="umbral", gamma=2.0, learn_gamma=True).double()
    torch.testing.assert_close(conv.log_gamma.exp(), torch.full((3,), 2.0, dtype=torch.float64))
    with torch.no_grad():
        conv.log_gamma.copy_(torch.tensor([-1.0, 0.0, 0.7]))
    out, (ei, alpha) = conv(x, edge_index, return_attention_weights=True)
    value = conv.lin(x).view(N, 3, 4).transpose(0, 1)
    allowed = to_dense_adj(edge_index, max_num_nodes=N)[0].T.bool() | torch.eye(N, dtype=torch.bool)
    scores = umbral(value, value, r=conv.r) * conv.log_gamma.exp().view(3, 1, 1)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    torch.testing.assert_close(alpha, weights[:, ei[1], ei[0]].T)
    out.square().sum().backward()
    assert conv.log_gamma.grad.abs().min() > 0  # every head's temperature is trained
    with pytest.raises(ValueError, match="learn_gamma"):
        ConeConv(F_IN, 4, variant="dot", learn_gamma=True)


@pytest.mark.parametrize("variant", ["penumbral", "umbral", "dot"])
def test_forward_backward_read_no_tensor_values(variant):
    """No ``.item()``/``int()`` on tensors (a host-device sync on accelerators) in the layer."""

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2, variant=variant)
    with RecordOps() as recorded:
        conv(x.float(), edge_index).sum().backward()
    assert "aten.index_select.default" in recorded.ops  # the mode does see the layer's ops
    assert "aten._local_scalar_dense.default" not in recorded.ops


def test_autocast_scores_in_float32():
    torch.manual_seed(4)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (_, alpha) = conv(x.float(), edge_index, return_attention_weights=True)
    assert alpha.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_reset_parameters_repr_and_shapes():
    conv = ConeConv(F_IN, 4, heads=3, variant="umbral")
    assert repr(conv) == "ConeConv(6, 4, heads=3, variant='umbral')"
    assert conv.r == 0.1 and ConeConv(F_IN, 4).r == 1.0
    x, edge_index = graph()
    assert conv(x.float(), edge_index).shape == (N, 12)
    assert ConeConv(F_IN, 4, heads=3, concat=False)(x.float(), edge_index).shape == (N, 4)
    torch.manual_seed(5)
    conv.reset_parameters()
    first = conv.lin.weight.detach().clone()
    torch.manual_seed(5)
    conv.reset_parameters()
    torch.testing.assert_close(conv.lin.weight, first)


def test_sparse_csr_features_match_dense():
    torch.manual_seed(8)
    x, edge_index = graph()
    x = x * (torch.rand(x.shape) < 0.3)
    conv = ConeConv(F_IN, 4, heads=2).double()
    out = conv(x.to_sparse_csr(), edge_index)
    out.square().sum().backward()
    grad = conv.lin.weight.grad.clone()
    conv.zero_grad()
    ref = conv(x, edge_index)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, conv.lin.weight.grad)


def test_dropout_only_in_training():
    torch.manual_seed(6)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2, dropout=0.5).double().eval()
    evaluated = conv(x, edge_index)
    torch.testing.assert_close(conv(x, edge_index), evaluated)
    conv.train()
    trained = conv(x, edge_index)
    assert torch.isfinite(trained).all() and not torch.allclose(trained, evaluated)


@pytest.mark.parametrize("variant", ["penumbral", "umbral"])
@pytest.mark.parametrize("share_qk", [True, False])
def test_feature_dropout_drops_the_projections_before_scoring(variant, share_qk):
    torch.manual_seed(8)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2, variant=variant, share_qk=share_qk, feature_dropout=0.5)
    conv = conv.double()
    torch.manual_seed(9)
    out = conv(x, edge_index)
    torch.manual_seed(9)  # the same dropout masks, drawn in the same order
    ref, _ = dense_reference(conv, x, edge_index, partial(torch.nn.functional.dropout, p=0.5))
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out, dense_reference(conv, x, edge_index)[0])
    conv.eval()
    torch.testing.assert_close(conv(x, edge_index), dense_reference(conv, x, edge_index)[0])


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="torch-sparse is not installed")
def test_sparse_tensor_adjacency_matches_edge_index():
    torch.manual_seed(7)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2).double()
    adj_t = SparseTensor.from_edge_index(edge_index, sparse_sizes=(N, N)).t()
    out, adj_alpha = conv(x, adj_t, return_attention_weights=True)
    torch.testing.assert_close(out, conv(x, edge_index))
    assert adj_alpha.storage.value().shape[-1] == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="variant must be one of"):
        ConeConv(F_IN, 4, variant="hyperbolic")
    with pytest.raises(ValueError, match=">= 2 query/key channels"):
        ConeConv(F_IN, 1)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        ConeConv(F_IN, 4, gamma=-1.0)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0, got inf"):
        ConeConv(F_IN, 4, gamma=float("inf"), learn_gamma=True)
    with pytest.raises(ValueError, match="the edges are on meta but x is on cpu"):  # (PyG)
        ConeConv(F_IN, 4).double()(graph()[0], graph()[1].to("meta"))
    with pytest.raises(ValueError, match=r"feature_dropout must be a probability in \[0, 1\]"):
        ConeConv(F_IN, 4, feature_dropout=1.5)
    with pytest.raises(ValueError, match="r must be a finite number > 0"):
        ConeConv(F_IN, 4, r=0.0)
    with pytest.raises(ValueError, match=r"\[num_nodes, in_channels\]"):
        ConeConv(F_IN, 4)(torch.randn(2, N, F_IN), graph()[1])  # (float32, as the layer)
    x, edge_index = graph()
    with pytest.raises(ValueError, match="both be tensors"):
        ConeConv(F_IN, 4)((x, None), edge_index)  # the queries need target features
    with pytest.raises(ValueError, match="a pair"):
        ConeConv(F_IN, 4)((x, x, x), edge_index)
    ConeConv(F_IN, 1, variant="dot")  # a 1-d dot product is fine


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((F_IN, 4), {"heads": 0}, "heads must be a positive int, got 0"),
        ((F_IN, 0), {"variant": "dot"}, "out_channels must be a positive int, got 0"),
        ((0, 4), {}, r"in_channels must be a positive int or -1 .*got 0"),
        (((F_IN, 0), 4), {}, r"in_channels\[1\] must be a positive int or -1"),
        (((F_IN, 3, 2), 4), {}, "in_channels must be an int or a pair"),
        ((F_IN, 4), {"share_qk": False, "qk_channels": 0}, "qk_channels must be a positive int"),
        ((F_IN, 4), {"dropout": 1.5}, "dropout must be a probability"),
    ],
)
def test_constructor_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConeConv(*args, **kwargs)


def test_wrong_feature_sizes_name_expected_and_actual():
    x, edge_index = graph()
    x = x.float()
    with pytest.raises(ValueError, match=r"x must have 6 features .*in_channels=6.*got 7"):
        ConeConv(F_IN, 4)(torch.randn(N, 7), edge_index)
    bipartite = ConeConv((F_IN, 3), 4, add_self_loops=False)
    with pytest.raises(ValueError, match=r"x_dst must have 3 features .*got 6"):
        bipartite((x, x), edge_index)
    with pytest.raises(ValueError, match=r"x_src must have 6 features .*got 3"):
        bipartite((x[:, :3], x[:, :3]), edge_index)
    assert bipartite((x, x[:, :3]), edge_index).shape == (N, 4)
    shared = ConeConv(F_IN, 4, add_self_loops=False)  # one size: the targets use it too
    with pytest.raises(ValueError, match=r"x_dst must have 6 features .*got 3"):
        shared((x, x[:, :3]), edge_index)
    lazy = ConeConv(-1, 4)
    assert lazy(x, edge_index).shape == (N, 4)  # the size is inferred on the first call
    with pytest.raises(ValueError, match=r"x must have 6 features .*got 5"):
        lazy(x[:, :5], edge_index)


def test_bad_edge_index_fails_with_a_clear_error():
    x, edge_index = graph()
    x = x.float()
    conv = ConeConv(F_IN, 4, heads=2)
    with pytest.raises(TypeError, match="int64 or int32 tensor of shape \\[2, E\\].*float32"):
        conv(x, edge_index.float())
    with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\], got \(3, 2\)"):
        conv(x, edge_index[:, :3].T)
    bad = edge_index.clone()
    bad[0, 5] = N
    with pytest.raises(
        ValueError, match=rf"sources \(row 0, keys\) span 0\.\.{N} for num_src = {N}"
    ):
        conv(x, bad)
    bad[0, 5] = -1
    with pytest.raises(ValueError, match="out of range"):
        conv(x, bad.int())  # int32 ids are accepted, and checked as well
    bipartite = ConeConv(F_IN, 4, add_self_loops=False)
    with pytest.raises(ValueError, match=r"targets \(row 1, queries\) span .* for num_dst = 4"):
        bipartite((x, x[:4]), edge_index)  # targets up to N - 1, but only 4 target nodes
    assert conv(x, edge_index.int()).shape == (N, 8)
    with pytest.raises(IndexError):  # validate=False: no id check (torch's own error)
        ConeConv(F_IN, 4, validate=False)(x, torch.tensor([[0, N + 3], [1, 2]]))


def test_edge_ids_are_read_once_per_edge_index_and_only_on_the_cpu(monkeypatch):
    import hiergraph.ops.edge_index as module
    from hiergraph._device import cpu_as_accelerator
    from tests.host_sync import HostSyncRecorder

    ranges = []
    check = module.check_edge_index

    def counting(edge_index, *args, check_range=True, **kwargs):
        ranges.append(check_range)
        return check(edge_index, *args, check_range=check_range, **kwargs)

    monkeypatch.setattr(module, "check_edge_index", counting)
    x, edge_index = graph()
    x = x.float()
    conv = ConeConv(F_IN, 4, heads=2)
    for _ in range(3):  # a training loop over one graph reads its ids once
        conv(x, edge_index)
    assert ranges.count(True) == 1 and ranges.count(False) == 3  # type and shape every call
    edge_index[0, 0] = edge_index[0, 0]  # written in place: read again
    conv(x, edge_index)
    conv(x, edge_index.clone())  # another tensor: read again
    assert ranges.count(True) == 3
    ranges.clear()
    ConeConv(F_IN, 4, validate=False)(x, edge_index)
    assert ranges == [False]
    ranges.clear()
    fresh = ConeConv(F_IN, 4, add_self_loops=False)
    with cpu_as_accelerator(), HostSyncRecorder() as rec:  # the accelerator branch
        fresh(x, edge_index.clone())
    assert ranges == [False, True] and rec.unique_syncs() == []  # a device-side assertion
    bad = torch.tensor([[0, N + 3], [1, 2]])
    with cpu_as_accelerator(), pytest.raises(RuntimeError, match="edge_index has ids out of"):
        ConeConv(F_IN, 4)(x, bad)  # before any kernel indexes with the ids
    # off the CPU the ids are never read on the host (a meta tensor's values cannot be)
    meta = torch.empty(2, 5, dtype=torch.long, device="meta")
    conv._edges(meta, N, N)
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        conv._edges(meta[:1], N, N)
    copy = __import__("copy").deepcopy(conv)  # the remembered tensor is not copied
    assert copy._edges.cache.ref is None and conv._edges.cache.ref is not None


def adjacency(edge_index, layout, num_src=N, num_dst=N):
    return sparse_inputs.adjacency(edge_index, num_src, num_dst, layout, dtype=torch.float32)


def dense_alpha(edge_index, alpha, num_src=N, num_dst=N):
    return sparse_inputs.dense_alpha(edge_index, alpha, num_src, num_dst)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("variant", ["penumbral", "dot"])
def test_torch_sparse_adjacency_matches_edge_index(layout, self_loops, variant):
    """A torch.sparse ``adj_t`` (row = target) gives the output and the attention weights of
    the equivalent (shuffled) ``edge_index``, the weights as an adjacency of its layout."""
    from hiergraph.ops.edge_index import adjacency_to_edge_index

    torch.manual_seed(7)
    x, edge_index = graph(shuffle=True)
    conv = ConeConv(F_IN, 4, heads=2, variant=variant, add_self_loops=self_loops).double()
    adj = adjacency(edge_index, layout)
    torch.testing.assert_close(conv(x, adj), conv(x, edge_index), atol=1e-12, rtol=0)
    out, (adj_alpha, alpha) = conv(x, adj, return_attention_weights=True)
    ref, (ref_ei, ref_alpha) = conv(x, edge_index, return_attention_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert adj_alpha.layout == adj.layout and adj_alpha.shape == (N, N, 2)
    expected = dense_alpha(ref_ei, ref_alpha)  # with the self loops, if added
    torch.testing.assert_close(adj_alpha.to_dense(), expected, atol=1e-12, rtol=0)
    stored, _ = adjacency_to_edge_index(adj_alpha, N, N)  # alpha in its stored order
    torch.testing.assert_close(alpha, expected[stored[1], stored[0]], atol=1e-12, rtol=0)
    if layout == "coo-uncoalesced" and not self_loops:  # the caller's edge order
        torch.testing.assert_close(alpha, ref_alpha, atol=1e-12, rtol=0)


def test_torch_sparse_adjacency_bipartite_and_orientation():
    torch.manual_seed(7)
    edge_index, gen = bipartite_graph(shuffle=True)
    x_src = torch.randn(9, F_IN, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(5, F_IN, generator=gen, dtype=torch.float64)
    conv = ConeConv(F_IN, 4, heads=2).double()
    expected = conv((x_src, x_dst), edge_index)
    for layout in LAYOUTS:
        adj = adjacency(edge_index, layout, x_src.size(0), x_dst.size(0))
        torch.testing.assert_close(conv((x_src, x_dst), adj), expected, atol=1e-12, rtol=0)
    transposed = adjacency(edge_index.flip(0), "coo", x_dst.size(0), x_src.size(0))
    with pytest.raises(ValueError, match=r"\[num_dst, num_src\] = \[5, 9\], got \[9, 5\]"):
        conv((x_src, x_dst), transposed)


def test_steady_state_forward_reads_no_values_at_all():
    """After the first call on an ``edge_index``, no value reaches the host (not even by
    ``tolist``, which the dispatch-level check above cannot see)."""
    reads = []

    class RecordReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append(str(func))
            return func(*args, **(kwargs or {}))

    tolist = torch.Tensor.tolist

    def recording_tolist(t):
        reads.append("tolist")
        return tolist(t)

    x, edge_index = graph()
    x = x.float()
    # the self loops are added once per graph (PyG's remove_self_loops, a boolean-mask sync
    # these two recorders would not see, runs on the first call only)
    for conv, first_call_reads in ((ConeConv(F_IN, 4, heads=2, add_self_loops=False), True),
                                   (ConeConv(F_IN, 4, heads=2), True),
                                   (ConeConv(F_IN, 4, validate=False, add_self_loops=False),
                                    False)):  # fmt: skip
        for call in range(2):
            reads.clear()
            with pytest.MonkeyPatch.context() as patch, RecordReads():
                patch.setattr(torch.Tensor, "tolist", recording_tolist)
                conv(x, edge_index).sum().backward()
            assert bool(reads) == (call == 0 and first_call_reads), reads


# ---------------------------------------------------------------- per-graph structure
def self_loop_calls(monkeypatch) -> list:
    """One entry per self-loop construction of the layer (PyG's add_self_loops), from now on."""
    import hiergraph.nn.cone_conv as module

    calls, real = [], module.add_self_loops
    monkeypatch.setattr(module, "add_self_loops", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_self_loops_are_added_once_per_graph(monkeypatch):
    calls = self_loop_calls(monkeypatch)
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2).double()
    for _ in range(3):  # a training loop over one graph
        conv(x, edge_index).sum().backward()
    assert len(calls) == 1
    edge_index[0, 0] = edge_index[0, 0]  # written in place: built again
    conv(x, edge_index)
    assert len(calls) == 2
    conv(x, edge_index.clone())  # another tensor
    assert len(calls) == 3
    conv(x, edge_index)  # the last graph only is kept: built again
    conv(x, edge_index)
    assert len(calls) == 4
    x_more = torch.cat([x, x[:2]])  # other node counts, the same tensor
    conv(x_more, edge_index)
    conv((x_more, x), edge_index)
    assert len(calls) == 6
    adj = adjacency(edge_index, "csr")  # an adjacency: keyed on the adjacency
    for _ in range(2):
        conv(x, adj)
    assert len(calls) == 7
    ConeConv(F_IN, 4, add_self_loops=False).double()(x, edge_index)
    assert len(calls) == 7


def test_returned_self_looped_edges_written_in_place_are_built_again(monkeypatch):
    calls = self_loop_calls(monkeypatch)
    x, edge_index = graph(shuffle=True)
    conv = ConeConv(F_IN, 4, heads=2).double()
    out, (looped, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert conv(x, edge_index, return_attention_weights=True)[1][0] is looped  # reused
    looped[0, -1] = 0  # the caller's copy of the layer's looped edges, overwritten
    again, (looped_again, alpha_again) = conv(x, edge_index, return_attention_weights=True)
    assert len(calls) == 2
    assert looped_again is not looped and looped_again[0, -1] == N - 1
    torch.testing.assert_close(again, out, atol=1e-12, rtol=0)
    torch.testing.assert_close(alpha_again, alpha, atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["penumbral", "umbral", "dot"])
@pytest.mark.parametrize("layout", [None, "coo", "csc"])
def test_cached_self_loops_give_the_same_outputs_and_gradients(variant, layout):
    x, edge_index = graph(shuffle=True)
    source = edge_index if layout is None else adjacency(edge_index, layout)
    conv = ConeConv(F_IN, 4, heads=2, variant=variant, learn_gamma=variant != "dot").double()

    def run(clear: bool):
        if clear:
            conv._edges.cache.clear()  # the behaviour without the cache: built every call
        xg = x.clone().requires_grad_()
        out, (_, alpha) = conv(xg, source, return_attention_weights=True)
        grads = torch.autograd.grad(out.square().sum(), [xg, *conv.parameters()])
        return [out, alpha, *grads]

    reference = run(clear=True)
    run(clear=False)
    assert len(conv._edges.cache.structures) == 2  # the checked ids and the looped edges
    for cached, fresh in zip(run(clear=False), reference, strict=True):
        torch.testing.assert_close(cached, fresh, atol=1e-12, rtol=0)


def test_cache_does_not_keep_graphs_alive():
    import gc
    import weakref

    x, edge_index = graph()
    conv = ConeConv(F_IN, 4).double()
    conv(x, edge_index)
    ref = weakref.ref(edge_index)
    assert conv._edges.cache.structures is not None
    del edge_index
    gc.collect()
    assert ref() is None and conv._edges.cache.structures is None


def test_self_loops_sync_on_the_first_call_only():
    """On an accelerator the self loops cost a host sync (a boolean mask) once per graph."""
    from tests.host_sync import first_and_second_call_syncs

    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2).double()
    first, second = first_and_second_call_syncs(lambda: conv(x, edge_index).sum().backward())
    assert any("boolean-mask" in sync for sync in first)
    assert second == []


def test_inference_mode_caches_nothing_and_takes_inference_tensors():
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2).double()
    with torch.inference_mode():
        ref = conv(x, edge_index)
        inference_edges = edge_index.clone()
        assert torch.equal(conv(x, inference_edges), ref)  # no version counter to key on
    assert conv._edges.cache.structures is None
    out = conv(x.clone().requires_grad_(), edge_index)  # training after inference
    out.sum().backward()
    torch.testing.assert_close(out.detach(), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("layer", ["cone", "masked"])
def test_dropout_rule_is_torchs(layer):
    """Both convs take a dropout probability in [0, 1], as torch.nn.Dropout does."""
    from hiergraph.nn import MaskedAttentionConv

    cls = ConeConv if layer == "cone" else MaskedAttentionConv
    torch.nn.Dropout(1.0)  # torch's own rule
    cls(F_IN, 4, dropout=1.0)
    cls(F_IN, 4, dropout=0.0)
    for bad in (1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\]"):
            cls(F_IN, 4, dropout=bad)
    with pytest.raises(ValueError, match=r"heads must be a positive int, got 0"):
        cls(F_IN, 4, heads=0)
    with pytest.raises(ValueError, match=r"in_channels must be an int or a pair"):
        cls((F_IN, 3, 2), 4)


def test_full_dropout_leaves_the_bias_only():
    x, edge_index = graph()
    conv = ConeConv(F_IN, 4, heads=2, dropout=1.0, feature_dropout=1.0).double().train()
    with torch.no_grad():
        conv.bias.uniform_()
    out = conv(x, edge_index)
    torch.testing.assert_close(out, conv.bias.expand_as(out), atol=0, rtol=0)


def test_half_precision_messages_are_summed_in_float32(monkeypatch):
    """A bf16 layer sums float32 messages (its attention weights are float32) and rounds the
    output once: bf16 messages would be summed in bf16, on GPUs by atomic additions that
    round at every edge (a target with thousands of incoming edges)."""
    conv = ConeConv(8, 4, heads=2).bfloat16()
    summed = spy_calls(monkeypatch, conv, "aggregate")
    out = conv(torch.randn(10, 8).bfloat16(), torch.tensor([[0, 1, 2], [1, 2, 3]]))
    assert [call["inputs"].dtype for call in summed] == [torch.float32]
    assert out.dtype == torch.bfloat16


def test_numpy_integer_sizes():
    """A NumPy ``in_channels`` passed the argument check and then failed to unpack as a
    pair ("cannot unpack non-iterable numpy.int64 object")."""
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.manual_seed(0)
    expected = ConeConv(8, 4, heads=2)(x, edge_index)
    torch.manual_seed(0)
    conv = ConeConv(np.int64(8), np.int64(4), heads=np.int64(2))
    assert torch.equal(conv(x, edge_index), expected)
    assert ConeConv((np.int64(8), np.int64(6)), 4)(
        (x, torch.randn(3, 6)), edge_index[:, :2]
    ).shape == (3, 4)
