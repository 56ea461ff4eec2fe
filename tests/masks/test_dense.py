"""hiergraph.masks.dense: the converters fix the direction (PyG's dense_to_sparse
reads M[row, col] as an edge row -> col, while a mask is M[target, source])."""

import numpy as np
import pytest
import torch
from torch_geometric.utils import dense_to_sparse

from hiergraph.masks import (
    causal_mask,
    edge_index_to_mask,
    mask_to_edge_index,
)
from tests.masks.conftest import dense


def test_causal_direction_and_pyg_trap():
    """T2/T7: causal edges point from the past to the present; dense_to_sparse
    on the query-row mask silently gives anti-causal edges."""
    n = 6
    edge_index = causal_mask(n)
    assert bool((edge_index[0] <= edge_index[1]).all())
    mask = torch.ones(n, n).tril().bool()  # mask[query, key]: j <= i
    assert torch.equal(mask_to_edge_index(mask, rows="query"), edge_index)
    assert torch.equal(mask_to_edge_index(mask.T, rows="key"), edge_index)
    trap, _ = dense_to_sparse(mask.long())
    assert bool((trap[0] >= trap[1]).all())  # anti-causal
    fixed, _ = dense_to_sparse(mask.T.long())
    assert bool((fixed[0] <= fixed[1]).all()) and torch.equal(dense(fixed, n), mask)


def test_converters_round_trip_square_and_bipartite():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(7, 5, generator=gen) < 0.4  # 7 queries, 5 keys
    edge_index = mask_to_edge_index(mask, rows="query")
    assert int(edge_index[0].max()) < 5 and int(edge_index[1].max()) < 7
    assert torch.equal(edge_index_to_mask(edge_index, (5, 7), rows="query"), mask)
    assert torch.equal(edge_index_to_mask(edge_index, (5, 7), rows="key"), mask.T)
    square = torch.rand(6, 6, generator=gen) < 0.5
    assert torch.equal(dense(mask_to_edge_index(square, rows="query"), 6), square)
    edges = mask_to_edge_index(square, rows="query")  # NumPy and 0-d tensor sizes are ints
    for n in (np.int64(6), torch.tensor(6)):
        assert torch.equal(edge_index_to_mask(edges, n, rows="query"), square)
    with pytest.raises(ValueError, match="num_nodes must be an int >= 0, got -1"):  # (zeros)
        edge_index_to_mask(edges, -1, rows="query")
    with pytest.raises(TypeError, match="num_nodes must be an int, got tensor"):  # not cut
        edge_index_to_mask(edges, torch.tensor(6.5), rows="query")


def test_converter_bad_inputs():
    mask = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(TypeError):
        mask_to_edge_index(mask)  # rows is required, on purpose
    with pytest.raises(ValueError, match='rows must be "query"'):
        mask_to_edge_index(mask, rows="row")
    with pytest.raises(TypeError, match="BoolTensor"):
        mask_to_edge_index(mask.float(), rows="query")
    with pytest.raises(ValueError, match="outside the mask"):
        edge_index_to_mask(torch.tensor([[0], [3]]), 3, rows="query")
    with pytest.raises(ValueError, match="outside the mask"):  # not wrapped to the last row
        edge_index_to_mask(torch.tensor([[0], [-1]]), 3, rows="query")
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        edge_index_to_mask(torch.zeros(3, 2, dtype=torch.long), 3, rows="query")
