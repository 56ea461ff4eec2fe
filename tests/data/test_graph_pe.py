import numpy as np
import pytest
import torch

from hiergraph.data import Domain, Family, from_nested, laplacian_pe
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


def test_edge_index_and_k_types():
    """Float ids raised an ``IndexError``, a list an ``AttributeError``; a NumPy ``k`` was
    refused."""
    h = from_nested([Family([0, 1, 2], "graph"), 3])
    edges = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="edge_index must hold integers"):
        laplacian_pe(h, edges.float(), 2)
    expected = laplacian_pe(h, edges, 2)
    assert torch.equal(laplacian_pe(h, edges.tolist(), 2), expected)
    assert torch.equal(laplacian_pe(h, edges, np.int64(2)), expected)
    with pytest.raises(TypeError, match="k must be an int, got True"):
        laplacian_pe(h, edges, True)


def _per_family_reference(h, edges, k):
    """One dense eigendecomposition per family (float64)."""
    out = torch.zeros(h.num_nodes, k, dtype=torch.float64)
    gaps_ok = torch.zeros(h.num_nodes, k, dtype=torch.bool)
    for p in (~h.is_leaf).nonzero().view(-1).tolist():
        nodes = ((h.parent == p) & (torch.arange(h.num_nodes) != p)).nonzero().view(-1)
        idx = {v: i for i, v in enumerate(nodes.tolist())}
        adj = torch.zeros(len(idx), len(idx), dtype=torch.float64)
        for a, b in edges.T.tolist():
            if a in idx and b in idx:
                adj[idx[a], idx[b]] = adj[idx[b], idx[a]] = 1
        deg = adj.sum(1)
        d = torch.where(deg > 0, deg.clamp(min=1e-12).rsqrt(), torch.zeros_like(deg))
        lap = torch.eye(len(idx), dtype=torch.float64) - d[:, None] * adj * d
        vals, vecs = torch.linalg.eigh(lap)
        for j in range(min(k, len(idx) - 1)):
            v = vecs[:, j + 1]
            out[nodes, j] = v * torch.sign(v[v.abs().argmax()])
            gap = (vals - vals[j + 1]).abs()
            gap[j + 1] = 1.0
            gaps_ok[nodes, j] = bool(gap.min() > 1e-6)  # a unique eigenvector (up to sign)
    return out, gaps_ok


def test_batched_families_match_per_family_reference():
    gen = torch.Generator().manual_seed(0)
    sizes = [3, 5, 5, 5, 7, 2, 7]  # repeated sizes share one batched eigh
    starts = torch.tensor([0, *sizes]).cumsum(0).tolist()[:-1]
    families = [Family(list(range(a, a + s)), "graph") for a, s in zip(starts, sizes, strict=True)]
    h = from_nested(families)
    h.domain[h.parent != torch.arange(h.num_nodes)] = int(Domain.GRAPH)
    sib = (h.parent[:, None] == h.parent[None]) & (torch.arange(h.num_nodes)[:, None] != h.parent)
    sib &= torch.rand(h.num_nodes, h.num_nodes, generator=gen) < 0.6
    sib.fill_diagonal_(False)
    edges = sib.nonzero().T
    pe = laplacian_pe(h, edges, k=3)
    assert pe.dtype == torch.float32 and pe.device == h.parent.device
    with torch.device("meta"):  # every tensor is made on the inputs' device, not the default
        assert torch.equal(laplacian_pe(h, edges, k=3), pe)
    ref, unique = _per_family_reference(h, edges, 3)
    assert unique.sum() > 50 and unique[h.is_leaf].sum() > 30  # leaf families are covered
    assert torch.allclose(pe.double()[unique], ref[unique], atol=1e-5)
    assert torch.all(pe[~h.is_leaf & (h.parent == torch.arange(h.num_nodes))] == 0)  # the root


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    h = from_nested([Family([0, 1, 2, 3], "graph"), Family([4, 5, 6], "graph")])
    h.domain[h.parent != torch.arange(h.num_nodes)] = int(Domain.GRAPH)
    edges = torch.tensor([[0, 1, 2, 4, 5], [1, 2, 3, 5, 6]])
    pe = laplacian_pe(h.clone().to("cuda"), edges.cuda(), k=2)  # Data.to moves in place
    assert pe.is_cuda
    torch.testing.assert_close(pe.cpu(), laplacian_pe(h, edges, k=2), atol=1e-5, rtol=0)
