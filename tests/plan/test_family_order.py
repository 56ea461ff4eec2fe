from __future__ import annotations

import importlib

import torch

from hiergraph.plan.family_order import family_order


def test_sorts_by_parent_then_slot_keeping_ties_in_input_order():
    gen = torch.Generator().manual_seed(0)
    parent = torch.randint(0, 5, (200,), generator=gen)
    slot = torch.randint(0, 4, (200,), generator=gen)
    expected = sorted(range(200), key=lambda i: (int(parent[i]), int(slot[i]), i))
    assert family_order(parent, slot).tolist() == expected


def test_any_int64_slots():
    big = 2**63 - 1
    parent = torch.tensor([1, 0, 1, 0])
    slot = torch.tensor([-big, big, big, -big - 1])
    assert family_order(parent, slot).tolist() == [3, 1, 0, 2]


def test_one_sort_and_two_sorts_agree(monkeypatch):
    """The combined key (one sort, where it fits int64) orders as the two stable sorts do."""
    module = importlib.import_module("hiergraph.plan.family_order")  # (the function shadows it)
    gen = torch.Generator().manual_seed(1)
    for top in (3, 2**20):
        parent = torch.randint(0, 50, (500,), generator=gen)
        slot = torch.randint(0, top, (500,), generator=gen)
        assert module.combined_key(parent, slot) is not None
        one = family_order(parent, slot)
        monkeypatch.setattr(module, "combined_key", lambda *args: None)  # two sorts
        assert family_order(parent, slot).tolist() == one.tolist()
        monkeypatch.undo()


def test_the_combined_key_only_where_it_fits():
    """Up to :data:`_KEY_LIMIT` (parent ``p`` <= 1 and slots below ``limit / 2``: keys below
    the limit) the key is built; a larger slot, a negative one or a negative parent key
    leaves it to the two sorts."""
    module = importlib.import_module("hiergraph.plan.family_order")
    half = module._KEY_LIMIT // 2
    parent = torch.tensor([1, 1, 0])
    key = module.combined_key(parent, torch.tensor([half - 1, 0, 5]))
    assert key.tolist() == [2 * half - 1, half, 5]
    for bad_parent, bad_slot in (([1, 1, 0], [half, 0, 5]), ([1, 1, 0], [3, -1, 5]),
                                 ([1, -1, 0], [3, 0, 5])):  # fmt: skip
        assert module.combined_key(torch.tensor(bad_parent), torch.tensor(bad_slot)) is None
    assert module.combined_key(torch.tensor([], dtype=torch.long), torch.tensor([])) is None
