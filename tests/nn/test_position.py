import pytest
import torch

from hiergraph.data import Family, from_nested
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
    assert not torch.allclose(eps[0], eps[1])  # different grid cells
    title_nodes = [6, 7, 8]
    assert torch.allclose(eps[title_nodes], enc.grid1d(h.pos[title_nodes, :1].float()))
    keys = h.parent[[0, 4, 6]]
    assert torch.allclose(eps[keys], enc.keys.weight)  # one embedding per key id 0, 1, 2
    with pytest.raises(ValueError, match="key id 2 out of range"):
        FamilyPositionEncoder(8, num_keys=2)(h)


def test_graph_domain_uses_graph_pe():
    h = from_nested(Family([0, 1, 2], "graph"))
    h.graph_pe = torch.randn(h.num_nodes, 3)
    enc = FamilyPositionEncoder(4, graph_pe_dim=3)
    assert torch.allclose(enc(h)[:3], enc.graph(h.graph_pe[:3]))
