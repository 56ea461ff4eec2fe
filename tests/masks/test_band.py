"""hiergraph.masks.band: BandMask edge-count formula, definition and exact detection."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hiergraph.masks import (
    BandMask,
    block_diagonal_mask,
    causal_mask,
    cross_mask,
    dilated_mask,
    full_mask,
    random_mask,
    sequence_batch,
    window_mask,
)
from hiergraph.ops.masked.banded import banded_attention
from tests.masks.conftest import brute_mask, dense


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    before=st.integers(0, 6),
    after=st.integers(0, 6),
    dilation=st.integers(1, 3),
)
def test_band_count_formula_and_definition(lengths, before, after, dilation):
    band = BandMask(tuple(lengths), before, after, dilation)
    edge_index = band.edge_index()
    assert edge_index.size(1) == band.num_edges
    n = band.num_nodes
    seg = band.segment_ids().tolist()

    def allowed(i, j):
        off = i - j
        return (
            seg[i] == seg[j]
            and off % dilation == 0
            and -after * dilation <= off <= before * dilation
        )

    assert torch.equal(dense(edge_index, n), brute_mask(n, allowed))
    detected = BandMask.detect(edge_index, n)
    if n and (dilation == 1 or len([m for m in lengths if m]) <= 1):
        assert detected is not None
        assert torch.equal(detected.edge_index(), edge_index)


def test_detect_recognises_builders_in_any_order():
    gen = torch.Generator().manual_seed(0)
    for edge_index, n in [
        (window_mask(40, 3), 40),
        (window_mask(40, 5, causal=True), 40),
        (dilated_mask(40, 2, 3), 40),
        (block_diagonal_mask([5, 7, 3]), 15),
        (causal_mask(10), 10),
        (full_mask(10), 10),
        (sequence_batch([5, 9, 2], window_mask, p=2).edge_index, 16),
    ]:
        band = BandMask.detect(edge_index, n)
        shuffled = edge_index[:, torch.randperm(edge_index.size(1), generator=gen)]
        assert band is not None and BandMask.detect(shuffled, n) == band
        assert torch.equal(band.edge_index(), edge_index)
    assert BandMask.detect(sequence_batch([5, 9], window_mask, p=2).edge_index, 14).lengths == (
        5,
        9,
    )


def test_detect_rejects_everything_else():
    edge_index = window_mask(30, 2)
    extra = torch.tensor([[0], [10]])
    for other in [
        edge_index[:, 1:],  # one edge missing
        torch.cat([edge_index, edge_index[:, :1]], dim=1),  # a duplicate
        torch.cat([edge_index, extra], dim=1),  # one edge too many
        full_mask(30, self_loops=False),  # no diagonal
        random_mask(30, edge_index.size(1)),
        cross_mask(3, 4),
        torch.empty(2, 0, dtype=torch.long),
    ]:
        assert BandMask.detect(other, 30) is None
    # a missing edge replaced by a duplicate keeps the count: still rejected
    swapped = edge_index.clone()
    swapped[:, 5] = swapped[:, 6]
    assert BandMask.detect(swapped, 30) is None


def test_detect_refuses_what_is_no_edge_list_over_its_nodes():
    """As every edge input of :mod:`hiergraph.masks`: ids past ``num_nodes`` gave the band of
    ``num_nodes`` (node 3 of 3 nodes) or an ``IndexError``, float ids were read as ids."""
    with pytest.raises(ValueError, match="out of range"):
        BandMask.detect(torch.tensor([[0, 1, 3], [0, 1, 3]]), 3)
    with pytest.raises(ValueError, match="out of range"):
        BandMask.detect(torch.tensor([[0, 1, 0, 1, 5], [0, 0, 1, 1, 5]]), 3)
    with pytest.raises(TypeError, match="int64 or int32"):
        BandMask.detect(torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]), 3)
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        BandMask.detect(torch.zeros(3, 2, dtype=torch.long), 3)
    assert BandMask.detect(window_mask(5, 1).int(), 5) == BandMask((5,), 1, 1)  # int32 ids


@pytest.mark.parametrize(
    "args,error,message",
    [
        (((3,), -1, 0), ValueError, "before and after must be >= 0"),
        (((3, -1), 1, 0), ValueError, "lengths must be >= 0"),
        (((3,), 1, 0, 0), ValueError, "dilation must be >= 1"),
        (((3,), 1.5, 0), TypeError, "before must be an int"),
        (((3.5,), 1, 0), TypeError, "lengths must be an int"),
    ],
)
def test_band_bad_inputs(args, error, message):
    with pytest.raises(error, match=message):
        BandMask(*args)


def test_a_reach_past_the_longest_segment_is_the_same_band_and_cheap():
    """A width or dilation far beyond the sequence is clamped (``window_mask(3, 10**7)``
    built 2.4 GB of candidates for 9 edges; ``banded_attention`` with a dilation of 10**8
    took 1.9 GB on 3 tokens)."""
    huge = BandMask((3, 2), 10**7, 10**7)
    assert (huge.before, huge.after, huge.dilation) == (2, 2, 1)
    assert torch.equal(huge.edge_index(), BandMask((3, 2), 2, 2).edge_index())
    assert window_mask(3, 10**9).size(1) == 9
    assert BandMask((3,), 1, 0, dilation=10**6) == BandMask((3,), 0, 0)  # the diagonal
    q, k, v = (torch.randn(3, 1, 4, dtype=torch.float64) for _ in range(3))
    out = banded_attention(q, k, v, 1, 1, dilation=10**8)
    torch.testing.assert_close(out, v)  # each token alone: its own value
    wide = banded_attention(q, k, v, 10**7, 10**7)
    torch.testing.assert_close(wide, banded_attention(q, k, v, 2, 2))
