"""Shared helpers for the hiergraph.masks tests: dense views and brute-force definitions."""

import pytest
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


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Mask tests use tiny tensors: on a shared 2-core machine, waking a second
    intra-op thread costs far more than the work. Import this fixture into a
    test module to run it single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
