"""Every op and layer runs forward and backward without a host synchronisation and without
making tensors off its inputs' device: the accelerator hot path, checked on the CPU.

Each case is prepared as a training loop would prepare it: structure (a hierarchy's
``TreeIndex``, a ``CausalPlan``, an ``EdgeCSR``, a segment tree) is built once on the CPU and
moved to the device, and one warm-up step fills lazy caches. Then one forward and backward
runs under

* :class:`tests.host_sync.HostSyncRecorder` (CPU): no op that reads tensor values on the host
  or has a value-dependent output shape (``item``, ``nonzero``, boolean-mask indexing, ...);
* ``torch.device("meta")`` as the default device (CPU): a tensor made without ``device=``
  lands on ``meta`` and the step fails or returns a ``meta`` tensor;
* ``torch.cuda.set_sync_debug_mode("error")`` (CUDA only, ``pytest -m cuda``).

Known syncs are marked ``xfail(strict=True)`` with the line that syncs: a fix makes the test
fail until its mark is removed. ``python tests/test_host_sync.py`` prints what the recorder
finds for every case.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data

from hiergraph._device import cpu_as_accelerator
from hiergraph.data import from_nested, random_window_hierarchy, window_forest, window_hierarchy
from hiergraph.ops.hsa import native
from tests.conftest import triton_runs_kernels
from tests.host_sync import HostSyncRecorder

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@dataclass
class Case:
    """``fn()`` runs the forward; ``grads`` are the tensors that get gradients."""

    fn: Callable[[], torch.Tensor]
    grads: list[torch.Tensor] = field(default_factory=list)
    backward: bool = True


def step(case: Case) -> torch.Tensor:
    """One forward (and backward) of ``case``; returns the output."""
    out = case.fn()
    out = out[0] if isinstance(out, tuple) else out
    if case.backward:
        for t in case.grads:
            t.grad = None
        out.float().square().sum().backward()
    return out


def _rand(device, *shape, seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=gen).to(device).requires_grad_()


def _module(module: torch.nn.Module, device) -> torch.nn.Module:
    return module.to(device)


def _window_forest(device, lengths=(16, 16, 16)):
    """Window trees of the given lengths (equal: equal fanout; else embedded in an
    equal-fanout forest), as :func:`_forest`."""
    gen = torch.Generator().manual_seed(0)
    trees = [window_hierarchy(n, (4, 2, 2), x=torch.randn(n, 8, generator=gen)) for n in lengths]
    batch = Batch.from_data_list(trees)
    index = batch.tree_index()
    assert index.uniform is not None if len(set(lengths)) == 1 else index.padded is not None
    return batch.to(device)


def _forest(device):
    """Two ragged window trees and a nested one, batched, with leaf features; the tree index
    is built on the CPU and moves with the batch."""
    gen = torch.Generator().manual_seed(0)
    trees = [
        random_window_hierarchy(37, (4, 3), x=torch.randn(37, 8, generator=gen), generator=gen),
        from_nested([[0, 1, 2], [3, 4], [[5, 6], 7]], x=torch.randn(8, 8, generator=gen)),
        window_hierarchy(20, (2, 2, 2), x=torch.randn(20, 8, generator=gen)),
    ]
    batch = Batch.from_data_list(trees)
    batch.tree_index()
    return batch.to(device)


def _ordered_tree(device):
    """One depth-first ordered tree (causal ops), with its ``CausalPlan`` on ``device``."""
    from hiergraph.plan import CausalPlan

    h = from_nested([[0, 1, 2], [3, [4, 5]], [6, 7, [8, 9, 10]], 11]).to(device)
    return h, CausalPlan.from_hierarchy(h)


def _graph(device, n=30, edges=90):
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, n, (2, edges), generator=gen)
    return edge_index.to(device), n


# ------------------------------------------------------------------------------------ ops


def _uniform_forest(device):
    """Three equal window trees: an equal-fanout forest (the reshaped-view paths)."""
    forest = window_forest([16] * 3, (4, 4))
    forest.tree_index()
    return forest.to(device)


def hsa(device, uniform=False, **options):
    from hiergraph.ops import hierarchical_attention

    batch = _uniform_forest(device) if uniform else _forest(device)
    index = batch.tree_index()
    assert (index.uniform is not None) == uniform
    L, N = index.num_leaves, index.num_nodes
    q, k = _rand(device, L, 2, 8, seed=0), _rand(device, L, 2, 8, seed=1)
    v, eps = _rand(device, L, 2, 4, seed=2), _rand(device, N, 4, seed=3)
    if options.pop("pos_emb", False):
        options["pos_emb"] = eps
    if options.pop("leaf_mask", False):
        options["leaf_mask"] = (torch.arange(L) % 7 != 3).to(device)
    return Case(lambda: hierarchical_attention(q, k, v, index, **options), [q, k, v, eps])


def _lengths_forest(device):
    """Window trees over sequences of different lengths: padded to equal fanout, the
    padding after every tree's leaves."""
    forest = window_forest([37, 20, 64, 50], (4, 4))
    assert forest.tree_index().padded.leaves_lead
    return forest.to(device)


def hsa_padded(device, kernel="dense"):
    """The default kernel takes the padded path here; ``kernel="blocks"`` the block kernel."""
    from hiergraph.ops import hierarchical_attention

    forest = _lengths_forest(device)
    assert forest.tree_index().padded.pays_off(2, 8)  # the padded path runs, not the blocks
    q, k, v = (_rand(device, forest.num_leaves, 2, 4, seed=i) for i in range(3))
    eps = _rand(device, forest.num_nodes, 3, seed=3)
    opts = dict(pos_emb=eps, kernel=kernel)
    return Case(lambda: hierarchical_attention(q, k, v, forest, **opts), [q, k, v, eps])


def causal_hsa(device, uniform=False, padded=False):
    from hiergraph.ops import causal_hierarchical_attention

    if uniform:
        h = _uniform_forest(device)
        plan = h.causal_plan()
        assert plan.tree_index.uniform is not None
    elif padded:
        h = _lengths_forest(device)
        plan = h.causal_plan()
    else:
        h, plan = _ordered_tree(device)
    q, k, v = (_rand(device, h.num_leaves, 2, 4, seed=i) for i in range(3))
    eps = _rand(device, h.num_nodes, 2, 3, seed=3)
    return Case(lambda: causal_hierarchical_attention(q, k, v, plan, pos_emb=eps), [q, k, v, eps])


def hmatrix(device, causal=False):
    from hiergraph.ops.hmatrix import hmatrix_attention

    q, k, v = (_rand(device, 2, 2, 32, 8, seed=i) for i in range(3))
    pad = torch.zeros(2, 32, dtype=torch.bool)
    pad[1, 27:] = True
    pad = pad.to(device)
    return Case(lambda: hmatrix_attention(q, k, v, 4, causal, key_padding_mask=pad), [q, k, v])


def banded(device):
    from hiergraph.ops.masked.banded import banded_attention

    q, k, v = (_rand(device, 47, 2, 8, seed=i) for i in range(3))
    return Case(lambda: banded_attention(q, k, v, 3, 2, lengths=[30, 17]), [q, k, v])


def cone_dense(device, variant):
    from hiergraph.ops.cone import penumbral, umbral

    fn = penumbral if variant == "penumbral" else umbral
    q, k = _rand(device, 2, 12, 6, seed=0), _rand(device, 2, 15, 6, seed=1)
    return Case(lambda: fn(q * 0.3, k * 0.3), [q, k])


def cone_edge(device, variant):
    from hiergraph.ops.cone import penumbral_edge, umbral_edge

    fn = penumbral_edge if variant == "penumbral" else umbral_edge
    edge_index, n = _graph(device, 12, 40)
    q, k = _rand(device, n, 2, 6, seed=0), _rand(device, n, 2, 6, seed=1)
    return Case(lambda: fn(q * 0.3, k * 0.3, edge_index), [q, k])


def masked_softmax_case(device):
    from hiergraph.ops import masked_softmax

    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(3, 5, 9, generator=gen) > 0.3).to(device)
    logits = _rand(device, 3, 5, 9)
    return Case(lambda: masked_softmax(logits, mask)[1], [logits])


def edge_products(device):
    from hiergraph.ops.masked.edge_products import EdgeCSR, edge_aggregate, edge_dot

    edge_index, n = _graph(device, 20, 60)
    graph = EdgeCSR(edge_index, (n, n))
    a, b = _rand(device, n, 2, 4, seed=0), _rand(device, n, 2, 4, seed=1)
    return Case(lambda: edge_aggregate(edge_dot(a, b, graph).softmax(0), b, graph), [a, b])


def hubs(device):
    from hiergraph.ops.hsa.hubs import root_scores, top_per_tree

    q, k = _rand(device, 12, 2, 4, seed=0), _rand(device, 12, 2, 4, seed=1)
    tree = torch.tensor([0] * 5 + [1] * 7, device=device)

    def fn():
        scores = root_scores(q, k, tree)
        return scores * top_per_tree(scores.detach(), tree, 2)

    return Case(fn, [q, k])


class _VCCLayer(torch.nn.Module):
    """A one-head attention layer as a function of ``(z, key_bias)`` (``vcc_layer``'s API)."""

    def __init__(self, dim=8):
        super().__init__()
        self.wq, self.wk, self.wv = (torch.nn.Linear(dim, dim) for _ in range(3))

    def query(self, x):
        return self.wq(x).unsqueeze(-2) / math.sqrt(x.size(-1))

    def key(self, x):
        return self.wk(x).unsqueeze(-2)

    def forward(self, z, key_bias):
        logits = self.wq(z) @ self.wk(z).transpose(-1, -2) / math.sqrt(z.size(-1))
        return z + (logits + key_bias[:, None, :]).softmax(-1) @ self.wv(z)


def vcc_op(device):
    from hiergraph.ops.vcc.layer import vcc_layer, vip_partition, vip_score_fn
    from hiergraph.ops.vcc.segment_tree import SegmentTree, build_tree_state, materialize

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 8, generator=gen)
    vip = torch.zeros(2, 24, dtype=torch.bool)
    vip[:, :3] = True
    p, p_ptr, c, c_ptr = vip_partition(x.to(device), vip.to(device))
    tree = SegmentTree.from_ptr(c_ptr, (4,))
    layer = _module(_VCCLayer(), device)
    p, c = p.requires_grad_(), c.requires_grad_()

    def fn():
        state = build_tree_state(c, tree)
        score = vip_score_fn(layer.query(p), p_ptr, layer.key)
        p_new, state, _ = vcc_layer(layer, p, p_ptr, state, tree, (None, 2), score)
        return torch.cat([p_new, materialize(state, tree)])

    return Case(fn, [p, c, *layer.parameters()])


def vcc_padded_op(device):
    from hiergraph.ops.vcc.padded import partition_padded, vcc_layer_padded, vip_score_fn_padded

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 8, generator=gen).to(device).requires_grad_()
    vip = torch.zeros(2, 24, dtype=torch.bool)
    vip[:, :3] = True
    vip = vip.to(device)  # a copy from host memory inside the step would synchronise
    mask = (torch.arange(24)[None] < torch.tensor([[24], [19]])).to(device)
    layer = _module(_VCCLayer(), device)
    budgets = (None, 2, 1)

    def fn():
        p, c, part = partition_padded(x, vip, mask, 3, (2, 2))
        score = vip_score_fn_padded(layer.query(p), part.slot_real, layer.key)
        p, c = vcc_layer_padded(layer, p, part.slot_real, c, part.tree, budgets, score)
        return part.restore(p, c)

    return Case(fn, [x, *layer.parameters()])


# --------------------------------------------------------------------------------- layers


def hsa_layer(device, hubs=0, lengths=None):
    from hiergraph.nn import HierarchicalSelfAttention

    batch = _forest(device) if lengths is None else _window_forest(device, lengths)
    attn = _module(HierarchicalSelfAttention(8, heads=2, pos_channels=4, hubs=hubs), device)
    x, pos = batch.x.requires_grad_(), _rand(device, batch.num_nodes, 4)
    return Case(lambda: attn(x, batch, pos_emb=pos), [x, pos, *attn.parameters()])


def position_encoder(device):
    from hiergraph.nn import FamilyPositionEncoder

    batch = _forest(device)
    enc = _module(FamilyPositionEncoder(4, num_keys=8), device)
    return Case(lambda: enc(batch), list(enc.parameters()))


def hte(device):
    from hiergraph.nn import HierarchicalTransformerEncoder

    batch = _forest(device)
    net = _module(HierarchicalTransformerEncoder(8, 16, num_layers=2, heads=2), device)
    x = batch.x.requires_grad_()
    return Case(lambda: net(x, batch), [x, *net.parameters()])


def pooling(device, coarsen=False):
    from hiergraph.nn import coarsen_leaves, global_leaf_mean_pool, select_leaf

    batch = _forest(device)
    x = batch.x.requires_grad_()
    if coarsen:
        return Case(lambda: coarsen_leaves(x, batch)[0], [x])
    mask = (torch.arange(x.size(0)) % 5 != 1).to(device)
    position = torch.tensor([1, 0, 2], device=device)

    def fn():
        pooled = global_leaf_mean_pool(x, batch) + global_leaf_mean_pool(x, batch, mask)
        return pooled + select_leaf(x, batch, -1) + select_leaf(x, batch, position)

    return Case(fn, [x])


def hte_decoder(device, attention="hsa"):
    from hiergraph.nn import HTEDecoder

    h, plan = _ordered_tree(device)
    net = HTEDecoder(
        20, hidden_channels=16, num_layers=1, heads=2, pos_channels=4, attention=attention
    )
    net = _module(net, device)
    tokens = torch.arange(h.num_leaves, device=device) % 20
    return Case(lambda: net(tokens, h, plan), list(net.parameters()))


def kv_decode(device):
    """One decoding step of :class:`~hiergraph.nn.HTEDecoder` through its KV caches."""
    from hiergraph.nn import HTEDecoder, append_schedule

    h, _ = _ordered_tree("cpu")
    schedule = append_schedule(h).tolist()  # host-side events, as a generator would make them
    net = _module(HTEDecoder(20, hidden_channels=16, num_layers=1, heads=2, pos_channels=4), device)
    caches = net.new_cache()
    for i, (close, open_) in enumerate(schedule[:-2]):
        net.step(i, caches, close, open_)
    events = iter(schedule[-2:])

    def fn():
        close, open_ = next(events)  # the warm-up step, then the checked one
        return net.step(3, caches, close, open_)

    return Case(fn, backward=False)


def hmatrix_layer(device):
    from hiergraph.nn import HMatrixAttention

    attn = _module(HMatrixAttention(16, 2, block_size=4, causal=True), device)
    x = _rand(device, 2, 32, 16)
    return Case(lambda: attn(x), [x, *attn.parameters()])


def htransformer(device):
    from hiergraph.nn import HTransformer1D

    net = _module(HTransformer1D(20, embed_dim=16, num_layers=1, num_heads=2, block_size=4), device)
    tokens = (torch.arange(64, device=device) % 20).view(2, 32)
    return Case(lambda: net(tokens), list(net.parameters()))


def vcc_encoder(device, vip_slots=3):
    from hiergraph.nn import VCCEncoder

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 16, generator=gen).to(device).requires_grad_()
    vip = torch.zeros(2, 40, dtype=torch.bool)
    vip[:, [1, 7, 30]] = True
    mask = torch.arange(40)[None] < torch.tensor([[40], [33]])
    options = dict(block_size=4, num_refined=2, local_layers=1, local_size=16)
    enc = _module(VCCEncoder(1, 16, 2, 32, vip_slots=vip_slots, **options), device)
    vip, mask = vip.to(device), mask.to(device)
    return Case(lambda: enc(x, vip, mask), [x, *enc.parameters()])


def cone_conv(device, variant):
    from hiergraph.nn import ConeConv

    edge_index, n = _graph(device)
    conv = _module(ConeConv(8, 4, heads=2, variant=variant, add_self_loops=False), device)
    x = _rand(device, n, 8)
    return Case(lambda: conv(x, edge_index), [x, *conv.parameters()])


def _adjacency(edge_index, n, layout):
    """``adj_t[target, source]`` of ``edge_index`` in ``layout``, built outside the step."""
    from hiergraph.ops.edge_index import edge_index_to_adjacency

    ones = torch.ones(edge_index.size(1), device=edge_index.device)
    return edge_index_to_adjacency(edge_index, ones, n, n, layout)[0]


def cone_conv_adjacency(device):
    from hiergraph.nn import ConeConv

    edge_index, n = _graph(device)
    adj = _adjacency(edge_index, n, torch.sparse_coo)
    conv = _module(ConeConv(8, 4, heads=2, add_self_loops=False), device)
    x = _rand(device, n, 8)
    return Case(lambda: conv(x, adj), [x, *conv.parameters()])


def cone_conv_self_loops(device):
    from hiergraph.nn import ConeConv

    edge_index, n = _graph(device)
    conv = _module(ConeConv(8, 4, heads=2), device)
    x = _rand(device, n, 8)
    return Case(lambda: conv(x, edge_index), [x, *conv.parameters()])


def cone_attention(device):
    from hiergraph.nn import ConeAttention

    attn = _module(ConeAttention(8, 2), device)
    x = _rand(device, 2, 10, 8)
    pad = torch.zeros(2, 10, dtype=torch.bool, device=device)
    return Case(lambda: attn(x, x, x, key_padding_mask=pad), [x, *attn.parameters()])


def masked_conv(device, mask):
    from hiergraph.masks import BandMask, random_mask, window_mask
    from hiergraph.nn import MaskedAttentionConv

    n = 64
    if mask == "band":  # the window prepared as a BandMask: no recognition per call
        edge_index = BandMask((40, 24), 4, 4)
    else:
        edge_index = window_mask(n, 4) if mask == "window" else random_mask(n, 400, seed=0)
        edge_index = edge_index.to(device)
    if mask == "csr":  # a sparse adjacency adj_t[query, key]
        edge_index = _adjacency(edge_index, n, torch.sparse_csr)
    structured = mask in ("band", "window")
    conv = _module(MaskedAttentionConv(8, 4, heads=2, structured=structured), device)
    x = _rand(device, n, 8)
    return Case(lambda: conv(x, edge_index), [x, *conv.parameters()])


def _graph_hierarchy(device):
    from hiergraph.transforms import GraphHierarchy

    edge_index, n = _graph("cpu", 24, 60)
    gen = torch.Generator().manual_seed(1)
    data = Data(x=torch.randn(n, 6, generator=gen), edge_index=edge_index, num_nodes=n)
    data = GraphHierarchy(max_family=4, pe_dim=4)(data)
    tree = data.hierarchy()
    tree.tree_index()
    return data.to(device), tree.to(device)


def graph_hsa_conv(device):
    from torch_geometric.nn import GCNConv

    from hiergraph.nn import GraphHSAConv

    data, tree = _graph_hierarchy(device)
    # cached: PyG's gcn_norm adds self loops with a boolean mask (a sync) on the first call
    conv = GCNConv(6, 6, cached=True)
    layer = _module(GraphHSAConv(6, conv, heads=2, norm="layer_norm"), device)
    x = data.x.requires_grad_()
    return Case(lambda: layer(x, data.edge_index, tree), [x, *layer.parameters()])


def graph_hsa_net(device):
    from torch_geometric.nn import GCNConv

    from hiergraph.nn import GraphHSANet

    data, tree = _graph_hierarchy(device)
    net = GraphHSANet(
        6, 8, 3, conv_factory=lambda c: GCNConv(c, c, cached=True), heads=2, graph_pe_dim=4
    )
    net = _module(net, device)
    x = data.x.requires_grad_()
    return Case(lambda: net(x, data.edge_index, tree), [x, *net.parameters()])


def typed_linear(device):
    from hiergraph.nn import TypedLinear

    lin = _module(TypedLinear(6, 4, num_types=3), device)
    x = _rand(device, 10, 6)
    types = (torch.arange(10) % 3).to(device)
    return Case(lambda: lin(x, types), [x, *lin.parameters()])


def with_triton_kernels(make: Callable[[str], Case]) -> Callable[[str], Case]:
    """Case ``make`` with the Triton kernels of equal-fanout HSA turned on for its forward
    (its backward is theirs: the autograd node is chosen in the forward)."""
    from hiergraph.ops.hsa import triton_uniform

    def made(device):
        case = make(device)
        return Case(triton_uniform.turned_on()(case.fn), case.grads, case.backward)

    return made


CASES: dict[str, Callable[[str], Case]] = {
    "hsa-dense": lambda d: hsa(d, pos_emb=True),
    "hsa-edge": lambda d: hsa(d, pos_emb=True, kernel="edge"),
    "hsa-causal-mask": lambda d: hsa(d, include_self=True, leaky_causal=True, leaf_mask=True),
    "hsa-uniform": lambda d: hsa(d, uniform=True, pos_emb=True),
    "hsa-uniform-self-mask": lambda d: hsa(
        d, uniform=True, include_self=True, leaky_causal=True, leaf_mask=True
    ),
    "causal-hsa-uniform": lambda d: causal_hsa(d, uniform=True),
    "causal-hsa-padded": lambda d: causal_hsa(d, padded=True),
    "hsa-padded": hsa_padded,
    "hsa-blocks": lambda d: hsa_padded(d, kernel="blocks"),
    "causal-hsa": causal_hsa,
    "hmatrix": hmatrix,
    "hmatrix-causal": lambda d: hmatrix(d, causal=True),
    "banded": banded,
    "penumbral": lambda d: cone_dense(d, "penumbral"),
    "umbral": lambda d: cone_dense(d, "umbral"),
    "penumbral-edge": lambda d: cone_edge(d, "penumbral"),
    "umbral-edge": lambda d: cone_edge(d, "umbral"),
    "masked-softmax": masked_softmax_case,
    "edge-products": edge_products,
    "hubs": hubs,
    "vcc-layer": vcc_op,
    "vcc-layer-padded": vcc_padded_op,
    "HierarchicalSelfAttention": hsa_layer,
    "HierarchicalSelfAttention-hubs": lambda d: hsa_layer(d, hubs=2),
    "HierarchicalSelfAttention-hubs-equal-trees": lambda d: hsa_layer(d, 2, (16, 16, 16)),
    # trees of one height (a shorter tree would sink below a chain: its hubs are lifted)
    "HierarchicalSelfAttention-hubs-window-forest": lambda d: hsa_layer(d, 2, (16, 11, 9)),
    "FamilyPositionEncoder": position_encoder,
    "HierarchicalTransformerEncoder": hte,
    "pooling": pooling,
    "coarsen_leaves": lambda d: pooling(d, coarsen=True),
    "HTEDecoder": hte_decoder,
    "HTEDecoder-flat": lambda d: hte_decoder(d, attention="flat"),
    "HTEDecoder.step": kv_decode,
    "HMatrixAttention": hmatrix_layer,
    "HTransformer1D": htransformer,
    "VCCEncoder": vcc_encoder,
    "VCCEncoder-auto-slots": lambda d: vcc_encoder(d, vip_slots=None),
    "ConeConv-penumbral": lambda d: cone_conv(d, "penumbral"),
    "ConeConv-umbral": lambda d: cone_conv(d, "umbral"),
    "ConeConv-dot": lambda d: cone_conv(d, "dot"),
    "ConeConv-self-loops": cone_conv_self_loops,
    "ConeAttention": cone_attention,
    "MaskedAttentionConv-BandMask": lambda d: masked_conv(d, "band"),
    "MaskedAttentionConv-window": lambda d: masked_conv(d, "window"),
    "MaskedAttentionConv-random": lambda d: masked_conv(d, "random"),
    "MaskedAttentionConv-csr": lambda d: masked_conv(d, "csr"),
    "ConeConv-coo": cone_conv_adjacency,
    "GraphHSAConv": graph_hsa_conv,
    "GraphHSANet": graph_hsa_net,
    "TypedLinear": typed_linear,
}

_VCC = (
    "VCC selects segments by score and packs them: value-dependent sizes "
    "(ops/vcc/layer.py vip_partition, pack_compressed, unpack_compressed; ops/vcc/segment_tree.py "
    "select_segments, update_tree)"
)
if triton_runs_kernels():  # the opt-in GPU kernels
    CASES["hsa-uniform-triton"] = with_triton_kernels(CASES["hsa-uniform"])
    CASES["hsa-padded-triton"] = with_triton_kernels(CASES["hsa-padded"])

#: case -> where and why it syncs; xfail(strict=True): a fix makes the test fail until the
#: entry is removed
KNOWN_SYNCS: dict[str, str] = {
    "vcc-layer": _VCC,
    "VCCEncoder-auto-slots": (
        "without vip_slots, the number of VIP rows is the batch's largest VIP count, read "
        "from vip_mask (nn/vcc.py VCCEncoder.forward)"
    ),
    "coarsen_leaves": "builds the coarser hierarchy (data/restructure.py coarsen_hierarchy)",
    "HTEDecoder-flat": (
        "the flat baseline pads per tree with to_dense_batch and unpads with a boolean mask "
        "(nn/hte_decoder.py CausalSelfAttention.forward)"
    ),
}
#: case -> where it makes tensors off its inputs' device; xfail(strict=True) under meta
KNOWN_OFF_DEVICE: dict[str, str] = {}


def make_case(name: str, device: str) -> Case:
    """Case ``name`` on ``device``, with the same weights every time."""
    torch.manual_seed(0)
    return CASES[name](device)


def _params(known: dict[str, str]):
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=known[name]))
        if name in known
        else name
        for name in CASES
    ]


def recorded_syncs(name: str) -> list[str]:
    """The host syncs of one checked step of case ``name`` on the CPU (after a warm-up), on
    the operations an accelerator runs: the compiled CPU kernels of
    :mod:`hiergraph.ops.hsa.native` turned off."""
    case = make_case(name, "cpu")
    kernels = native.set_enabled(False)
    try:
        with cpu_as_accelerator():  # checks of CPU tensors' values take their accelerator branch
            step(case)
            with HostSyncRecorder() as rec:
                step(case)
    finally:
        native.set_enabled(kernels)
    assert rec.num_ops > 0, "the recorder saw no op"
    return rec.unique_syncs()


@pytest.mark.parametrize("name", _params(KNOWN_SYNCS))
def test_no_host_sync(name):
    syncs = recorded_syncs(name)
    assert syncs == [], f"{name} synchronises:\n  " + "\n  ".join(syncs)


@pytest.mark.parametrize("name", _params(KNOWN_OFF_DEVICE))
def test_tensors_made_on_the_inputs_device(name):
    """With ``meta`` as the default device, a tensor made without ``device=`` breaks the step."""
    case = make_case(name, "cpu")
    step(case)
    with torch.device("meta"):
        out = step(case)
    assert out.device.type == "cpu"
    assert all(t.grad is None or t.grad.device.type == "cpu" for t in case.grads)


@needs_cuda
@pytest.mark.parametrize("name", _params(KNOWN_SYNCS))
def test_no_host_sync_cuda(name):
    case = make_case(name, "cuda")
    step(case)  # warm-up: lazy initialisation may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(case)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


#: cases whose code takes another branch where ``hiergraph._device.reads_values`` is false
#: (banded attention's accelerator branch, its chunk size, follows the device type:
#: ``tests/ops/masked/test_banded.py`` runs it on the meta device)
DEVICE_BRANCHES = ["TypedLinear", "FamilyPositionEncoder", "pooling", "edge-products"]


@pytest.mark.parametrize("name", DEVICE_BRANCHES)
def test_accelerator_branches_compute_the_same(name):
    """The accelerator branches, run on the CPU, give the CPU branches' outputs and grads."""
    results = []
    for emulate in (False, True):
        with cpu_as_accelerator() if emulate else torch.enable_grad():
            case = make_case(name, "cpu")  # (built there too: EdgeCSR reads its device)
            out = step(case)
        results.append((out.detach(), [t.grad for t in case.grads]))
    (out, grads), (out_dev, grads_dev) = results
    torch.testing.assert_close(out_dev, out)
    for g_dev, g in zip(grads_dev, grads, strict=True):
        if g is None:  # a branch the CPU never ran (a domain with no nodes)
            assert g_dev is None or not g_dev.any()
        else:
            torch.testing.assert_close(g_dev, g)


def test_select_leaf_checks_positions_on_the_device():
    from hiergraph.nn import select_leaf

    batch = _forest("cpu")
    with pytest.raises(ValueError, match="out of range"):
        select_leaf(batch.x, batch, 8)  # the nested tree has 8 leaves
    with cpu_as_accelerator(), pytest.raises(RuntimeError, match="out of range"):
        select_leaf(batch.x, batch, 8)  # torch._assert_async (a device-side assert on CUDA)


def test_recorder_sees_the_syncs_it_should():
    x = torch.arange(6.0)
    index = torch.tensor([1, 2, 0])
    for sync, expected in [
        (lambda: x.sum().item(), "item()"),
        (lambda: int(x[0]), "item()"),
        (lambda: bool(x[1] > 0), "item()"),
        (lambda: x[x > 2], "boolean-mask"),
        (lambda: x.clone().masked_fill(x > 2, 0).nonzero(), "nonzero"),
        (lambda: x.tolist(), "tolist"),
        (lambda: torch.repeat_interleave(index), "output_size"),
        (lambda: torch.unique(index), "unique"),
    ]:
        with HostSyncRecorder() as rec:
            sync()
        assert len(rec.syncs) == 1 and expected in rec.syncs[0], rec.syncs
        assert "tests/test_host_sync.py" in rec.syncs[0]
    with HostSyncRecorder() as rec:  # value-independent ops pass
        x[index].cumsum(0)
        torch.repeat_interleave(x, index.repeat(2), output_size=6)
        F.softmax(x, 0)
    assert rec.syncs == [] and rec.num_ops >= 3
    assert "tolist" not in torch.Tensor.__dict__  # the Python methods are restored


if __name__ == "__main__":  # the sync table of the report
    for case_name in CASES:
        try:
            found = recorded_syncs(case_name)
        except Exception as error:  # noqa: BLE001
            found = [f"ERROR {type(error).__name__}: {error}"]
        print(f"{case_name}: {len(found)}", *found, sep="\n    ")
