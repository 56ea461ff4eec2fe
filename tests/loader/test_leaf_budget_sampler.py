"""Leaf-budget batch samplers: budget, coverage, oversized trees, DDP lock step, PyG loaders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.loader import DataLoader

from hiergraph.data import window_hierarchy
from hiergraph.loader import (
    DistributedLeafBudgetBatchSampler,
    LeafBudgetBatchSampler,
    leaf_counts,
    pack_by_budget,
)


def mixed_sizes(n=60, seed=0):
    """Leaf counts from 1 to 200, with a few far above the budgets used below."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 40, (n,), generator=gen)
    sizes[::17] = 200
    return sizes


def check_batches(batches, sizes, budget):
    for batch in batches:
        total = int(sizes[batch].sum())
        assert total <= budget or len(batch) == 1, (batch, total)


@pytest.mark.parametrize("budget", [1, 37, 64, 500])
def test_pack_respects_budget_covers_once_and_keeps_order(budget):
    sizes = mixed_sizes()
    order = torch.randperm(sizes.numel(), generator=torch.Generator().manual_seed(1)).tolist()
    batches = pack_by_budget(order, sizes, budget)
    check_batches(batches, sizes, budget)
    assert [i for b in batches for i in b] == order
    # greedy: a closed batch could not take the next tree
    for batch, nxt in zip(batches[:-1], batches[1:], strict=True):
        assert int(sizes[batch].sum()) + int(sizes[nxt[0]]) > budget


def test_oversized_tree_gets_its_own_batch():
    sizes = torch.tensor([3, 2, 50, 4, 100, 1])
    assert pack_by_budget(range(6), sizes, 10) == [[0, 1], [2], [3], [4], [5]]


def test_packing_refuses_what_names_no_tree():
    """(``-1`` took the last tree; budgets of 0 or -3 and negative sizes were packed.)"""
    import numpy as np

    sizes = torch.tensor([3, 2, 5])
    assert pack_by_budget(np.array([2, 0]), sizes, 5) == [[2], [0]]  # NumPy's ints are indices
    assert pack_by_budget([torch.tensor(1)], sizes, 5) == [[1]]
    for order in ([0, -1], [3]):
        with pytest.raises(ValueError, match=r"tree indices in \[0, 3\)"):
            pack_by_budget(order, sizes, 5)
    for order in ([1.0], [True]):
        with pytest.raises(TypeError, match="each index of the order to pack must be an int"):
            pack_by_budget(order, sizes, 5)
    for budget in (0, -3):
        with pytest.raises(ValueError, match="max_leaves"):
            pack_by_budget([0], sizes, budget)
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        pack_by_budget([0], torch.tensor([3, -2, 5]), 5)
    sampler = LeafBudgetBatchSampler(sizes, 5, sampler=[0, 7])  # a sampler's bad index
    with pytest.raises(ValueError, match=r"got 7"):
        sampler.batches()
    shuffled = LeafBudgetBatchSampler(sizes, 5, shuffle=True)
    with pytest.raises(TypeError, match="epoch must be an int"):  # (manual_seed failed later)
        shuffled.set_epoch(1.5)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        shuffled.set_epoch(-1)
    shuffled.set_epoch(torch.tensor(2))  # a 0-d integer tensor (a training loop's counter)
    assert shuffled.epoch == 2


def trees(sizes):
    return [window_hierarchy(int(n), (4, 4), x=torch.randn(int(n), 3)) for n in sizes]


def test_with_pyg_dataloader_and_inmemory_dataset():
    sizes = mixed_sizes(30)
    data = trees(sizes)

    class Trees(InMemoryDataset):
        def __init__(self):
            super().__init__()
            self.data, self.slices = self.collate(data)

    dataset = Trees()
    counts = leaf_counts(dataset)
    assert torch.equal(counts, sizes)
    assert torch.equal(leaf_counts(data), sizes)
    assert torch.equal(leaf_counts(dataset[torch.arange(5, 12)]), sizes[5:12])
    dataset.transform = lambda tree: trees([2 * tree.num_leaves])[0]  # (its counts were read)
    assert torch.equal(leaf_counts(dataset), 2 * sizes)
    dataset.transform = None
    internal = torch.tensor([t.num_nodes - int(n) for t, n in zip(data, sizes, strict=True)])
    expected = sizes + torch.ceil(0.3 * internal).long()
    assert torch.equal(leaf_counts(dataset, internal_weight=0.3), expected)
    assert torch.equal(leaf_counts(data, internal_weight=0.3), expected)
    sampler = LeafBudgetBatchSampler(counts, max_leaves=80, shuffle=True, seed=3)
    leaves = []
    for batch, ids in zip(DataLoader(dataset, batch_sampler=sampler), sampler, strict=True):
        assert batch.num_leaves <= 80 or batch.num_graphs == 1
        assert batch.num_trees == batch.num_graphs == len(ids)
        assert batch.num_leaves == int(sizes[ids].sum())
        leaves.append(batch.num_leaves)
    assert sum(leaves) == int(sizes.sum())
    assert len(sampler) == len(sampler.batches())


def test_shuffle_is_seeded_per_epoch():
    sizes = mixed_sizes()
    sampler = LeafBudgetBatchSampler(sizes, 64, shuffle=True, seed=5)
    first = sampler.batches()
    assert sampler.batches() == first
    sampler.set_epoch(1)
    assert sampler.batches() != first
    assert LeafBudgetBatchSampler(sizes, 64).batches() == pack_by_budget(range(60), sizes, 64)


def test_flags_and_seeds_are_checked():
    """``shuffle="no"`` and ``drop_last="no"`` were true; a seed of 2**64 failed in
    ``manual_seed`` at the first pass ("Overflow when unpacking long long")."""
    with pytest.raises(TypeError, match="shuffle must be a bool"):
        LeafBudgetBatchSampler([3, 4], 8, shuffle="no")
    with pytest.raises(TypeError, match="shuffle must be a bool"):
        DistributedLeafBudgetBatchSampler([3, 4], 8, 1, 0, shuffle=1)
    with pytest.raises(TypeError, match="drop_last must be a bool"):
        DistributedLeafBudgetBatchSampler([3, 4], 8, 1, 0, drop_last="no")
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64 - 1\]"):
        LeafBudgetBatchSampler([3, 4], 8, shuffle=True, seed=2**64)
    sampler = LeafBudgetBatchSampler([3, 4, 5], 8, shuffle=True, seed=2**64 - 1)
    sampler.set_epoch(1)  # seed + epoch wraps around 2**64: the seed 0
    assert sampler.batches() == LeafBudgetBatchSampler([3, 4, 5], 8, shuffle=True).batches()


def test_len_matches_the_next_pass_of_an_unseeded_random_sampler():
    # RandomSampler draws a new order on every pass; len() must describe the pass
    # that follows it, and the next pass must reshuffle
    sizes = mixed_sizes()
    sampler = LeafBudgetBatchSampler(sizes, 64, sampler=RandomSampler(range(60)))
    passes = []
    for _ in range(5):
        announced, length = sampler.batches(), len(sampler)
        passes.append(list(sampler))
        assert passes[-1] == announced
        assert len(passes[-1]) == length
        check_batches(passes[-1], sizes, 64)
        assert sorted(i for b in passes[-1] for i in b) == list(range(60))
    assert len({str(p) for p in passes}) > 1


def test_composes_with_distributed_sampler():
    sizes = mixed_sizes()
    shards = []
    for rank in range(2):
        inner = DistributedSampler(range(60), num_replicas=2, rank=rank, shuffle=True, seed=7)
        sampler = LeafBudgetBatchSampler(sizes, 64, sampler=inner)
        sampler.set_epoch(2)
        assert inner.epoch == 2
        batches = sampler.batches()
        check_batches(batches, sizes, 64)
        shards.append({i for b in batches for i in b})
    assert shards[0].isdisjoint(shards[1])
    assert shards[0] | shards[1] == set(range(60))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("budget", [16, 64, 300])
def test_distributed_lock_step_and_coverage(world, drop_last, budget):
    sizes = mixed_sizes(45)
    per_rank = []
    for rank in range(world):
        sampler = DistributedLeafBudgetBatchSampler(
            sizes, budget, num_replicas=world, rank=rank, seed=11, drop_last=drop_last
        )
        sampler.set_epoch(4)
        per_rank.append(list(sampler))
        assert len(sampler) == len(per_rank[-1])
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1, "every rank must get the same number of batches"
    flat = [i for batches in per_rank for b in batches for i in b]
    for batches in per_rank:
        check_batches(batches, sizes, budget)
    if drop_last:
        assert len(flat) == len(set(flat))
    else:
        assert set(flat) == set(range(45))
    # step s of rank r is batch s * world + r of the global packing (its leading batches
    # repeated to fill the last step, or fewer than `world` trailing ones dropped)
    glob = LeafBudgetBatchSampler(sizes, budget, shuffle=True, seed=11)
    glob.set_epoch(4)
    packing = glob.batches()
    interleaved = [step[r] for step in zip(*per_rank, strict=True) for r in range(world)]
    assert interleaved == (packing * world)[: len(interleaved)]
    assert abs(len(interleaved) - len(packing)) < world


def test_bad_input():
    with pytest.raises(ValueError, match="max_leaves"):
        LeafBudgetBatchSampler([3, 4], 0)
    for counts in (torch.tensor([1.0, 2.0]), torch.tensor([1 + 0j])):  # (complex: min_all)
        with pytest.raises(TypeError, match="leaf_counts must be a 1-D integer sequence"):
            LeafBudgetBatchSampler(counts, 8)
    with pytest.raises(ValueError, match="at least one leaf"):
        LeafBudgetBatchSampler([3, 0], 8)
    with pytest.raises(ValueError, match="not both"):
        LeafBudgetBatchSampler([3], 8, sampler=range(1), shuffle=True)
    with pytest.raises(ValueError, match="process group"):
        DistributedLeafBudgetBatchSampler([3], 8)
    with pytest.raises(ValueError, match="rank"):
        DistributedLeafBudgetBatchSampler([3], 8, num_replicas=2, rank=2)
    for bad in (dict(num_replicas=2.0, rank=0), dict(num_replicas=2, rank=True)):  # (late)
        with pytest.raises(TypeError, match="(num_replicas|rank) must be"):
            DistributedLeafBudgetBatchSampler([3], 8, **bad)
    with pytest.raises(TypeError, match="seed must be an int, got None"):
        LeafBudgetBatchSampler([3], 8, shuffle=True, seed=None)
    assert LeafBudgetBatchSampler([3], np.int64(8)).max_leaves == 8  # a NumPy int is an int
    with pytest.raises(ValueError, match="is_leaf"):
        leaf_counts([Data(x=torch.zeros(2, 1))])
    with pytest.raises(ValueError, match="internal_weight"):
        leaf_counts([], internal_weight=-1.0)
    assert list(LeafBudgetBatchSampler([], 4)) == []  # an empty dataset (a dtype error before)
    with pytest.raises(ValueError, match="internal_weight must be a finite number"):
        leaf_counts([], internal_weight=float("nan"))  # (-9.2e18 per tree)
