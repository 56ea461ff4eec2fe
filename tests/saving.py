"""Reading PyG data back from a file as PyG's ``InMemoryDataset`` does, weights-only."""

import warnings

from torch_geometric.data import InMemoryDataset


def reloaded(items: list, path: str, data_cls) -> InMemoryDataset:
    """``items`` saved with ``InMemoryDataset.save`` and loaded back into a dataset of
    ``data_cls``; raises where PyG's read with ``weights_only=True`` fails (PyG itself
    warns, then reads the file again with ``weights_only=False``)."""
    InMemoryDataset.save(items, path)
    dataset = InMemoryDataset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset.load(path, data_cls=data_cls)
    return dataset
