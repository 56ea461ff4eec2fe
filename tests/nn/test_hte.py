import pytest
import torch
from torch_geometric.data import Batch
from torch_geometric.loader import DataLoader

from hiergraph.data import (
    Domain,
    flatten_hierarchy,
    from_nested,
    random_window_hierarchy,
    window_hierarchy,
)
from hiergraph.nn import HierarchicalTransformerEncoder, HTELayer, global_leaf_mean_pool


def _batch():
    torch.manual_seed(0)
    trees = [
        window_hierarchy(12, (3, 2), x=torch.randn(12, 6)),
        from_nested([[0, 1], [2, [3, 4]]], x=torch.randn(5, 6)),
    ]
    return Batch.from_data_list(trees)


@pytest.mark.parametrize("attention", ["hsa", "flat", "none"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_modes_run_and_backprop(attention, norm_first):
    b = _batch()
    enc = HierarchicalTransformerEncoder(
        6, 16, num_layers=2, heads=4, attention=attention, norm_first=norm_first
    )
    out = enc(b.x, b)
    assert out.shape == (17, 16) and torch.isfinite(out).all()
    out.sum().backward()


def test_flat_mode_is_hsa_on_flattened_trees():
    b = _batch()
    torch.manual_seed(3)
    flat = HierarchicalTransformerEncoder(
        6, 8, num_layers=1, attention="flat", pos_channels=0
    ).eval()
    hsa = HierarchicalTransformerEncoder(6, 8, num_layers=1, attention="hsa", pos_channels=0).eval()
    hsa.load_state_dict(flat.state_dict())
    assert torch.allclose(flat(b.x, b), hsa(b.x, flatten_hierarchy(b)), atol=1e-6)
    out = hsa(b.x, b)
    assert torch.isfinite(out).all() and not torch.allclose(flat(b.x, b), out, atol=1e-4)


def test_deepset_mode_has_no_interaction():
    b = _batch()
    enc = HierarchicalTransformerEncoder(6, 8, attention="none").eval()
    x2 = b.x.clone()
    x2[5] += 1.0
    diff = (enc(b.x, b) - enc(x2, b)).abs().sum(-1)
    assert diff[5] > 0 and torch.all(diff[torch.arange(17) != 5] == 0)


def test_layer_rejects_unknown_mode():
    with pytest.raises(ValueError, match="attention must be one of"):
        HierarchicalTransformerEncoder(4, 4, attention="linear")
    layer = HTELayer(8, heads=2, attention=False)
    assert layer.attn is None


def test_tiny_training_learns():
    """A 1-layer HTE separates trees whose first family's mean is positive from the rest."""
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(64):
        h = random_window_hierarchy(24, (4, 3), x=torch.randn(24, 4, generator=gen), generator=gen)
        h.y = torch.tensor([int(h.x[:4, 0].mean() > 0)])
        data.append(h)
    torch.manual_seed(0)
    enc = HierarchicalTransformerEncoder(4, 16, num_layers=1, heads=2)
    head = torch.nn.Linear(16, 2)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=1e-2)
    losses = []
    for _ in range(8):
        for batch in DataLoader(data, batch_size=16, shuffle=False):
            logits = head(global_leaf_mean_pool(enc(batch.x, batch), batch))
            loss = torch.nn.functional.cross_entropy(logits, batch.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: HTELayer(8, heads=0), "heads must be a positive int, got 0"),
        (lambda: HTELayer(0), "channels must be a positive int"),
        (lambda: HTELayer(8, heads=2, mlp_channels=0), "mlp_channels must be a positive int"),
        (lambda: HTELayer(8, heads=2, kernel="fast"), "kernel must be one of"),
        (lambda: HierarchicalTransformerEncoder(8, 16, heads=0), "heads must be a positive int"),
        (lambda: HierarchicalTransformerEncoder(8, 0), "hidden_channels must be a positive"),
        (lambda: HierarchicalTransformerEncoder(8, 16, num_layers=-1), "num_layers must be"),
        (lambda: HierarchicalTransformerEncoder(8, 16, kernel="fast"), "kernel must be one of"),
        (lambda: HierarchicalTransformerEncoder(8, 16, num_keys=0), "num_keys must be"),
    ],
)
def test_constructors_reject_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: HTELayer(8, heads=2, attention="none"), "attention must be a bool, got 'none'"),
        (lambda: HTELayer(8, heads=2, norm_first="no"), "norm_first must be a bool, got 'no'"),
        (lambda: HierarchicalTransformerEncoder(8, 16, norm_first=0), "norm_first must be a bool"),
    ],
)
def test_flags_must_be_bools(make, match):
    """(A string flag was read by its truth value: ``attention="none"`` kept the attention
    block, ``norm_first="no"`` was pre-norm.)"""
    with pytest.raises(TypeError, match=match):
        make()


def test_forward_names_wrong_feature_sizes():
    h = window_hierarchy(6, (3,))
    with pytest.raises(ValueError, match=r"x must have 8 features .*in_channels=8.*got 5"):
        HierarchicalTransformerEncoder(8, 16, heads=2)(torch.randn(6, 5), h)
    with pytest.raises(
        ValueError, match=r"x must be \[num_leaves=6, in_channels=8\], got \(5, 8\)"
    ):
        HierarchicalTransformerEncoder(8, 16, heads=2)(torch.randn(5, 8), h)
    with pytest.raises(ValueError, match=r"x must have 8 features .*channels=8.*got 16"):
        HTELayer(8, heads=2)(torch.randn(6, 16), h)
    with pytest.raises(ValueError, match=r"x must have 8 features .*channels=8.*got 16"):
        HTELayer(8, heads=2, attention=False)(torch.randn(6, 16), h)
    with pytest.raises(ValueError, match=r"x must be \[num_leaves, channels=8\], got \(2, 6, 8\)"):
        HTELayer(8, heads=2)(torch.randn(2, 6, 8), h)


@pytest.mark.parametrize("hubs", [0, 3])
def test_compiles_as_one_graph_once_the_plan_is_built(hubs):
    """With the batch's plan built, the encoder (position embeddings, hub leaves on equal
    trees) traces as one graph: the same output and gradients as eager."""
    batch = Batch.from_data_list(
        [window_hierarchy(32, (4, 2, 4), x=torch.randn(32, 16)) for _ in range(3)]
    )
    batch.tree_index()
    torch.manual_seed(0)
    model = HierarchicalTransformerEncoder(16, 32, num_layers=2, heads=2, hubs=hubs)
    x = batch.x.clone().requires_grad_()
    want = model(x, batch)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x)
    torch._dynamo.reset()
    got = torch.compile(model, backend="eager", fullgraph=True)(x, batch)
    (got_grad,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_a_batch_left_behind_by_to_device_is_named():
    """The model and ``x`` moved, the hierarchy not: the error says to move the hierarchy
    (it was PyTorch's device error from inside the input projection)."""
    trees = [window_hierarchy(n, (4,), x=torch.randn(n, 8)) for n in (8, 12)]
    batch = next(iter(DataLoader(trees, batch_size=2)))
    model = HierarchicalTransformerEncoder(8, 16, num_layers=1, heads=2).to("meta")
    with pytest.raises(ValueError, match=r"hierarchy is on cpu but x is on meta.*hierarchy.to"):
        model(batch.x.to("meta"), batch)


def test_domains_leave_no_parameter_without_a_gradient():
    """Window trees have 1-D grids only: by default the 2-D grid and key encoders get no
    gradient (DistributedDataParallel's default stops); ``domains=("grid1d",)`` builds
    the 1-D encoder alone, and the encoder computes the same."""
    trees = Batch.from_data_list([random_window_hierarchy(n, (2, 3), x=torch.randn(n, 4))
                                  for n in (5, 9)])  # fmt: skip
    unused = []
    for domains in (None, ("grid1d",)):
        torch.manual_seed(0)
        model = HierarchicalTransformerEncoder(4, 8, 1, 2, pos_channels=6, domains=domains)
        model(trees.x, trees).square().sum().backward()
        unused.append({name for name, p in model.named_parameters() if p.grad is None})
    assert unused[0] >= {"pos.grid2d.freq.weight", "pos.keys.weight"} and unused[1] == set()
    assert HierarchicalTransformerEncoder(4, 8, domains=["1d"]).pos.domains == (Domain.GRID1D,)
