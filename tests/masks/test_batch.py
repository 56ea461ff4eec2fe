"""hiergraph.masks.batch: variable-length sequences as one PyG Batch (test T10)."""

import pytest
import torch

from hiergraph.masks import (
    causal_mask,
    sequence_batch,
    window_mask,
)


def test_sequence_batch():
    """T10: no edge crosses sequences; local edges equal the per-sequence mask."""
    lengths = [5, 3, 0, 4]
    x = torch.randn(12, 2)
    batch = sequence_batch(lengths, window_mask, x=x, p=1, causal=True)
    assert batch.num_graphs == 4 and batch.ptr.tolist() == [0, 5, 8, 8, 12]
    assert torch.equal(batch.x, x)
    assert batch.pos.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    src, dst = batch.edge_index
    assert torch.equal(batch.batch[src], batch.batch[dst])
    for g, n in enumerate(lengths):
        local = batch.get_example(g).edge_index
        assert torch.equal(local, window_mask(n, 1, causal=True))
    with pytest.raises(ValueError, match="lengths sum to 12"):
        sequence_batch(lengths, window_mask, x=x[:5], p=1)
    with pytest.raises(ValueError, match="at least one sequence"):  # (an IndexError in PyG)
        sequence_batch([], window_mask, p=1)
    with pytest.raises(TypeError, match="each length must be an int, got 2.7"):  # (was 2)
        sequence_batch([2.7], window_mask, p=1)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        sequence_batch([2, -1], causal_mask)


def test_sequence_batch_checks_the_edges_of_every_mask():
    """A builder's edges must lie in their own sequence: an id past it crossed into the next
    one (and past the batch's nodes), and float edges were batched as they came."""
    with pytest.raises(ValueError, match=r"mask of sequence 0 \(length 2\): .*out of range"):
        sequence_batch([2, 3], lambda n: window_mask(n + 1, 1))
    with pytest.raises(TypeError, match="mask of sequence 1 .*int64 or int32"):
        sequence_batch([2, 3], lambda n: window_mask(n, 1).float() if n == 3 else window_mask(n, 1))
    with pytest.raises(TypeError, match="x must be a tensor"):  # (an AttributeError)
        sequence_batch([2], window_mask, x=[[1.0], [2.0]], p=1)
