"""Shared helpers for the hiergraph.masks tests: dense views and brute-force definitions."""

import torch

from hiergraph.masks import edge_index_to_mask


def dense(edge_index, n):
    return edge_index_to_mask(edge_index, n, rows="query")


def brute_mask(n, allowed):
    """Dense mask[i, j] = allowed(i, j) from the definition (i = query, j = key)."""
    rows = [[bool(allowed(i, j)) for j in range(n)] for i in range(n)]
    return torch.tensor(rows, dtype=torch.bool).view(n, n)


def assert_canonical(edge_index):
    """Sorted by target then source, no duplicates."""
    key = edge_index[1] * (int(edge_index.max()) + 1) + edge_index[0]
    assert bool((key[1:] > key[:-1]).all())
