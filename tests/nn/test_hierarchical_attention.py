import importlib

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import flatten_hierarchy, from_nested, window_forest, window_hierarchy
from hiergraph.data.restructure import lift_leaves
from hiergraph.nn import FamilyPositionEncoder, HierarchicalSelfAttention
from hiergraph.ops import (
    causal_hierarchical_attention_matrix,
    hierarchical_attention,
    hierarchical_attention_matrix,
)
from hiergraph.ops.hsa.hubs import root_scores, top_per_tree
from hiergraph.ops.hsa.inputs import CAUSAL_KERNELS, KERNELS
from tests.conftest import spy_calls

hierarchical_attention_module = importlib.import_module("hiergraph.nn.hierarchical_attention")


def test_matches_manual_composition_with_types_and_positions():
    torch.manual_seed(0)
    h = from_nested(
        [[0, 1, 2], [3, [4, 5]]],
        x=torch.randn(6, 8, dtype=torch.float64),
        leaf_type=[0, 1, 0, 1, 1, 0],
    )
    attn = HierarchicalSelfAttention(
        8, 6, heads=2, head_channels=3, num_node_types=2, pos_channels=5, include_self=True
    ).double()
    pos = torch.randn(h.num_nodes, 5, dtype=torch.float64)
    out = attn(h.x, h, pos)
    types = h.node_type[:6]

    def proj(typed):  # HeteroLinear weight [T, in, out], type_bias [T, out]
        w, b = typed.lin.weight, typed.type_bias
        return torch.stack([h.x[i] @ w[t] + b[t] for i, t in enumerate(types.tolist())])

    q, k, v = (proj(lin).view(6, 2, 3) for lin in (attn.query, attn.key, attn.value))
    norm = torch.nn.functional.layer_norm
    q, k = norm(q, (3,)), norm(k, (3,))
    pw = attn.pos.lin.weight
    eps = torch.stack([pos[i] @ pw[d] for i, d in enumerate(h.domain.tolist())]).view(-1, 2, 3)
    ref = hierarchical_attention(q, k, v, h, pos_emb=eps, include_self=True)
    ref = attn.out(ref.reshape(6, 6))
    assert torch.allclose(out, ref, atol=1e-12)


def test_batched_equals_per_tree_and_attention_is_stochastic():
    torch.manual_seed(1)
    trees = [
        window_hierarchy(9, (3,), x=torch.randn(9, 8)),
        from_nested([[0, 1], 2], x=torch.randn(3, 8)),
    ]
    attn = HierarchicalSelfAttention(8, heads=4).eval()
    out = attn(Batch.from_data_list(trees).x, Batch.from_data_list(trees))
    assert torch.allclose(out[:9], attn(trees[0].x, trees[0]), atol=1e-6)
    assert torch.allclose(out[9:], attn(trees[1].x, trees[1]), atol=1e-6)
    _, theta = attn(trees[0].x, trees[0], return_attention_weights=True)
    assert theta.shape == (4, 9, 9)
    assert torch.allclose(theta.sum(-1), torch.ones(4, 9), atol=1e-5)


def test_gradients_flow_to_all_parameters():
    h = window_hierarchy(16, (4,), x=torch.randn(16, 8))
    enc = FamilyPositionEncoder(4)
    attn = HierarchicalSelfAttention(8, heads=2, pos_channels=4)
    attn(h.x, h, enc(h)).square().sum().backward()
    for name, p in [*attn.named_parameters(), *enc.grid1d.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_bad_arguments():
    h = window_hierarchy(4, (2,), x=torch.randn(4, 8))
    with pytest.raises(ValueError, match="include_self"):
        HierarchicalSelfAttention(8, causal=True)
    with pytest.raises(ValueError, match="pass pos_emb"):
        HierarchicalSelfAttention(8, pos_channels=4)(h.x, h)
    with pytest.raises(ValueError, match="pos_emb was given, but .* pos_channels=0"):
        HierarchicalSelfAttention(8)(h.x, h, pos_emb=torch.randn(h.num_nodes, 4))
    with pytest.raises(ValueError, match=r"x must be \[num_leaves=4"):
        HierarchicalSelfAttention(8)(h.x[:3], h)
    with pytest.raises(ValueError, match="type id"):
        HierarchicalSelfAttention(8, num_node_types=2)(h.x, _with_types(h, [0, 2, 0, 0]))


def _with_types(h, leaf_types):
    h = h.clone()
    h.node_type[: len(leaf_types)] = torch.tensor(leaf_types)
    return h


def _pair(**kwargs):
    """A module with hubs and the same module without, sharing weights."""
    torch.manual_seed(0)
    hub = HierarchicalSelfAttention(6, heads=2, include_self=True, **kwargs).double()
    plain_kwargs = {key: value for key, value in kwargs.items() if key != "hubs"}
    plain = HierarchicalSelfAttention(6, heads=2, include_self=True, **plain_kwargs).double()
    plain.load_state_dict(hub.state_dict())
    return hub, plain


def _forest():
    torch.manual_seed(1)
    trees = [
        from_nested([[0, 1, 2], [3, 4], [[5, 6], 7]], x=torch.randn(8, 6, dtype=torch.float64)),
        window_hierarchy(11, (2, 3), x=torch.randn(11, 6, dtype=torch.float64)),
    ]
    return Batch.from_data_list(trees)


@pytest.mark.parametrize(
    "options",
    [dict(), dict(include_self=True), dict(include_self=True, causal=True),
     dict(include_self=True, leaky_causal=True), dict(pos_channels=4), dict(hubs=2)],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("masked", [False, True])
def test_attention_weights_are_the_dense_reference_matrix(options, masked):
    """The weights come from the op itself (one-hot values), and equal the dense reference
    (which took minutes for causal layers over a few hundred leaves); with the hubs, the
    reference runs over the lifted tree."""
    if masked and options.get("causal"):
        pytest.skip("the strictly causal op takes no leaf_mask")
    torch.manual_seed(0)
    h = from_nested([[0, 1, 2], [3, [4, 5, 6]], 7], x=torch.randn(8, 6, dtype=torch.float64))
    layer = HierarchicalSelfAttention(6, heads=2, **options).double()
    pos = torch.randn(h.num_nodes, 4, dtype=torch.float64) if "pos_channels" in options else None
    mask = torch.tensor([True, False, True, True, True, False, True, True]) if masked else None
    out, theta = layer(h.x, h, pos, leaf_mask=mask, return_attention_weights=True)
    types = torch.zeros(8, dtype=torch.long)
    q, k, v = (lin(h.x, types).view(8, 2, 3) for lin in (layer.query, layer.key, layer.value))
    q, k = layer.q_norm(q), layer.k_norm(k)
    tree, eps = h, None
    if layer.hubs:
        tree, _ = lift_leaves(h, top_per_tree(root_scores(q, k, 1, mask), 1, layer.hubs))
    if pos is not None:
        eps = layer.pos(pos, h.domain).view(-1, 2, layer.pos_head_channels)
    if layer.causal:
        ref = causal_hierarchical_attention_matrix(q, k, tree, pos_emb=eps)
    else:
        ref = hierarchical_attention_matrix(
            q, k, tree, pos_emb=eps, include_self=layer.include_self,
            leaky_causal=layer.leaky_causal, leaf_mask=mask,
        )  # fmt: skip
    torch.testing.assert_close(theta, ref, rtol=0, atol=1e-12)
    heads_out = torch.einsum("hij,jhc->ihc", theta, v).reshape(8, 6)
    torch.testing.assert_close(out, layer.out(heads_out), rtol=0, atol=1e-12)


def test_attention_weights_of_large_logits_are_finite():
    """Logits past float32's exp range (about 88): the reference's plain exponentials gave
    NaN weights; the op's log-space gates do not."""
    torch.manual_seed(0)
    h = from_nested([[0, 1, 2], [3, 4], [5, [6, 7]]])
    layer = HierarchicalSelfAttention(16, heads=1, qk_norm=False)
    _, theta = layer(torch.randn(8, 16) * 20, h, return_attention_weights=True)
    assert torch.isfinite(theta).all()
    torch.testing.assert_close(theta.sum(-1), torch.ones(1, 8))
    q, k = torch.randn(8, 1, 16) * 10, torch.randn(8, 1, 16) * 10
    assert torch.isfinite(hierarchical_attention_matrix(q, k, h)).all()


def test_hubs_attend_over_the_lifted_tree_of_the_best_scoring_leaves():
    batch = _forest()
    hub, plain = _pair(hubs=3, pos_channels=4)
    pos = torch.randn(batch.num_nodes, 4, dtype=torch.float64)
    out = hub(batch.x, batch, pos)
    # the same choice by hand: this layer's normalised q, k, scored per tree
    x, shape, types = batch.x, (19, 2, 3), torch.zeros(19, dtype=torch.long)
    q = plain.q_norm(plain.query(x, types).view(shape))
    k = plain.k_norm(plain.key(x, types).view(shape))
    tree = torch.tensor([0] * 8 + [1] * 11)
    chosen = top_per_tree(root_scores(q, k, tree), tree, 3)
    assert chosen.sum() == 6
    lifted, node = lift_leaves(batch, chosen)
    lifted_pos = pos[node].clone()
    lifted_pos[lifted.tree_index().leaf_node[chosen]] = 0.0
    assert torch.allclose(out, plain(batch.x, lifted, lifted_pos), atol=1e-13)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in hub.parameters())


def assert_lifts_no_tree(hub, x, batch, pos, mask, monkeypatch):
    """The hub layer gives the output and the gradients (of a squared sum) of the same layer
    rebuilding the lifted tree, without lifting one."""
    monkeypatch.setattr(hierarchical_attention_module, "runs_lifted", lambda index: False)
    want = hub(x, batch, pos, leaf_mask=mask)
    monkeypatch.undo()
    monkeypatch.setattr(hierarchical_attention_module, "lift_leaves", None)  # not called
    got = hub(x, batch, pos, leaf_mask=mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    (want_grad,), (got_grad,) = (torch.autograd.grad(t.square().sum(), x) for t in (want, got))
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("lengths", [[12, 12, 12], [12, 7, 10]])
def test_hubs_on_window_trees_lift_no_tree(masked, lengths, monkeypatch):
    """Equal trees (their own plan) and window trees of different lengths (its equal-fanout
    embedding) lift no tree: the same output and gradients as the rebuilt tree (every
    tree's best leaves under its root, position-free)."""
    torch.manual_seed(2)
    batch = window_forest(lengths, (3, 2, 2))
    x = torch.randn(sum(lengths), 6, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(batch.num_nodes, 4, dtype=torch.float64)
    mask = (torch.arange(sum(lengths)) % 5 != 0) if masked else None
    hub, _ = _pair(hubs=4, pos_channels=4)
    assert_lifts_no_tree(hub, x, batch, pos, mask, monkeypatch)


@pytest.mark.parametrize("hubs", [0, 3])
def test_compiles_as_one_graph_once_the_plan_is_built(hubs):
    """With the batch's plan built (``tree_index()``), the layer traces as one graph, hubs
    on equal trees included (their tree is not rebuilt): the same output and gradients."""
    batch = Batch.from_data_list([window_hierarchy(32, (4, 2, 4)) for _ in range(3)])
    batch.tree_index()
    torch.manual_seed(0)
    layer = HierarchicalSelfAttention(16, heads=2, hubs=hubs, include_self=True, pos_channels=4)
    x = torch.randn(96, 16, requires_grad=True)
    pos, mask = torch.randn(batch.num_nodes, 4), torch.arange(96) % 7 != 0
    want = layer(x, batch, pos, leaf_mask=mask)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x)
    torch._dynamo.reset()
    got = torch.compile(layer, backend="eager", fullgraph=True)(x, batch, pos, leaf_mask=mask)
    (got_grad,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_compiling_before_the_plan_is_built_says_what_to_do():
    batch = Batch.from_data_list([window_hierarchy(16, (4, 4)) for _ in range(2)])
    layer = HierarchicalSelfAttention(8, heads=2)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"call hierarchy.tree_index\(\) once before"):
        torch.compile(layer, backend="eager", fullgraph=True)(torch.randn(32, 8), batch)
    torch._dynamo.reset()  # without fullgraph the plan is built between graphs
    out = torch.compile(layer, backend="eager")(torch.ones(32, 8), batch)
    torch.testing.assert_close(out, layer(torch.ones(32, 8), batch))


@pytest.mark.parametrize("lengths", [[8, 4], [4, 3, 9], [16, 6]])
def test_hubs_on_window_trees_of_different_heights(lengths):
    """A forest whose trees differ in height: the layer's output is HSA over the rebuilt
    lifted tree (the shorter trees' hubs included)."""
    torch.manual_seed(3)
    batch = window_forest(lengths, (2, 2))
    x = torch.randn(sum(lengths), 6, dtype=torch.float64)
    hub, plain = _pair(hubs=1)  # (with more, a short tree may keep one top node)
    x_types, shape = torch.zeros(len(x), dtype=torch.long), (len(x), 2, 3)
    q = plain.q_norm(plain.query(x, x_types).view(shape))
    k = plain.k_norm(plain.key(x, x_types).view(shape))
    tree = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    lifted, _ = lift_leaves(batch, top_per_tree(root_scores(q, k, tree), tree, 1))
    torch.testing.assert_close(hub(x, batch), plain(x, lifted), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel", ["dense", "blocks", "edge"])
def test_hubs_on_ragged_trees_lift_no_tree(kernel, monkeypatch):
    """Trees of different shapes (embedded in an equal-fanout forest: the dense kernel runs
    the hubs there, ``"blocks"`` and ``"edge"`` on the forest's levels): the output and
    gradients of the layer that rebuilds the lifted tree, and no tree is lifted."""
    batch = _forest()
    pos = torch.randn(batch.num_nodes, 4, dtype=torch.float64)
    mask = torch.arange(batch.x.size(0)) % 4 != 1
    hub, _ = _pair(hubs=2, pos_channels=4, kernel=kernel)
    assert_lifts_no_tree(hub, batch.x.clone().requires_grad_(), batch, pos, mask, monkeypatch)


def test_hubs_cover_flat_attention_and_no_hubs():
    batch = _forest()
    everything, plain = _pair(hubs=100)
    flat = plain(batch.x, flatten_hierarchy(batch))
    assert torch.allclose(everything(batch.x, batch), flat, atol=1e-13)
    none, plain = _pair(hubs=0)
    assert torch.equal(none(batch.x, batch), plain(batch.x, batch))
    with pytest.raises(ValueError, match="hubs must be an int >= 0"):
        HierarchicalSelfAttention(6, hubs=-1)
    with pytest.raises(TypeError, match="hubs must be an int >= 0, got None"):
        HierarchicalSelfAttention(6, hubs=None)
    with pytest.raises(ValueError, match="not with causal"):
        HierarchicalSelfAttention(6, hubs=2, include_self=True, causal=True)


def test_hubs_never_choose_padding_leaves():
    batch = _forest()
    hub, _ = _pair(hubs=19)
    mask = torch.ones(19, dtype=torch.bool)
    mask[[2, 9]] = False
    _, theta = hub(batch.x, batch, leaf_mask=mask, return_attention_weights=True)
    assert torch.all(theta[:, :, [2, 9]] == 0)
    assert torch.allclose(theta[:, mask].sum(-1), torch.ones(2, 17, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(heads=0), ValueError, "heads must be a positive int, got 0"),
        (dict(heads=2.0), TypeError, "heads must be a positive int"),
        (dict(head_channels=0), ValueError, "head_channels must be a positive int or None"),
        (dict(in_channels=0), ValueError, "in_channels must be a positive int"),
        (dict(out_channels=-3), ValueError, "out_channels must be a positive int"),
        (dict(pos_channels=-1), ValueError, "pos_channels must be an int >= 0"),
        (dict(pos_channels=4, pos_head_channels=0), ValueError, "pos_head_channels"),
        (dict(num_node_types=0), ValueError, "num_node_types must be a positive int"),
        (dict(dropout=1.5), ValueError, r"dropout must be a probability in \[0, 1\]"),
        (dict(kernel="sparse"), ValueError, "kernel must be one of .*'dense'.*'edge'.*'sparse'"),
        (dict(kernel="blocks", causal=True, include_self=True), ValueError, "strictly causal"),
        (dict(qk_norm="no"), TypeError, "qk_norm must be a bool, got 'no'"),  # (normalised)
        (dict(project_values="no"), TypeError, "project_values must be a bool"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, match):
    kwargs = {"in_channels": 8, **kwargs}
    with pytest.raises(error, match=match):
        HierarchicalSelfAttention(**kwargs)


@pytest.mark.parametrize("kernel", CAUSAL_KERNELS)
def test_a_causal_layer_runs_its_kernel(monkeypatch, kernel):
    """A causal layer's ``kernel`` reaches the causal op (it ran the default path)."""
    from hiergraph.ops.hsa import causal

    calls = spy_calls(monkeypatch, causal, "_edge_attention")
    attn = HierarchicalSelfAttention(8, heads=2, include_self=True, causal=True, kernel=kernel)
    attn(torch.randn(12, 8), window_hierarchy(12, (2, 3)))
    assert len(calls) == (kernel == "edge")


def test_forward_names_wrong_feature_sizes():
    h = window_hierarchy(6, (3,), x=torch.randn(6, 8))
    attn = HierarchicalSelfAttention(8, heads=2)
    with pytest.raises(
        ValueError, match=r"x must be \[num_leaves=6, in_channels=8\], got \(6, 5\)"
    ):
        attn(h.x[:, :5], h)
    attn = HierarchicalSelfAttention(8, heads=2, pos_channels=4)
    pos = FamilyPositionEncoder(4, num_keys=4)(h)
    with pytest.raises(
        ValueError, match=r"pos_emb must be \[num_nodes=9, pos_channels=4\].*\(9, 3\)"
    ):
        attn(h.x, h, pos_emb=pos[:, :3])
    with pytest.raises(ValueError, match=r"pos_emb must be \[num_nodes=9, .*got \(7, 4\)"):
        attn(h.x, h, pos_emb=pos[:7])
    assert attn(h.x, h, pos_emb=pos).shape == (6, 8)


def test_project_values_false_smooths_the_input_itself():
    """Values are x split over the heads and the output is the heads concatenated."""
    h = window_hierarchy(8, (2, 4), x=torch.randn(8, 6, dtype=torch.float64))
    attn = HierarchicalSelfAttention(6, heads=2, project_values=False).double()
    assert attn.value is None and attn.out is None
    q = attn.q_norm(attn.query(h.x).view(8, 2, 3))
    k = attn.k_norm(attn.key(h.x).view(8, 2, 3))
    ref = hierarchical_attention(q, k, h.x.view(8, 2, 3), h).reshape(8, 6)
    torch.testing.assert_close(attn(h.x, h), ref, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="project_values=False needs"):
        HierarchicalSelfAttention(6, out_channels=4, heads=2, project_values=False)


@pytest.mark.parametrize(
    "mode, kernel",
    [(mode, kernel) for mode in ("full", "hubs") for kernel in KERNELS]
    + [("causal", kernel) for kernel in CAUSAL_KERNELS],
)
@pytest.mark.parametrize("ragged", [False, True])
def test_an_evaluation_under_inference_mode_then_training(kernel, mode, ragged):
    """The tree's plan (and a hub tree's) first built under ``torch.inference_mode()``
    serves the training steps that follow: same output, gradients flow."""
    torch.manual_seed(0)
    sizes = [(60, (4, 4, 4)), (24, (4, 2))] if ragged else [(64, (4, 4, 4))]
    tree = Batch.from_data_list([window_hierarchy(n, b) for n, b in sizes])
    options = {"causal": {"causal": True, "include_self": True}, "hubs": {"hubs": 3}}
    attn = HierarchicalSelfAttention(8, heads=2, kernel=kernel, **options.get(mode, {}))
    x = torch.randn(int(tree.is_leaf.sum()), 8)
    with torch.inference_mode():
        evaluated = attn(x, tree)
    out = attn(x, tree)
    out.square().sum().backward()
    assert torch.allclose(out, evaluated, atol=1e-6)
    assert all(p.grad is not None for p in attn.parameters())


def test_a_one_type_layer_serves_hierarchies_whose_nodes_carry_types():
    """Node types are read by layers of several types only (a one-type layer refused the
    typed trees of a multimodal schema)."""
    from hiergraph.data import SignalHierarchy

    typed = SignalHierarchy.from_parent([-1, 0, 0, 1, 1, 2, 2], node_type=[0, 0, 0, 0, 1, 0, 1])
    untyped = SignalHierarchy.from_parent([-1, 0, 0, 1, 1, 2, 2])
    layer = HierarchicalSelfAttention(8, heads=2)
    x = torch.randn(4, 8)
    torch.testing.assert_close(layer(x, typed), layer(x, untyped))
