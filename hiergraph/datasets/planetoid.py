"""Loader for PyG's ``Planetoid`` (Cora, CiteSeer, PubMed).

:func:`load_planetoid` takes the raw files from ``raw_dir=`` or ``$HIERGRAPH_RAW``, else
downloads the missing ones from PyG's own sources (``Planetoid.url``, and
``Planetoid.geom_gcn_url`` for the geom-gcn split files) into ``<root>/<Name>/raw``
(:func:`~hiergraph.datasets.pyg_raw.prepare_raw`), each through a temporary file that is
renamed into place once complete and once its SHA-256 matches
:data:`~hiergraph.datasets.download.PLANETOID_SHA256`. The raw files are pickles, which
can run code when read: only files with the official SHA-256 are read (unless
``trust_raw_files=True``), from private copies of the checked bytes.

PyG then builds its processed cache while the loader holds a lock on
``<root>/<Name>/processed/.lock``, so concurrent first runs build it once. A raw
file that PyG cannot read raises
:class:`~hiergraph.datasets.errors.CorruptFileError` naming it.

The PPI loader and the synthetic PPI (:mod:`hiergraph.datasets.ppi`), the data root and
:func:`~hiergraph.datasets.pyg_raw.prepare_raw` are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from torch_geometric.datasets import Planetoid

from hiergraph.datasets.download import PLANETOID_SHA256, RemoteFile, fetch
from hiergraph.datasets.errors import CorruptFileError, regular_file
from hiergraph.datasets.graph_checks import graph_problems
from hiergraph.datasets.locate import DATA_ENV, RAW_ENV, data_root
from hiergraph.datasets.locks import file_lock
from hiergraph.datasets.ppi import (
    SYNTHETIC_MARKER,
    is_synthetic,
    load_ppi,
    ppi_raw_files,
    write_synthetic_ppi,
)
from hiergraph.datasets.processed import StrictLoad, damaged_cache
from hiergraph.datasets.pyg_raw import explain_failures, prepare_raw

__all__ = [
    "DATA_ENV",
    "RAW_ENV",
    "SYNTHETIC_MARKER",
    "data_root",
    "is_synthetic",
    "load_planetoid",
    "load_ppi",
    "planetoid_raw_files",
    "ppi_raw_files",
    "prepare_raw",
    "write_synthetic_ppi",
]

_PLANETOID_KINDS = {
    "x": "a pickled scipy sparse matrix of training features",
    "tx": "a pickled scipy sparse matrix of test features",
    "allx": "a pickled scipy sparse matrix of features",
    "y": "a pickled numpy array of one-hot training labels",
    "ty": "a pickled numpy array of one-hot test labels",
    "ally": "a pickled numpy array of one-hot labels",
    "graph": "a pickled dict of adjacency lists",
    "test.index": "a text file with one test node index per line",
}


def planetoid_raw_files(name: str) -> list[str]:
    """The eight raw file names PyG's ``Planetoid`` reads, e.g. ``ind.cora.x``."""
    suffixes = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return [f"ind.{name.lower()}.{s}" for s in suffixes]


def _geom_gcn_files(name: str) -> list[str]:
    return [f"{name.lower()}_split_0.6_0.2_{i}.npz" for i in range(10)]


def _planetoid_download(target: Path, missing: list[str]) -> None:
    """Fetch missing raw files from PyG's sources (``Planetoid.url``, and
    ``Planetoid.geom_gcn_url`` for the geom-gcn split files), checked against
    :data:`~hiergraph.datasets.download.PLANETOID_SHA256` where known."""
    for f in missing:
        if f.endswith(".npz"):
            url = f"{Planetoid.geom_gcn_url}/splits/{f}"
        else:
            url = f"{Planetoid.url}/{f}"
        fetch(RemoteFile(f, (url,), PLANETOID_SHA256.get(f)), target / f)


def _read_planetoid_file(path: Path) -> None:
    """Read ``path`` the way PyG does (raises on a damaged file)."""
    if path.name.endswith(".test.index"):
        [int(line) for line in path.read_text().split()]
    elif path.suffix == ".npz":
        with np.load(path) as arrays:
            list(arrays.values())
    else:
        with open(path, "rb") as f:
            pickle.load(f, encoding="latin1")


@contextlib.contextmanager
def _verified(raw: Path, files: list[str], pinned: dict[str, str]) -> Iterator[Path]:
    """A private folder holding copies of ``files`` of ``raw``, each written from the bytes
    whose SHA-256 was checked against ``pinned``
    (:data:`~hiergraph.datasets.download.PLANETOID_SHA256`, or nothing for files the caller
    trusts), removed afterwards. The Planetoid raw files are pickles, which run code of
    their choosing when read: only the official files are read, and a file replaced after
    its check is never read.

    Raises:
        CorruptFileError: naming the first file whose SHA-256 differs.
    """
    for stale in raw.parent.glob(".verified-*"):  # (left by a killed run: the caller holds
        shutil.rmtree(stale, ignore_errors=True)  # the dataset's lock, so no run uses them)
    staged = Path(tempfile.mkdtemp(prefix=".verified-", dir=raw.parent))  # (mode 0700)
    try:
        for f in files:
            data, known = regular_file(raw / f, "a raw file").read_bytes(), pinned.get(f)
            if known is not None and hashlib.sha256(data).hexdigest() != known:
                path = (raw / f).resolve()  # (the source a link in the raw folder points to)
                raise CorruptFileError(
                    path,
                    f"{path}: its SHA-256 differs from the official file's, so it is not read "
                    "(the Planetoid raw files are pickles, which can run code when read). It "
                    "is truncated, damaged or another file: put the official file in its "
                    "place, or delete it (it is downloaded again on the next run); for files "
                    "of your own that you trust, pass trust_raw_files=True.",
                )
            (staged / f).write_bytes(data)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


#: The splits of PyG's ``Planetoid``.
PLANETOID_SPLITS = ("public", "full", "geom-gcn", "random")


def load_planetoid(
    name: str,
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    split: str = "public",
    transform: Callable | None = None,
    force_reload: bool = False,
    trust_raw_files: bool = False,
) -> Planetoid:
    """PyG's ``Planetoid(root, name, split)``, from pre-placed or downloaded raw files.

    Args:
        name: ``"Cora"``, ``"CiteSeer"`` or ``"PubMed"``.
        root: data root (default ``$HIERGRAPH_DATA``, else ``~/.cache/hiergraph``).
        raw_dir: optional folder of pre-placed raw ``ind.<name>.*`` files to link from.
        split: Planetoid split, one of :data:`PLANETOID_SPLITS` (``"public"`` is the
            Kipf & Welling split).
        transform: e.g. ``torch_geometric.transforms.NormalizeFeatures()``.
        force_reload: rebuild the processed cache from the raw files.
        trust_raw_files: read raw files whose SHA-256 is not the official one's (your own
            data in the Planetoid format). They are pickles, which can run code when
            read: only for files you trust. By default only the official files are read
            (:data:`~hiergraph.datasets.download.PLANETOID_SHA256`).
    """
    names = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
    if not isinstance(name, str) or name.lower() not in names:
        raise ValueError(f"name must be Cora, CiteSeer or PubMed, got {name!r}")
    name = names[name.lower()]  # (the folder <Name>/raw is spelled so, in any case given)
    if not isinstance(split, str) or split.lower() not in PLANETOID_SPLITS:
        raise ValueError(f"split must be one of {', '.join(PLANETOID_SPLITS)}, got {split!r}")
    split = split.lower()
    how = (
        f"The official files are ind.{name.lower()}.* under {Planetoid.url} "
        f"(downloaded automatically when the network is reachable)."
    )
    files = planetoid_raw_files(name) + (_geom_gcn_files(name) if split == "geom-gcn" else [])
    base = data_root(root)
    with file_lock(base / name / "processed"):
        base = prepare_raw(
            name, files, base, raw_dir, how, _planetoid_download, refresh=force_reload
        )

        def what(f: str) -> str:
            if f.endswith(".npz"):
                return "a numpy .npz archive of split masks"
            return _PLANETOID_KINDS[f.removeprefix(f"ind.{name.lower()}.")]

        pinned = {} if trust_raw_files else PLANETOID_SHA256
        processed = base / name / ("geom-gcn" if split == "geom-gcn" else "") / "processed"
        cache = None if force_reload or not (processed / "data.pt").exists() else processed
        options = dict(split=split, transform=transform, force_reload=force_reload)
        raw = base / name / "raw"
        # PyG builds from verified copies of the raw files (with a cache, it reads none)
        verified = contextlib.nullcontext() if cache else _verified(raw, files, pinned)
        with (
            verified as source,
            explain_failures(
                name, base, files, _read_planetoid_file, what, cache is None, source, processed
            ),
        ):
            dataset = _Planetoid(str(base), name, raw_folder=source, **options)
        _check_fits(dataset, name, base, processed, cache is not None)
        for key in ("train_mask", "val_mask", "test_mask"):  # (geom-gcn's files: 0/1 integers)
            dataset._data[key] = dataset._data[key].bool()
        return dataset


def _check_fits(
    dataset: Planetoid, name: str, root: Path, processed: Path, from_cache: bool
) -> None:
    """Raise a :class:`CorruptFileError` where data that read and build make no graph
    (:func:`~hiergraph.datasets.graph_checks.graph_problems`: e.g. edge ids past the nodes,
    a test mask that shares nodes with the training mask), or the raw test index is empty
    or negative (PyG wraps a negative id to the last nodes); ``processed``: the cache's
    folder, which the dataset was read from (``from_cache``) or built into."""
    cache = processed / "data.pt" if from_cache else None
    raw, problems = root / name / "raw", graph_problems(dataset._data)
    index = raw / f"ind.{name.lower()}.test.index"
    if cache is None and index.exists():
        ids = [int(token) for token in index.read_text().split()]
        if not ids:
            problems.append(f"{index.name} lists no test node")
        elif min(ids) < 0:
            problems.append(f"{index.name} holds a negative node id ({min(ids)})")
    if problems and cache is not None:
        what = f"this processed {name} cache holds no {name} graph: "
        raise damaged_cache(cache, what + "; ".join(problems))
    if problems:
        raise CorruptFileError(
            raw,
            f"{raw}: the {name} raw files read but do not fit together: {'; '.join(problems)}. "
            f"Put the official files in their place and delete {processed} "
            "(built from these).",
        )


class _Planetoid(StrictLoad, Planetoid):
    """PyG's ``Planetoid`` whose processed cache is read with ``weights_only=True`` only,
    which reads the raw files of every split from ``<root>/<Name>/raw`` (those the loader
    checked: PyG reads geom-gcn's from a folder of their own) and never downloads (the
    loader does, with checksums)."""

    cache_keys = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")

    def __init__(self, root: str, name: str, raw_folder: Path | None = None, **options):
        self._raw_folder = raw_folder  # where it builds from (the raw folder by default)
        super().__init__(root, name, **options)
        self._raw_folder = None  # (a built dataset names the raw folder)

    @property
    def raw_dir(self) -> str:
        if self._raw_folder is not None:
            return str(self._raw_folder)
        return os.path.join(self.root, self.name, "raw")

    def download(self) -> None:
        raise FileNotFoundError(f"{self.raw_dir} lacks raw files of {self.name}")

    def process(self) -> None:
        if self._raw_folder is None:  # (a cache there when the loader looked, gone since)
            raise FileNotFoundError(
                f"{self.processed_dir}: the processed cache vanished while it was loaded "
                "(deleted meanwhile?); load the dataset again"
            )
        super().process()
