"""A PyG ``DataLoader`` that builds each batch's tree index where it collates the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch_geometric.loader import DataLoader


class HierarchyLoader(DataLoader):
    r"""PyG's :class:`~torch_geometric.loader.DataLoader` for signal hierarchies, with the
    :meth:`~hiergraph.data.SignalHierarchy.tree_index` of every batch built at collation.

    Building a :class:`~hiergraph.plan.TreeIndex` is data-dependent host work
    (sorting, bucketing families by size). Here it runs where the batch is
    collated: in the worker processes when ``num_workers > 0``, in parallel with
    the training step, and builds the whole plan, the parts that only some paths
    read included (:meth:`~hiergraph.plan.TreeIndex.complete`). The index travels
    with the batch, through the pickling that hands it to the main process and
    through ``batch.to(device)`` (``TreeIndex.to``), so the training loop does no
    structural work on the host and no host-device synchronisation for it.

    Example::

        loader = HierarchyLoader(dataset, batch_size=32, num_workers=2)
        for batch in loader:
            batch = batch.to(device)          # the index moves with it
            out = hierarchical_attention(q, k, v, batch)  # no rebuild

    Args:
        dataset: the dataset to load from; it must yield
            :class:`~hiergraph.data.SignalHierarchy` objects (a batch without
            ``tree_index`` raises a ``TypeError`` at collation).
        *args: further positional arguments of
            :class:`~torch_geometric.loader.DataLoader`.
        **kwargs: further keyword arguments of
            :class:`~torch_geometric.loader.DataLoader` (e.g. ``batch_size``,
            ``shuffle``, ``batch_sampler=LeafBudgetBatchSampler(...)``,
            ``num_workers``).
    """

    def __init__(self, dataset, *args: Any, **kwargs: Any):
        super().__init__(dataset, *args, **kwargs)
        self.collate_fn = _IndexedCollater(self.collate_fn)


class _IndexedCollater:
    """Wraps a collate function: collate, then build (and cache) the batch's tree index."""

    def __init__(self, collate: Callable):
        self.collate = collate

    def __call__(self, data_list: list) -> Any:
        batch = self.collate(data_list)
        if not hasattr(batch, "tree_index"):
            raise TypeError(
                "HierarchyLoader needs a dataset of SignalHierarchy objects; the collated "
                f"batch is a {type(batch).__name__} without tree_index()"
            )
        batch.tree_index()
        return batch
