"""Append schedules: the ``(close, open)`` events of a tree, and the tree back from them."""

import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested
from hiergraph.nn.kv_schedule import append_schedule, from_schedule
from tests.ops.hsa.test_causal import ordered_spec


def test_append_schedule_of_a_small_tree():
    h = from_nested([[0, 1], [[2], 3], 4])
    assert append_schedule(h).tolist() == [[0, 1], [0, 0], [1, 2], [1, 0], [1, 0]]
    with pytest.raises(ValueError, match="one tree"):
        append_schedule(Batch.from_data_list([h, h]))


def test_schedule_round_trip():
    rng = random.Random(5)
    for _ in range(10):
        spec = ordered_spec(rng, rng.randint(2, 20))
        if isinstance(spec, int):
            continue
        h = from_nested(spec)
        g = from_schedule(append_schedule(h))
        assert torch.equal(g.parent, h.parent) and torch.equal(g.slot, h.slot)


def test_schedules_that_are_no_pairs_are_refused():
    """(``[]`` made a tree of one leaf for no token; 1-D and 3-column schedules failed to
    unpack; float ones were truncated.)"""
    for schedule in ([], [0, 1], [[0, 1, 0]], torch.zeros(0, 2)):
        with pytest.raises(ValueError, match=r"schedule must be \[L, 2\] \(close, open\) pairs"):
            from_schedule(schedule)
    with pytest.raises(TypeError, match="schedule must hold integers"):
        from_schedule([[0, 1.5]])
    with pytest.raises(ValueError, match=r"invalid \(close, open\) = \(1, 0\) at token 0"):
        from_schedule([[1, 0]])
