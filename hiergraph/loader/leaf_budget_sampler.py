r"""Memory-bounded batching of signal hierarchies: pack trees up to a leaf budget.

The memory of one HSA/HTE forward and backward pass grows linearly with the
number of leaves of the batch (every per-node and per-family tensor is
:math:`O(L)` for a bounded branching factor), not with the number of trees.
A fixed ``batch_size`` therefore either wastes memory on small trees or runs
out of it on large ones. These batch samplers cut the dataset into batches
whose total leaf count stays within ``max_leaves``, the way token-based dynamic
batching does for sequences:

.. math::
    \sum_{i \in \text{batch}} L_i \le L_{\max}
    \quad\text{unless the batch is one tree with } L_i > L_{\max}.

A tree larger than the budget is never split (HSA needs the whole tree) and
never dropped: it gets a batch of its own, and its memory is that of a batch
of :math:`L_i` leaves. Bound :math:`L_i` when you build the dataset if that is
too much.

Packing is greedy in sampling order (shuffled or not): a batch is closed as
soon as the next tree would overflow it. The order is therefore as random as
the underlying sampler, and each closed batch holds more than
:math:`L_{\max} - \max_i L_i` leaves (except the last one of an epoch).

Both samplers are plain ``batch_sampler`` s for PyG's (or torch's)
``DataLoader``; batching itself stays ``Batch.from_data_list``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from numbers import Real

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import Sampler

from hiergraph._checks import MAX_SEED, as_int, check_bool, check_int, check_seed, holds_integers
from hiergraph._runs import run_ptr


def leaf_counts(dataset, internal_weight: float = 0.0) -> Tensor:
    r"""``[len(dataset)]`` size of every tree of a dataset in leaves (leaf-equivalents).

    With ``internal_weight = w > 0`` a tree with :math:`L` leaves and :math:`I`
    internal nodes counts :math:`L + \lceil w I \rceil`: a better memory proxy
    when tree shapes vary (a binary tree has about one internal node per leaf,
    a tree of branching 16 about 1/15). ``benchmarks/leaf_budget.py`` fits
    :math:`w` from a probe.

    Reads the collated columns of an ``InMemoryDataset`` without materialising
    the trees when it can (no index subset, no ``transform``, which may change the trees);
    otherwise iterates the dataset once.

    Args:
        dataset: a dataset of signal hierarchies (every item has ``is_leaf``).
        internal_weight: the weight :math:`w` of an internal node, a finite number
            ``>= 0`` (default ``0.0``: leaves only).
    """
    if isinstance(internal_weight, bool) or not isinstance(internal_weight, Real):
        raise TypeError(f"internal_weight must be a number >= 0, got {internal_weight!r}")
    if not (internal_weight >= 0 and math.isfinite(internal_weight)):
        raise ValueError(f"internal_weight must be a finite number >= 0, got {internal_weight}")
    slices = getattr(dataset, "slices", None)
    subset, transform = getattr(dataset, "_indices", None), getattr(dataset, "transform", None)
    as_stored = subset is None and transform is None
    if slices is not None and "is_leaf" in slices and as_stored:
        ptr = slices["is_leaf"]
        cum = run_ptr(dataset._data.is_leaf.long())
        leaves, nodes = cum[ptr].diff(), ptr.diff()
    else:
        counts = [_leaves_and_nodes(dataset[i], i) for i in range(len(dataset))]
        leaves, nodes = torch.tensor(counts, dtype=torch.long).view(-1, 2).unbind(1)
    if internal_weight:
        return leaves + torch.ceil(internal_weight * (nodes - leaves)).long()
    return leaves


def _leaves_and_nodes(data, i: int) -> tuple[int, int]:
    if "is_leaf" not in data:
        raise ValueError(
            f"dataset item {i} has no 'is_leaf' attribute; leaf budgets need signal "
            "hierarchies (hiergraph.data.SignalHierarchy) or explicit leaf counts"
        )
    return int(data.is_leaf.sum()), data.is_leaf.numel()


def pack_by_budget(order: Sequence[int], sizes: Tensor, max_leaves: int) -> list[list[int]]:
    """Greedy packing of ``order`` into batches of at most ``max_leaves`` leaves.

    A tree with more than ``max_leaves`` leaves becomes a batch of its own.

    Args:
        order: the tree indices in the order to pack them (each in
            ``[0, len(sizes))``).
        sizes: ``[num_trees]`` leaves of every tree, each ``>= 1`` (see
            :func:`leaf_counts`).
        max_leaves: the leaf budget of one batch, a positive int.

    Returns:
        the batches, each a list of tree indices in packing order.

    Raises:
        TypeError, ValueError: ``sizes`` that are no leaf counts (:func:`leaf_counts`), a
            budget below 1, or an ``order`` entry that names no tree (an index sampler's
            ``-1`` took the last tree).
    """
    sizes = _check_counts(sizes, "sizes").tolist()
    max_leaves = _check_budget(max_leaves)
    order = [_tree_index(i, len(sizes)) for i in order]
    batches, current, used = [], [], 0
    for i in order:
        size = sizes[i]
        if current and used + size > max_leaves:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += size
        if used >= max_leaves:  # full, or a single oversized tree
            batches.append(current)
            current, used = [], 0
    if current:
        batches.append(current)
    return batches


class LeafBudgetBatchSampler(Sampler[list[int]]):
    r"""Batches of tree indices with at most ``max_leaves`` leaves in total.

    .. code-block:: python

        from torch_geometric.loader import DataLoader
        from hiergraph.loader import LeafBudgetBatchSampler, leaf_counts

        sampler = LeafBudgetBatchSampler(leaf_counts(dataset), max_leaves=16384, shuffle=True)
        loader = DataLoader(dataset, batch_sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in loader:  # a Batch of SignalHierarchy trees
                ...

    Args:
        leaf_counts: ``[num_trees]`` leaves of every tree (see :func:`leaf_counts`).
        max_leaves: the leaf budget :math:`L_{\max}` of one batch. A tree with
            more leaves than this gets a batch of its own.
        sampler: optional index sampler giving the order to pack (e.g. a
            :class:`~torch.utils.data.DistributedSampler`; see the note below).
            Mutually exclusive with ``shuffle``.
        shuffle: pack a fresh random permutation every epoch
            (seeded by ``seed + epoch``, modulo :math:`2^{64}`; call :meth:`set_epoch`).
        seed: base seed of the shuffle, in ``[0, 2**64 - 1]``.

    .. note::
        Wrapping a ``DistributedSampler`` packs each rank's shard
        independently, so ranks may get *different numbers of batches*. Under
        ``DistributedDataParallel`` the rank that runs out first would leave
        the others waiting in the gradient all-reduce forever; either train
        inside ``with model.join():`` (PyTorch's support for uneven inputs)
        or use :class:`DistributedLeafBudgetBatchSampler`, which gives every
        rank the same number of batches.
    """

    def __init__(
        self,
        leaf_counts: Tensor | Sequence[int],
        max_leaves: int,
        sampler: Sampler[int] | None = None,
        shuffle: bool = False,
        seed: int = 0,
    ):
        self.leaf_counts = _check_counts(leaf_counts)
        self.max_leaves = _check_budget(max_leaves)
        check_bool(shuffle, "shuffle")
        seed = check_seed(seed)
        if sampler is not None and shuffle:
            raise ValueError("pass either sampler= or shuffle=True, not both (shuffle the sampler)")
        self.sampler, self.shuffle, self.seed, self.epoch = sampler, shuffle, seed, 0
        self._pending: list[list[int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (forwarded to the wrapped sampler if it has ``set_epoch``)."""
        epoch = as_int(epoch, "epoch")  # (1.5 failed in manual_seed at the next pass)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch, self._pending = epoch, None
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _order(self) -> list[int]:
        if self.sampler is not None:
            return list(self.sampler)
        n = self.leaf_counts.numel()
        if self.shuffle:
            gen = torch.Generator().manual_seed((self.seed + self.epoch) % (MAX_SEED + 1))
            return torch.randperm(n, generator=gen).tolist()
        return list(range(n))

    def _pack(self) -> list[list[int]]:
        return pack_by_budget(self._order(), self.leaf_counts, self.max_leaves)

    def batches(self) -> list[list[int]]:
        """The batches the next iteration yields.

        They are packed once and kept until an iteration consumes them (or
        :meth:`set_epoch` is called), so ``len(sampler)`` and the batches
        agree even when the wrapped sampler draws a new order on every pass
        (an unseeded ``RandomSampler``).
        """
        if self._pending is None:
            self._pending = self._pack()
        return self._pending

    def __iter__(self) -> Iterator[list[int]]:
        batches, self._pending = self.batches(), None
        return iter(batches)

    def __len__(self) -> int:
        return len(self.batches())

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(trees={self.leaf_counts.numel()}, "
            f"max_leaves={self.max_leaves}, shuffle={self.shuffle})"
        )


class DistributedLeafBudgetBatchSampler(LeafBudgetBatchSampler):
    r"""The distributed :class:`LeafBudgetBatchSampler`: the same number of
    leaf-budget batches on every rank.

    Every rank packs the same global order (a permutation seeded by
    ``seed + epoch``, identical on all ranks) into leaf-budget batches, and
    rank :math:`r` of :math:`W` takes batches :math:`r, r + W, r + 2W, \dots`.
    The batch count is made a multiple of :math:`W` first: by repeating the
    first batches (the default, like ``DistributedSampler``'s padding) or by
    dropping the last ones (``drop_last=True``). Ranks therefore step in lock
    step under ``DistributedDataParallel``, each batch within the budget.

    .. note::
        DDP averages gradients over ranks, so with a per-batch mean loss the
        trees of a small batch weigh more than those of a large one. For a
        loss that is exactly the mean over all trees (or leaves) of a global
        step, sum the loss per rank and divide by the global count (an
        ``all_reduce`` of the count) times :math:`1/W`.

    Args:
        leaf_counts, max_leaves, seed: as in :class:`LeafBudgetBatchSampler`.
        num_replicas, rank: world size and rank (default: from the
            initialised process group).
        shuffle: a new global permutation every epoch (call :meth:`set_epoch`).
        drop_last: drop the trailing batches instead of repeating leading ones.
    """

    def __init__(
        self,
        leaf_counts: Tensor | Sequence[int],
        max_leaves: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        super().__init__(leaf_counts, max_leaves, shuffle=shuffle, seed=seed)
        if num_replicas is None or rank is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(
                    "num_replicas and rank are needed when no process group is initialised "
                    "(call torch.distributed.init_process_group first or pass them)"
                )
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        check_int(num_replicas, "num_replicas")
        check_int(rank, "rank", minimum=0)
        check_bool(drop_last, "drop_last")
        if not rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got rank={rank}, {num_replicas=}")
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last

    def _pack(self) -> list[list[int]]:
        batches = super()._pack()
        world = self.num_replicas
        if self.drop_last:
            batches = batches[: len(batches) // world * world]
        else:
            total = math.ceil(len(batches) / world) * world
            batches = (batches * math.ceil(total / max(len(batches), 1)))[:total]
        return batches[self.rank :: world]

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, rank={self.rank}/{self.num_replicas})"


def _check_counts(leaf_counts, name: str = "leaf_counts") -> Tensor:
    """``leaf_counts`` (the argument ``name``) as an int64 tensor, refused unless it holds one
    count >= 1 per tree."""
    counts = torch.as_tensor(leaf_counts)
    if counts.numel() == 0 and counts.dim() == 1:  # an empty list reads as float32
        counts = counts.long()
    if counts.dim() != 1 or not holds_integers(counts):
        raise TypeError(
            f"{name} must be a 1-D integer sequence (one count per tree), got "
            f"{counts.dtype} of shape {tuple(counts.shape)}"
        )
    if counts.numel() and int(counts.min()) < 1:
        raise ValueError(f"every tree needs at least one leaf: {name} must be >= 1")
    return counts.long()


def _tree_index(i, trees: int) -> int:
    """``i`` as an int (NumPy's and 0-d tensors too, :func:`~hiergraph._checks.as_int`),
    refused unless it is the index of one of ``trees`` trees."""
    index = as_int(i, "each index of the order to pack")
    if not 0 <= index < trees:
        raise ValueError(f"the order to pack must hold tree indices in [0, {trees}), got {i!r}")
    return index


def _check_budget(max_leaves) -> int:
    check_int(max_leaves, "max_leaves")
    return int(max_leaves)
