"""``ogbn-*`` node-property datasets through ``ogb`` (when installed).

:func:`load_ogbn` reads an OGB node-property-prediction dataset with ``ogb``'s
own ``PygNodePropPredDataset`` (so the splits and features are exactly OGB's),
turns the official split into boolean ``train_mask`` / ``val_mask`` /
``test_mask`` on the graph, and returns the metric of ``ogb``'s ``Evaluator``
for that dataset. It never asks on stdin. When the folder
``<root>/<name with _>/`` is missing, it downloads OGB's official zip (the URL
in ``ogb``'s ``master.csv``) through a temporary file and unpacks it there,
unless the zip is larger than :data:`MAX_AUTO_DOWNLOAD` (``ogbn-papers100M``)
or downloads are off (``$HIERGRAPH_OFFLINE``); OGB publishes no checksums, so
only the download's completeness and the zip's CRCs are checked. When the
folder exists but its ``RELEASE_v<version>.txt`` (without it ``ogb`` asks
whether to delete the folder) or both its raw and processed files are
missing, it raises :class:`FileNotFoundError` saying what is expected where.

Only single-task, multi-class datasets with an accuracy metric (e.g.
``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``) are supported.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from gzip import BadGzipFile
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data

from hiergraph._checks import holds_integers
from hiergraph.datasets.download import RemoteFile, fetch
from hiergraph.datasets.errors import (
    CorruptFileError,
    DownloadError,  # noqa: F401 - raised by load_ogbn, caught as ogbn.DownloadError
)
from hiergraph.datasets.graph_checks import graph_problems
from hiergraph.datasets.locate import data_root, locate_raw
from hiergraph.datasets.locks import atomic_path, file_lock
from hiergraph.datasets.processed import CheckedRecords, weights_only_loads

OGBN_DATASETS = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
#: Largest OGB zip downloaded automatically, in bytes (ogbn-arxiv is 81 MB,
#: ogbn-products 1.4 GB, ogbn-papers100M 56 GB: get that one with ``ogb`` itself).
MAX_AUTO_DOWNLOAD = 2 << 30


def _require_ogb():
    try:
        from ogb.nodeproppred import Evaluator, PygNodePropPredDataset
    except ImportError as err:  # ogb itself, or one of its dependencies (pandas)
        raise ImportError(
            f"ogbn-* datasets need the `ogb` package and its dependencies ({err}); "
            "install them with `pip install ogb`"
        ) from err
    return PygNodePropPredDataset, Evaluator


def _ogb_meta(name: str) -> dict[str, str]:
    """``ogb``'s ``master.csv`` entry for ``name``: ``version``, ``url``, ``download_name``..."""
    import ogb.nodeproppred
    import pandas as pd

    master = Path(ogb.nodeproppred.__file__).parent / "master.csv"
    column = pd.read_csv(master, index_col=0, keep_default_na=False)[name]
    return {key: str(value) for key, value in column.items()}


def _ogb_version(name: str) -> str:
    """The release ``ogb`` expects for ``name`` (its ``master.csv``)."""
    return _ogb_meta(name)["version"]


def _download_ogbn(name: str, folder: Path) -> None:
    """Fetch OGB's zip for ``name`` and unpack its top folder's content into ``folder``."""
    meta = _ogb_meta(name)
    top = meta["download_name"]
    remote = RemoteFile(f"{top}.zip", (meta["url"],), None)
    archive = fetch(remote, folder.parent / remote.filename, max_bytes=MAX_AUTO_DOWNLOAD)
    unpacked = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        try:
            with zipfile.ZipFile(archive) as z:
                size, free = sum(i.file_size for i in z.infolist()), shutil.disk_usage(unpacked)
                if size > free.free:  # (zipfile reads no member past its stated size)
                    raise CorruptFileError(
                        archive,
                        f"{archive} (from {meta['url']}) unpacks to {size} bytes, more than "
                        f"the {free.free} free in {folder.parent}",
                    )
                z.extractall(unpacked)  # zipfile drops absolute paths and '..'
        except (zipfile.BadZipFile, EOFError, OSError, RuntimeError, NotImplementedError) as err:
            raise CorruptFileError(
                archive, f"{archive} (from {meta['url']}) is not a readable zip: {err}"
            ) from err
        if not (unpacked / top).is_dir():
            raise CorruptFileError(
                archive, f"{archive} (from {meta['url']}) has no top folder {top!r}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        for entry in (unpacked / top).iterdir():
            if not (folder / entry.name).exists():
                os.replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            archive.unlink()


def ogbn_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """Where ``ogb`` keeps ``name``: ``<root>/<name with '-' → '_'>``."""
    return data_root(root) / name.replace("-", "_")


def load_ogbn(
    name: str, root: str | os.PathLike | None = None
) -> tuple[Data, Callable[[Tensor, Tensor], float]]:
    """Load ``name`` (e.g. ``'ogbn-arxiv'``) and its OGB evaluator.

    Args:
        name: one of ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``.
        root: the data root (default ``$HIERGRAPH_DATA``, else ``~/.cache/hiergraph``);
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
    dataset_cls, evaluator_cls = _require_ogb()
    with file_lock(folder / "processed"):  # one process downloads and processes
        dataset = _open_ogbn(name, folder, dataset_cls)
    with _read_by_ogb(folder):
        data = dataset[0]
        split = dataset.get_idx_split()
    y = data.y.view(-1) if isinstance(data.y, Tensor) else data.y
    out = Data(x=data.x, edge_index=data.edge_index, y=y, num_nodes=data.num_nodes)
    problems = _split_problems(split, data.num_nodes)
    if not problems:
        for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
            out[key] = torch.zeros(data.num_nodes, dtype=torch.bool)
            out[key][split[part].long()] = True
        problems = graph_problems(out, classes=dataset.num_classes)
    if problems:
        raise CorruptFileError(
            folder,
            f"{folder}: ogb read it, but it holds no {name} graph: {'; '.join(problems)}; "
            "delete the folder to download it again",
        )
    evaluator = evaluator_cls(name)

    def metric(pred: Tensor, mask: Tensor) -> float:
        if pred.dim() == 2:
            pred = pred.argmax(-1)
        result = evaluator.eval(
            {"y_true": out.y[mask].view(-1, 1), "y_pred": pred[mask].view(-1, 1)}
        )
        return float(result[evaluator.eval_metric])

    return out, metric


@contextlib.contextmanager
def _read_by_ogb(folder: Path):
    """``ogb`` reads ``folder`` inside: its ``torch.load`` calls with ``weights_only=True``
    only (:func:`~hiergraph.datasets.processed.weights_only_loads`; PyTorch before 2.6
    would unpickle whatever its processed and split files hold), and a file it cannot parse
    (truncated, damaged, holding code) raises a
    :class:`~hiergraph.datasets.errors.CorruptFileError` naming the folder; errors of the
    machine (no permission, a full disk, out of memory) are raised as they are."""
    try:
        with weights_only_loads():
            yield
    except CorruptFileError:
        raise
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, BadGzipFile) as err:
        if isinstance(err, RuntimeError) and "memory" in str(err).lower():
            raise  # (out of memory: not the files' fault)
        raise CorruptFileError(
            folder,
            f"{folder}: ogb could not read it ({type(err).__name__}: {err}); a file in it is "
            "truncated, damaged or not OGB's: delete the folder to download it again",
        ) from err


def _split_problems(split, nodes: int) -> list[str]:
    """What is wrong with ``ogb``'s split (``split/``): it must map ``train``, ``valid`` and
    ``test`` to integer node ids ``[n]`` in ``[0, nodes)``."""
    if not isinstance(split, dict):
        return [f"the split is {type(split).__name__}, not a dict of node ids"]
    problems = []
    for part in ("train", "valid", "test"):
        ids = split.get(part)
        if not (isinstance(ids, Tensor) and holds_integers(ids)) or ids.dim() != 1:
            shape = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else repr(ids)
            problems.append(f"the {part} split must be integer node ids [n], got {shape}")
        elif ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < nodes:
            problems.append(
                f"the {part} split holds node ids {int(ids.min())}..{int(ids.max())} for "
                f"{nodes} nodes"
            )
    return problems


def _open_ogbn(name: str, folder: Path, dataset_cls):
    """``ogb``'s dataset for ``name`` in ``folder``, downloaded first when absent."""

    legacy = folder.with_name(f"{folder.name}_pyg")
    if legacy.exists():  # ogb would read that folder instead (an older layout of its own)
        raise FileExistsError(
            f"{legacy} exists: ogb reads {name} from it instead of {folder}; move it away "
            f"(or delete it) to load {folder}"
        )

    def present(place: Path) -> Path | None:
        has_raw = (place / "raw").is_dir() or any((place / "processed").glob("*.pt"))
        return place if has_raw else None

    locate_raw(
        name,
        [folder],
        present,
        "OGB's files (raw/, split/, RELEASE_v*.txt) as ogb lays them out",
        lambda: _download_ogbn(name, folder),
        how_to_get=(
            f"Download {name} with ogb itself (PygNodePropPredDataset({name!r}, root=...)) and "
            "copy the folder it makes."
        ),
        noun="OGB's files",
        raw_env=None,
        raw_dir_argument=False,
        data_folder=folder.name,
    )
    release = folder / f"RELEASE_v{_ogb_version(name)}.txt"
    if not release.is_file():  # ogb would ask on stdin, and rmtree the folder on 'y'
        raise FileNotFoundError(
            f"{release} not found: it marks the OGB release of the files in {folder}; copy "
            "the whole folder as ogb downloaded it, or delete the folder to download it again"
        )

    class NoPromptDataset(CheckedRecords, dataset_cls):
        """``ogb``'s dataset that never asks on stdin, writes its processed file atomically
        and checks PyG's pre-processing records before reading them."""

        _staged: Path | None = None  # where process() writes, while it runs

        @property
        def processed_paths(self) -> list[str]:
            return [str(self._staged)] if self._staged is not None else super().processed_paths

        def process(self):  # ogb's process() torch.saves to processed_paths[0] directly
            with atomic_path(self.processed_paths[0]) as tmp:
                self._staged = tmp
                try:
                    super().process()
                finally:
                    self._staged = None

        def download(self):  # PyG calls it when raw files are missing, even if processed
            if not all(Path(p).is_file() for p in self.processed_paths):
                raise FileNotFoundError(
                    f"{name}: neither OGB's raw files ({', '.join(self.raw_file_names)}) "
                    f"under {self.raw_dir} nor its processed files under "
                    f"{self.processed_dir}: the folder is incomplete; delete {folder} to "
                    "download it again"
                )

    with _read_by_ogb(folder):
        return NoPromptDataset(name, root=str(folder.parent))
