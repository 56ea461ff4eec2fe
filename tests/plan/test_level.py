"""A level's one gather of its gather blocks' slots, and its results written block by block."""

import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.plan import family_block
from tests.conftest import random_spec


@pytest.mark.parametrize("slice_saving", [None, 30.0])  # gather blocks only; mixed
def test_level_gather_and_results_round_trip(monkeypatch, slice_saving):
    """The one gather of a level's gather blocks gives every gather block its rows
    (``FamilyBlock.rows``), and results written block by block come back in level order."""
    if slice_saving is not None:
        monkeypatch.setattr(family_block, "SLICE_SAVING", slice_saving)
    rng = random.Random(5)
    trees = [from_nested(random_spec(rng, rng.randint(2, 30), max_branch=7)) for _ in range(6)]
    trees.append(window_hierarchy(37, (3, 5)))
    idx = Batch.from_data_list(trees).tree_index()
    kinds, paths = set(), set()
    for level in idx.levels[1:]:
        paths.add(_results_path(level))
        x = torch.randn(level.size, 2, 3)
        gathered = level.gather(x)
        rows, slots = level.result_buffers(x, (2, 3))
        for block in level.blocks:
            assert torch.equal(block.slots(x, gathered), block.rows(x))
            block.slots(rows, slots).copy_(block.rows(x))
            kinds.add(block.start is None)
        assert torch.equal(level.results(rows, slots), x)
    assert kinds == {True, False}  # gather and slice blocks both seen
    assert ("mixed" if slice_saving else "gathers") in paths  # both ways results come back


def _results_path(level) -> str:
    """How a level's block results come back: one gather, or slices plus gathered rows."""
    if "node_slot" in level.gathers:
        return "gathers"
    return "mixed" if "gather_src" in level.gathers else "slices"
