import pytest
import torch

from hiergraph.data import Family, from_nested, laplacian_pe
from hiergraph.nn import FamilyPositionEncoder


def test_path_graph_family_matches_normalised_laplacian():
    h = from_nested([Family([0, 1, 2, 3], "graph"), 4])
    edges = torch.tensor([[0, 1, 2], [1, 2, 3]])  # path 0-1-2-3 (node ids = leaf ids here)
    pe = laplacian_pe(h, edges, k=2)
    adj = torch.zeros(4, 4, dtype=torch.float64)
    adj[[0, 1, 2], [1, 2, 3]] = 1
    adj = adj + adj.T
    d = adj.sum(1).rsqrt()
    lap = torch.eye(4, dtype=torch.float64) - d[:, None] * adj * d
    vals, vecs = torch.linalg.eigh(lap)
    for j in range(2):
        expected = vecs[:, j + 1]
        expected = expected * torch.sign(expected[expected.abs().argmax()])
        assert torch.allclose(pe[:4, j].double(), expected, atol=1e-6)
    assert torch.all(pe[4:] == 0)  # leaf 4 and the root are not graph members
    # the first feature (Fiedler vector) orders the path
    fiedler = pe[:4, 0]
    assert torch.all(fiedler[1:] > fiedler[:-1]) or torch.all(fiedler[1:] < fiedler[:-1])


def test_small_families_are_padded_and_encoder_uses_features():
    h = from_nested(Family([0, 1], "graph"))
    pe = laplacian_pe(h, torch.tensor([[0], [1]]), k=3)
    assert pe.shape == (h.num_nodes, 3) and torch.all(pe[:, 1:] == 0)
    h.graph_pe = pe
    enc = FamilyPositionEncoder(4, graph_pe_dim=3)
    assert torch.allclose(enc(h)[:2], enc.graph(pe[:2]))


def test_bad_edges():
    h = from_nested([Family([0, 1], "graph"), [2, 3]])
    with pytest.raises(ValueError, match="siblings"):
        laplacian_pe(h, torch.tensor([[0], [2]]), k=1)
    with pytest.raises(ValueError, match="Domain.GRAPH"):
        laplacian_pe(h, torch.tensor([[2], [3]]), k=1)
    with pytest.raises(ValueError, match="outside"):
        laplacian_pe(h, torch.tensor([[0], [99]]), k=1)
    with pytest.raises(ValueError, match="k must be"):
        laplacian_pe(h, torch.tensor([[0], [1]]), k=0)
