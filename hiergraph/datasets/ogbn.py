"""Offline-friendly ``ogbn-*`` node-property datasets through ``ogb`` (when installed).

:func:`load_ogbn` reads an OGB node-property-prediction dataset with ``ogb``'s
own ``PygNodePropPredDataset`` (so the splits and features are exactly OGB's),
turns the official split into boolean ``train_mask`` / ``val_mask`` /
``test_mask`` on the graph, and returns the metric of ``ogb``'s ``Evaluator``
for that dataset. It never downloads and never asks on stdin: when the
folder ``<root>/<name with _>/``, its ``RELEASE_v<version>.txt`` (without it
``ogb`` asks whether to delete the folder) or both its raw and processed
files are missing, it raises :class:`FileNotFoundError` saying what is
expected where.

Only single-task, multi-class datasets with an accuracy metric (e.g.
``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``) are supported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from hiergraph.datasets.planetoid import data_root

OGBN_DATASETS = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
#: What ``ogb`` (1.3.6) pickles: it loads it with ``torch.load``, whose default is
#: ``weights_only=True`` since torch 2.6, so these must be allow-listed.
_PYG_PICKLED = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]


def _require_ogb():
    try:
        from ogb.nodeproppred import Evaluator, PygNodePropPredDataset
    except ImportError as err:  # ogb itself, or one of its dependencies (pandas)
        raise ImportError(
            f"ogbn-* datasets need the `ogb` package and its dependencies ({err}); "
            "install them with `pip install ogb`"
        ) from err
    return PygNodePropPredDataset, Evaluator


def _ogb_version(name: str) -> str:
    """The release ``ogb`` expects for ``name`` (its ``master.csv``)."""
    import ogb.nodeproppred
    import pandas as pd

    master = Path(ogb.nodeproppred.__file__).parent / "master.csv"
    return str(pd.read_csv(master, index_col=0, keep_default_na=False)[name]["version"])


def ogbn_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """Where ``ogb`` keeps ``name``: ``<root>/<name with '-' → '_'>``."""
    return data_root(root) / name.replace("-", "_")


def load_ogbn(
    name: str, root: str | os.PathLike | None = None
) -> tuple[Data, Callable[[Tensor, Tensor], float]]:
    """Load ``name`` (e.g. ``'ogbn-arxiv'``) and its OGB evaluator.

    Args:
        name: one of ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``.
        root: the data root (default ``$HIERGRAPH_DATA``, else ``datasets/``);
            the dataset folder is ``<root>/<name with _>`` as ``ogb`` lays it
            out (``raw/``, ``split/``, ``RELEASE_v*.txt``).

    Returns:
        ``(data, metric)``: the graph with ``y`` ``[N]`` and boolean masks
        ``train_mask`` / ``val_mask`` / ``test_mask`` (OGB's split), and
        ``metric(logits_or_pred, mask) -> float``, OGB's ``Evaluator`` on the
        nodes of ``mask``.
    """
    if name not in OGBN_DATASETS:
        raise ValueError(f"name must be one of {OGBN_DATASETS} (multi-class), got {name!r}")
    folder = ogbn_dir(name, root)
    if not (folder / "raw").is_dir() and not (folder / "processed").is_dir():
        raise FileNotFoundError(
            f"{name} not found: expected OGB's files (raw/, split/, RELEASE_v*.txt) under "
            f"{folder}; download {name} with ogb on a machine with internet and copy the "
            "folder there (or point root / $HIERGRAPH_DATA at its parent)"
        )
    dataset_cls, evaluator_cls = _require_ogb()
    release = folder / f"RELEASE_v{_ogb_version(name)}.txt"
    if not release.is_file():  # ogb would ask on stdin, and rmtree the folder on 'y'
        raise FileNotFoundError(
            f"{release} not found: it marks the OGB release of the files in {folder}; copy "
            "the whole folder as ogb downloaded it (this loader never asks to re-download)"
        )

    class OfflineDataset(dataset_cls):
        def download(self):  # PyG calls it when raw files are missing, even if processed
            if not all(Path(p).is_file() for p in self.processed_paths):
                raise FileNotFoundError(
                    f"{name}: neither OGB's raw files ({', '.join(self.raw_file_names)}) "
                    f"under {self.raw_dir} nor its processed files under "
                    f"{self.processed_dir}; this loader never downloads"
                )

    with torch.serialization.safe_globals(_PYG_PICKLED):  # ogb's torch.load of a PyG Data
        dataset = OfflineDataset(name, root=str(folder.parent))
    data = dataset[0]
    split = dataset.get_idx_split()
    out = Data(x=data.x, edge_index=data.edge_index, y=data.y.view(-1), num_nodes=data.num_nodes)
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        mask = torch.zeros(data.num_nodes, dtype=torch.bool)
        mask[split[part]] = True
        out[key] = mask
    evaluator = evaluator_cls(name)

    def metric(pred: Tensor, mask: Tensor) -> float:
        if pred.dim() == 2:
            pred = pred.argmax(-1)
        result = evaluator.eval(
            {"y_true": out.y[mask].view(-1, 1), "y_pred": pred[mask].view(-1, 1)}
        )
        return float(result[evaluator.eval_metric])

    return out, metric
