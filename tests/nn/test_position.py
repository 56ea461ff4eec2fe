import pytest
import torch

from hiergraph.data import Domain, Family, from_nested
from hiergraph.nn import FamilyPositionEncoder, LearnableFourierFeatures


def test_fourier_features_shape_and_grad():
    lff = LearnableFourierFeatures(2, 16, num_features=8)
    pos = torch.rand(5, 2, requires_grad=True)
    out = lff(pos)
    assert out.shape == (5, 16)
    out.sum().backward()
    assert lff.freq.weight.grad is not None and pos.grad is not None
    with pytest.raises(ValueError, match="even"):
        LearnableFourierFeatures(1, 4, num_features=3)
    for wrong in (torch.rand(5, 3), torch.rand(5)):  # (a matmul shape error)
        with pytest.raises(ValueError, match=r"pos must be \[..., n, pos_dim=2\]"):
            lff(wrong)
    batched = torch.rand(3, 5, 2)  # leading dimensions pass through
    torch.testing.assert_close(lff(batched), torch.stack([lff(p) for p in batched]))


def test_family_encoder_by_domain():
    grid = Family([0, 1, 2, 3], "2d", pos=[(0, 0), (0, 1), (1, 0), (1, 1)])
    spec = {"image": grid, "tags": Family([4, 5], "set"), "title": [6, 7, 8]}
    h = from_nested(spec, keys={"image": 0, "tags": 1, "title": 2})
    enc = FamilyPositionEncoder(8, num_keys=3)
    eps = enc(h)
    assert eps.shape == (h.num_nodes, 8)
    assert torch.all(eps[[4, 5]] == 0)  # unordered set
    root = int((h.parent == torch.arange(h.num_nodes)).nonzero())
    assert torch.all(eps[root] == 0)
    assert torch.isfinite(eps).all()
    assert not torch.allclose(eps[0], eps[1])  # different grid cells
    title_nodes = [6, 7, 8]
    assert torch.allclose(eps[title_nodes], enc.grid1d(h.pos[title_nodes, :1].float()))
    keys = h.parent[[0, 4, 6]]
    assert torch.allclose(eps[keys], enc.keys.weight)  # one embedding per key id 0, 1, 2
    with pytest.raises(ValueError, match=r"key ids span 0\.\.2; .* num_keys = 2"):
        FamilyPositionEncoder(8, num_keys=2)(h)
    negative = from_nested({-1: [0], 1: [1]})
    with pytest.raises(ValueError, match=r"key ids span -1\.\.1"):
        FamilyPositionEncoder(8, num_keys=3)(negative)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_exact_key_ids_and_positions(dtype):
    # key ids and grid indices above 256 (bfloat16) / 2048 (float16) are not representable
    h = from_nested({257: [0], 1001: [1], 3: list(range(2, 3002))})
    enc = FamilyPositionEncoder(8, num_keys=2000)
    half = FamilyPositionEncoder(8, num_keys=2000).to(dtype)
    half.load_state_dict(enc.state_dict())
    out = half(h)
    assert out.dtype == dtype
    keys = h.parent[[0, 1]]
    assert torch.equal(out[keys], half.keys.weight[[257, 1001]])
    # grid positions: only the MLP runs in half precision, the cosines are float32 ones
    grid = torch.arange(2, 3002)
    assert torch.equal(out[grid], half.grid1d.mlp(ref_features(half.grid1d, h.pos[grid, :1])))
    assert out[grid].unique(dim=0).size(0) > 2900  # distinct positions stay distinct


def ref_features(lff, pos):
    """The Fourier features of ``lff`` computed in float32, cast to its dtype."""
    proj = pos.float() @ lff.freq.weight.float().T
    feats = torch.cat([proj.cos(), proj.sin()], dim=-1) / (2 * proj.size(-1)) ** 0.5
    return feats.to(lff.freq.weight.dtype)


def test_fourier_features_run_in_float32_under_autocast():
    lff = LearnableFourierFeatures(1, 4, num_features=8)
    pos = torch.arange(3000.0).view(-1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lff(pos)
    ref = lff(pos)
    # the MLP runs under autocast (bfloat16 matmuls); the features themselves are exact
    assert (out.float() - ref).abs().max() < 0.05


def test_graph_domain_uses_graph_pe():
    h = from_nested(Family([0, 1, 2], "graph"))
    h.graph_pe = torch.randn(h.num_nodes, 3)
    enc = FamilyPositionEncoder(4, graph_pe_dim=3)
    assert torch.allclose(enc(h)[:3], enc.graph(h.graph_pe[:3]))
    for wrong in ((h.num_nodes, 4), (h.num_nodes - 1, 3)):  # (a matmul error, an IndexError)
        h.graph_pe = torch.randn(*wrong)
        with pytest.raises(
            ValueError,
            match=rf"graph_pe must be \[num_nodes, graph_pe_dim\] = \[{h.num_nodes}, 3\]",
        ):
            enc(h)
    # an encoder without a graph map encoded graph families as zero, silently
    h.graph_pe = torch.randn(h.num_nodes, 3)
    with pytest.raises(ValueError, match=r"no graph encoder.*graph_pe_dim=graph_pe"):
        FamilyPositionEncoder(4)(h)
    del h.graph_pe
    assert FamilyPositionEncoder(4)(h).abs().sum() == 0  # no graph_pe: no graph position


def test_domains_choose_the_encoders_built():
    """Only the chosen domains get weights (the others, never used by the data, would get no
    gradient: DistributedDataParallel stops on them); their families get zero, like sets."""
    grid = Family([0, 1, 2, 3], "2d", pos=[(0, 0), (0, 1), (1, 0), (1, 1)])
    h = from_nested({"image": grid, "title": [4, 5, 6]}, keys={"image": 0, "title": 1})
    torch.manual_seed(0)
    full = FamilyPositionEncoder(8, num_keys=2)
    torch.manual_seed(1)
    some = FamilyPositionEncoder(8, num_keys=2, domains=["1d", Domain.KEY_VALUE])
    assert some.grid2d is None and some.graph is None
    assert some.domains == (Domain.GRID1D, Domain.KEY_VALUE)
    some.load_state_dict(full.state_dict(), strict=False)
    assert not {name for name, _ in some.named_parameters()} - set(full.state_dict())
    eps, ref = some(h), full(h)
    in_grid = h.domain == Domain.GRID2D
    assert in_grid.sum() == 4 and eps[in_grid].abs().sum() == 0
    torch.testing.assert_close(eps[~in_grid], ref[~in_grid])
    eps.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in some.parameters())
    assert FamilyPositionEncoder(8, domains="2d").domains == (Domain.GRID2D,)
    graph = FamilyPositionEncoder(8, graph_pe_dim=3, domains=[5])
    assert graph.domains == (Domain.GRAPH,) and graph.keys is None
    assert repr(graph) == "FamilyPositionEncoder(8, num_keys=64, graph_pe_dim=3, domains=['graph'])"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(domains=[]),
            r"one or more of \['grid1d', 'grid2d', 'key_value', 'graph'\].*got \[\]",
        ),
        (dict(domains=["set", "1d"]), r"the others have no position\), got \['grid1d', 'set'\]"),
        (dict(domains=["graph"]), r"graph_pe_dim > 0 and domains including 'graph'"),
        (dict(domains=["1d"], graph_pe_dim=2), r"got graph_pe_dim=2 and domains \['grid1d'\]"),
        (dict(domains=["cone"]), r"unknown domain 'cone'"),
    ],
)
def test_domains_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FamilyPositionEncoder(8, **kwargs)


def test_reprs():
    assert repr(LearnableFourierFeatures(2, 8)) == "LearnableFourierFeatures(2, 8, num_features=64)"
    assert repr(FamilyPositionEncoder(8, graph_pe_dim=4)) == (
        "FamilyPositionEncoder(8, num_keys=64, graph_pe_dim=4)"
    )


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: LearnableFourierFeatures(0, 8), "pos_dim"),
        (lambda: LearnableFourierFeatures(1, 0), "out_channels"),
        (lambda: LearnableFourierFeatures(1, 8, num_features=0), "num_features"),
        (lambda: LearnableFourierFeatures(1, 8, hidden_channels=-4), "hidden_channels"),
        (lambda: LearnableFourierFeatures(1, 8, gamma=0), "gamma"),
        (lambda: FamilyPositionEncoder(0), "channels"),
        (lambda: FamilyPositionEncoder(8, num_keys=0), "num_keys"),
        (lambda: FamilyPositionEncoder(8, graph_pe_dim=-1), "graph_pe_dim"),
    ],
)
def test_arguments_are_checked(build, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        build()
