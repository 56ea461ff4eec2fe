"""GraphHSAConv / GraphHSANet: GPS-style hybrid of a local conv and HSA."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv
from torch_geometric.utils import stochastic_blockmodel_graph

from hiergraph.data import flatten_hierarchy
from hiergraph.nn.cone_conv import ConeConv
from hiergraph.nn.graph_hsa import GraphHSAConv, GraphHSANet, input_dropout
from hiergraph.transforms import GraphHierarchy


def graph(n0, n1, seed, features=6):
    torch.manual_seed(seed)
    probs = torch.tensor([[0.5, 0.05], [0.05, 0.5]])
    ei = stochastic_blockmodel_graph([n0, n1], probs)
    return Data(x=torch.randn(n0 + n1, features), edge_index=ei, num_nodes=n0 + n1)


@pytest.fixture(scope="module")
def graphs():
    t = GraphHierarchy(max_family=3, pe_dim=4)
    return [t(graph(5 + i, 4 + 2 * i, seed=i)) for i in range(3)]


@pytest.mark.parametrize("conv", ["gcn", "cone", None])
def test_shapes_and_backward(graphs, conv):
    g = graphs[0]
    local = {"gcn": GCNConv(6, 6), "cone": ConeConv(6, 6), None: None}[conv]
    layer = GraphHSAConv(6, local, heads=2, pos_channels=0, norm="layer_norm")
    x = g.x.clone().requires_grad_()
    out = layer(x, g.edge_index, g.hierarchy())
    assert out.shape == (g.num_nodes, 6)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in layer.attn.parameters())


def test_an_evaluation_under_inference_mode_then_training():
    """A community tree transformed and planned under ``torch.inference_mode()``: its
    plan, built outside inference mode, serves the training step that follows."""
    with torch.inference_mode():
        g = GraphHierarchy(max_family=3)(graph(6, 5, seed=7))
    net = GraphHSANet(6, 8, 2, heads=2)
    with torch.inference_mode():
        evaluated = net.eval()(g.x, g.edge_index, g.hierarchy())
    out = net(g.x.clone(), g.edge_index.clone(), g.hierarchy())
    out.square().sum().backward()
    assert torch.allclose(out, evaluated, atol=1e-6)


def test_global_branch_reaches_unlinked_nodes(graphs):
    # with no local conv and no edges, a node's output still depends on other nodes (HSA)
    g = graphs[1]
    layer = GraphHSAConv(6, None, heads=1, norm=None).double()
    x = g.x.double().requires_grad_()
    out = layer(x, torch.empty(2, 0, dtype=torch.long), g.hierarchy())
    out[0].sum().backward()
    assert x.grad[1:].abs().sum() > 0


def assert_batched_equals_per_graph(model, graphs):
    """The model on a PyG batch of ``graphs`` equals it on each graph alone; returns the batch's."""
    batch = Batch.from_data_list(graphs)
    together = model(batch.x.double(), batch.edge_index, batch.hierarchy())
    apart = torch.cat([model(g.x.double(), g.edge_index, g.hierarchy()) for g in graphs])
    torch.testing.assert_close(together, apart, rtol=1e-10, atol=1e-10)
    return together


def test_batched_small_graphs_equal_per_graph(graphs):
    torch.manual_seed(0)
    model = GraphHSANet(6, 8, 3, conv_factory=lambda c: GCNConv(c, c), heads=2, graph_pe_dim=4)
    model = model.double().eval()
    together = assert_batched_equals_per_graph(model, graphs)
    assert together.shape == (sum(g.num_nodes for g in graphs), 3)


@pytest.mark.parametrize("norm", ["layer_norm", "graph_norm", "instance_norm"])
def test_per_graph_norms_normalise_each_graph_of_a_batch_alone(graphs, norm):
    """(The norms got no batch vector: the graphs of a batch were normalised together, and
    a graph's output changed with the others.)"""
    torch.manual_seed(0)
    shifted = [g.clone() for g in graphs]
    for g in shifted:
        g.x = g.x.double()
    shifted[1].x = 10 * shifted[1].x + 5  # a graph whose features differ in scale
    conv = GraphHSAConv(6, GCNConv(6, 6), heads=2, norm=norm).double().eval()
    batch = Batch.from_data_list(shifted)
    together = conv(batch.x, batch.edge_index, batch).split([g.num_nodes for g in shifted])
    for g, out in zip(shifted, together, strict=True):
        torch.testing.assert_close(out, conv(g.x, g.edge_index, g))


def test_net_trains_a_step(graphs):
    torch.manual_seed(0)
    g = graphs[2]
    model = GraphHSANet(6, 8, 2, conv_factory=lambda c: GCNConv(c, c), graph_pe_dim=4)
    y = torch.arange(g.num_nodes) % 2
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.eval()
    before = torch.nn.functional.cross_entropy(model(g.x, g.edge_index, g.hierarchy()), y)
    for _ in range(20):
        model.train()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(g.x, g.edge_index, g.hierarchy()), y).backward()
        opt.step()
    model.eval()
    after = torch.nn.functional.cross_entropy(model(g.x, g.edge_index, g.hierarchy()), y)
    assert after < before
    assert repr(model) == "GraphHSANet(6, 8, 2, num_layers=2)"


def test_every_parameter_of_the_net_gets_a_gradient(graphs):
    """(With position features, the net built grid and key-value position encoders that
    community trees never use: no gradient, so DistributedDataParallel's default stopped.)"""
    g = graphs[2]
    model = GraphHSANet(6, 8, 2, conv_factory=lambda c: GCNConv(c, c), heads=2, graph_pe_dim=4)
    model(g.x, g.edge_index, g.hierarchy()).square().sum().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []


def test_a_graph_batch_stands_for_its_community_tree(graphs):
    """The layers, the position encoder and the pooling take a (batch of) graphs with their
    community tree as the tree itself (its cached ``hierarchy()``), as the type hints say."""
    from hiergraph.nn import global_leaf_mean_pool

    torch.manual_seed(0)
    batch = Batch.from_data_list(graphs)
    net = GraphHSANet(6, 8, 3, heads=2, graph_pe_dim=4).double().eval()
    x = batch.x.double()
    torch.testing.assert_close(
        net(x, batch.edge_index, batch), net(x, batch.edge_index, batch.hierarchy()),
        rtol=0, atol=0,
    )  # fmt: skip
    pooled = global_leaf_mean_pool(x, batch)
    torch.testing.assert_close(pooled, global_leaf_mean_pool(x, batch.hierarchy()))
    for wrong, match in ((batch.batch, "got a tensor .a batch vector"),
                         (graph(3, 3, seed=0), "Data without a community tree")):  # fmt: skip
        with pytest.raises(TypeError, match=match):
            global_leaf_mean_pool(x, wrong)
        with pytest.raises(TypeError, match=match):
            net(x, batch.edge_index, wrong)


def test_wrong_leaf_count_is_rejected(graphs):
    layer = GraphHSAConv(6, None)
    with pytest.raises(ValueError, match="num_leaves"):
        layer(graphs[0].x[:-1], graphs[0].edge_index, graphs[0].hierarchy())


def test_gate_starts_closed_and_learns(graphs):
    g = graphs[0]
    layer = GraphHSAConv(6, GCNConv(6, 6), heads=2, norm=None, gate=True, mlp=False).double()
    x = g.x.double()
    out = layer(x, g.edge_index, g.hierarchy())
    # tanh(0) = 0: only the local branch and the two residuals (h_l + h_g)
    torch.testing.assert_close(out, layer.conv(x, g.edge_index) + 2 * x)
    out.square().sum().backward()
    assert layer.gate.grad is not None and layer.gate.grad.abs() > 0
    with torch.no_grad():
        layer.gate.fill_(0.5)
    gated = layer(x, g.edge_index, g.hierarchy())
    assert torch.isfinite(gated).all() and not torch.allclose(gated, out)


def _gat_hybrid_net():
    """A gated GAT + HSA net on 6 input features (float64, eval mode)."""
    from torch_geometric.nn import GATConv

    return GraphHSANet(
        6, 8, 3, conv_factory=None, num_layers=1, heads=2, graph_pe_dim=4,
        input_conv=GATConv(6, 4, heads=2), output_conv=GATConv(8, 3, concat=False),
        act="elu", gate=True, mlp=False,
    ).double().eval()  # fmt: skip


def test_gat_hybrid_net_batched_equals_per_graph(graphs):
    torch.manual_seed(0)
    model = _gat_hybrid_net()
    with torch.no_grad():
        model.layers[0].gate.fill_(0.7)
    assert_batched_equals_per_graph(model, graphs)


def test_edge_kernel_equals_dense_kernel(graphs):
    g = graphs[1]
    torch.manual_seed(0)
    dense = GraphHSAConv(6, GCNConv(6, 6), heads=2, pos_channels=0, norm=None).double()
    edge = GraphHSAConv(6, GCNConv(6, 6), heads=2, pos_channels=0, norm=None, kernel="edge")
    edge.load_state_dict(dense.state_dict())
    x = g.x.double()
    torch.testing.assert_close(
        edge.double()(x, g.edge_index, g.hierarchy()),
        dense(x, g.edge_index, g.hierarchy()),
        rtol=1e-10,
        atol=1e-10,
    )


def test_input_dropout_on_csr_drops_stored_entries_only():
    torch.manual_seed(0)
    x = torch.rand(40, 30).double()
    x[x < 0.8] = 0
    csr = x.to_sparse_csr()
    assert input_dropout(csr, 0.5, training=False) is csr
    out = input_dropout(csr, 0.5, training=True).to_dense()
    kept = out != 0
    assert not kept[x == 0].any()  # zeros stay zero
    torch.testing.assert_close(out[kept], 2 * x[kept])  # survivors scaled by 1 / (1 - p)
    assert 0.3 < kept.sum() / (x != 0).sum() < 0.7


def test_net_takes_sparse_csr_features(graphs):
    g = graphs[0]
    torch.manual_seed(0)
    model = _gat_hybrid_net()
    x = g.x.double().relu()
    torch.testing.assert_close(
        model(x.to_sparse_csr(), g.edge_index, g.hierarchy()),
        model(x, g.edge_index, g.hierarchy()),
    )


def test_smooth_branch_is_the_hsa_matrix_times_the_features(graphs):
    g = graphs[2]
    torch.manual_seed(0)
    layer = GraphHSAConv(6, None, heads=2, norm=None, mlp=False, smooth=True).double()
    x = g.x.double()
    out, theta = layer.attn(x, g.hierarchy(), return_attention_weights=True)  # theta: [H, L, L]
    expected = torch.einsum("hij,jhc->ihc", theta, x.view(-1, 2, 3)).reshape(-1, 6)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert {n for n, _ in layer.named_parameters()} == {
        "attn.query.lin.weight",
        "attn.query.lin.bias",
        "attn.key.lin.weight",
        "attn.key.lin.bias",
    }
    with pytest.raises(ValueError, match="multiple of heads"):
        GraphHSAConv(6, None, heads=4, smooth=True)
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):  # (was 6 % 0)
        GraphHSAConv(6, None, heads=0, smooth=True)
    with pytest.raises(ValueError, match=r"x must have 6 features .*got 5"):  # (a matmul error)
        layer(x[:, :5], g.edge_index, g.hierarchy())


def test_hubs_are_chosen_per_graph_and_all_hubs_give_flat_attention(graphs):
    torch.manual_seed(0)
    model = GraphHSANet(6, 8, 3, conv_factory=lambda c: GCNConv(c, c), heads=2, graph_pe_dim=4,
                        hubs=2).double().eval()  # fmt: skip
    together = assert_batched_equals_per_graph(model, graphs)
    batch = Batch.from_data_list(graphs)
    for layer in model.layers:
        layer.attn.hubs = 0
    without_hubs = model(batch.x.double(), batch.edge_index, batch.hierarchy())
    assert torch.isfinite(without_hubs).all() and not torch.allclose(without_hubs, together)

    conv = GraphHSAConv(6, None, heads=2, hubs=batch.num_nodes, norm=None).double().eval()
    x = batch.x.double()
    lifted = conv(x, batch.edge_index, batch.hierarchy())
    conv.attn.hubs = 0
    flat = conv(x, batch.edge_index, flatten_hierarchy(batch.hierarchy()))
    torch.testing.assert_close(lifted, flat, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(hidden_channels=0), "hidden_channels"),
        (dict(in_channels=2.5), "in_channels"),
        (dict(out_channels=-1), "out_channels"),
        (dict(num_layers=-1), "num_layers"),
        (dict(graph_pe_dim=-2), "graph_pe_dim"),
        (dict(attn_dropout=2.0), "attn_dropout"),
        (dict(layer_dropout=-0.1), "layer_dropout"),
        (dict(gate="no", num_layers=0), "gate"),  # (flags read by truth value: "no" was on)
        (dict(mlp="no"), "mlp"),
        (dict(smooth=1), "smooth"),
    ],
)
def test_net_arguments_are_checked_by_their_own_names(kwargs, name):
    arguments = dict(in_channels=4, hidden_channels=8, out_channels=3) | kwargs
    with pytest.raises((TypeError, ValueError), match=f"^{name} must be"):
        GraphHSANet(**arguments)


def test_conv_attn_dropout_is_checked_by_its_own_name():
    with pytest.raises(ValueError, match="^attn_dropout must be"):
        GraphHSAConv(8, None, attn_dropout=2.0)


@pytest.mark.parametrize("flag", ["gate", "mlp", "smooth"])
def test_conv_flags_must_be_bools(flag):
    # read by truth value, gate="no" added a gate and mlp="no" the MLP
    with pytest.raises(TypeError, match=f"^{flag} must be a bool, got 'no'"):
        GraphHSAConv(8, None, **{flag: "no"})


def test_no_parameter_without_a_gradient_and_a_given_conv_keeps_its_weights(graphs):
    """Without a conv, the norm after the local branch was built and never used (its
    parameters never got a gradient: DDP's default stopped at the second step); a conv
    passed in was re-initialised by the constructor, and one without ``reset_parameters``
    made it raise ``AttributeError``."""
    g = graphs[0]
    layer = GraphHSAConv(6, None, heads=2)  # norm="batch_norm"
    layer(g.x, g.edge_index, g.hierarchy()).sum().backward()
    assert [n for n, p in layer.named_parameters() if p.grad is None] == []

    conv = GCNConv(6, 6)
    with torch.no_grad():
        conv.lin.weight.fill_(0.5)
    GraphHSAConv(6, conv)
    assert (conv.lin.weight == 0.5).all()

    class Plain(torch.nn.Module):  # no reset_parameters
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x, edge_index):
            return self.lin(x)

    layer = GraphHSAConv(6, Plain())
    with torch.no_grad():
        layer.conv.lin.weight.fill_(0.5)
    layer.reset_parameters()
    assert not (layer.conv.lin.weight == 0.5).all()


def test_reset_parameters_resets_the_activation():
    net = GraphHSANet(4, 8, 3, act="prelu")
    with torch.no_grad():
        net.act.weight.fill_(7.0)
    net.reset_parameters()
    assert (net.act.weight == 0.25).all()  # PReLU's initial slope
