"""Loaders for PyG's ``Planetoid`` (Cora, CiteSeer, PubMed) and ``PPI``.

The helpers

1. resolve the data root: the ``root`` argument, else ``$HIERGRAPH_DATA``, else the
   user cache folder ``~/.cache/hiergraph`` (``$XDG_CACHE_HOME/hiergraph``; see
   :func:`~hiergraph.datasets.download.data_root`);
2. if raw files are missing there and a raw source is given (``raw_dir=`` or
   ``$HIERGRAPH_RAW``), link (or, where links fail, copy) the raw files into
   ``<root>/<Name>/raw``, so that read-only sources work: PyG writes
   ``processed/`` next to ``raw/``;
3. otherwise download the missing files from PyG's own sources
   (``Planetoid.url``, ``PPI.url``) into ``<root>/<Name>/raw``, each through a
   temporary file that is renamed into place once complete (and, for the
   Planetoid files, once its SHA-256 matches
   :data:`~hiergraph.datasets.download.PLANETOID_SHA256`);
4. raise :class:`FileNotFoundError` naming the expected files and how to get
   them if anything is still missing (offline, or ``$HIERGRAPH_OFFLINE=1``).

PyG then builds its processed cache while the loader holds a lock on
``<root>/<Name>/processed/.lock``, so concurrent first runs build it once. A raw
file that PyG cannot read raises
:class:`~hiergraph.datasets.download.CorruptFileError` naming it.

A raw source is a folder holding the raw files themselves (``.../Cora/raw``)
or a dataset collection holding ``<Name>/raw`` (``$HIERGRAPH_RAW``, e.g.
``HIERGRAPH_RAW=/data/collection`` with ``/data/collection/Cora/raw/ind.cora.x``).

:func:`write_synthetic_ppi` writes a tiny **synthetic** PPI (random graphs,
features and labels) in PyG's raw layout, for tests and smoke runs only. It
also writes a marker file, :data:`SYNTHETIC_MARKER`, that travels with the raw
files, so that :func:`is_synthetic` can label any result computed from them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import PPI, Planetoid
from torch_geometric.utils import remove_self_loops

from hiergraph.datasets.download import (
    DATA_ENV,
    PLANETOID_SHA256,
    RAW_ENV,
    CorruptFileError,
    RemoteFile,
    atomic_path,
    data_root,
    fetch,
    file_lock,
    locate_raw,
    regular_file,
)
from hiergraph.datasets.graph_checks import graph_problems
from hiergraph.datasets.processed import StrictLoad, damaged_cache

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

#: Marker file written next to synthetic raw files (never present in real data).
SYNTHETIC_MARKER = "SYNTHETIC.txt"

_PPI_SPLITS = ("train", "valid", "test")  # (the raw files' names)
_PPI_NAMES = ("train", "val", "test")  # (PyG's splits and processed files)
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


def ppi_raw_files() -> list[str]:
    """The twelve raw file names PyG's ``PPI`` reads, e.g. ``train_graph.json``."""
    files = ("feats.npy", "graph_id.npy", "graph.json", "labels.npy")
    return [f"{split}_{f}" for split in _PPI_SPLITS for f in files]


def _geom_gcn_files(name: str) -> list[str]:
    return [f"{name.lower()}_split_0.6_0.2_{i}.npz" for i in range(10)]


def prepare_raw(
    name: str,
    files: list[str],
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    how_to_get: str = "",
    download: Callable[[Path, list[str]], None] | None = None,
) -> Path:
    """Make sure ``<root>/<name>/raw`` holds ``files``; returns the data root.

    Missing files are linked (copied where symlinks fail) from ``raw_dir`` or
    ``$HIERGRAPH_RAW``; failing that, ``download(raw folder, missing files)``
    fetches them (unless ``$HIERGRAPH_OFFLINE`` is set). Raises
    :class:`FileNotFoundError` if any stays missing because the network is
    unreachable, :class:`~hiergraph.datasets.download.DownloadError` if a
    download fails on the way (see :func:`~hiergraph.datasets.download.locate_raw`).
    """
    root = data_root(root)
    target = root / name / "raw"

    def missing() -> list[str]:  # (a link into a folder since removed or emptied too)
        return [f for f in files if not (target / f).exists()]

    def take(place: Path) -> Path | None:
        """``root`` once ``target`` has every file, the missing ones linked from ``place``."""
        absent = missing()
        if absent and (place == target or not all((place / f).exists() for f in absent)):
            return None
        if absent:
            target.mkdir(parents=True, exist_ok=True)
            marker = [SYNTHETIC_MARKER] if (place / SYNTHETIC_MARKER).exists() else []
            for f in absent + marker:
                _link_or_copy(place / f, target / f)
        return root

    def fetch_missing() -> None:
        download(target, missing())

    return locate_raw(
        name,
        [target, *_raw_sources(name, raw_dir)],
        take,
        lambda: f"the raw files {', '.join(missing())} (all in one folder)",
        fetch_missing if download is not None else None,
        how_to_get=how_to_get,
        noun="the files",
        data_folder=f"{name}/raw",
    )


def _raw_sources(name: str, raw_dir: str | os.PathLike | None) -> list[Path]:
    sources = []
    for base in (raw_dir, os.environ.get(RAW_ENV) or None):
        if base is not None:
            base = Path(base).expanduser()  # (a literal "~" folder was searched)
            sources += [base, base / name / "raw"]
    return sources


def _link_or_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` a link to ``src`` (a copy where links are not allowed), replacing what
    ``dst`` held: never a write through an old link into the folder it points to."""
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        dst.symlink_to(src.resolve())
    except OSError:
        shutil.copyfile(src, dst)


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


def _ppi_download(target: Path, missing: list[str]) -> None:
    """Fetch PyG's ``PPI.url`` zip beside ``target`` and move the raw files out of it
    (each extracted to a temporary file first); the zip is removed afterwards."""
    target.mkdir(parents=True, exist_ok=True)
    archive = fetch(RemoteFile("ppi.zip", (PPI.url,), None), target.parent / "ppi.zip")
    try:
        with zipfile.ZipFile(archive) as z:
            members = {Path(i.filename).name: i for i in z.infolist() if not i.is_dir()}
            absent = [f for f in missing if f not in members]
            if absent:
                raise CorruptFileError(
                    archive, f"{archive} (from {PPI.url}) lacks the PPI raw files {absent}"
                )
            for f in missing:
                with (
                    atomic_path(target / f) as tmp,
                    open(tmp, "wb") as out,
                    z.open(members[f]) as src,
                ):
                    shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, EOFError, OSError, RuntimeError, NotImplementedError) as err:
        raise CorruptFileError(
            archive, f"{archive} (from {PPI.url}) is not a readable zip of the PPI raw files: {err}"
        ) from err
    finally:
        archive.unlink(missing_ok=True)


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


def _read_ppi_file(path: Path) -> None:
    if path.suffix == ".json":
        json.loads(path.read_text())
    else:
        np.load(path, allow_pickle=False)


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


def _diagnose(
    raw: Path, files: list[str], read: Callable[[Path], None], what, source: Path
) -> Exception | None:
    """A :class:`CorruptFileError` for the first raw file of ``raw`` that cannot be read
    (read from ``source``: the folder the dataset was built from), else ``None``."""
    for f in files:
        path = raw / f
        try:
            read(source / f)
        except FileNotFoundError:
            continue
        except Exception as err:  # noqa: BLE001 - any failure to parse means a damaged file
            error = CorruptFileError(
                path.resolve(),
                f"{path.resolve()}: cannot read this raw file ({type(err).__name__}: {err}); "
                f"expected {what(f)}. It is probably truncated or damaged: delete it (it is "
                "downloaded again on the next run) or put the official file in its place.",
            )
            error.__cause__ = err
            return error
    return None


@contextlib.contextmanager
def _explain_failures(
    name: str, root: Path, files: list[str], read, what, built: bool, source=None, processed=None
):
    """Turn a failure of PyG's dataset class into a :class:`CorruptFileError` naming the
    damaged raw or processed file, when one is found: the raw files (read again from
    ``source``, the folder PyG builds from, if not the raw folder) when the dataset is
    ``built`` from them, else the cache (in ``processed``, if not the default folder)."""
    processed = root / name / "processed" if processed is None else processed
    raw = root / name / "raw"
    try:
        yield
    except (CorruptFileError, FileNotFoundError):  # they name what is wrong already
        raise
    except Exception as err:
        if isinstance(err, OSError) and err.filename is not None:
            place = Path(os.path.abspath(err.filename))
            if not place.is_relative_to(os.path.abspath(raw)):  # no raw file's fault: as is
                raise  # (no permission to write the processed folder, a full disk)
        bad = _diagnose(raw, files, read, what, source or raw) if built else None
        if bad is None and not built:
            bad = CorruptFileError(
                processed,
                f"{processed}: cannot load this processed {name} cache "
                f"({type(err).__name__}: {err}); it is probably damaged. Delete the folder "
                "to rebuild it.",
            )
        if bad is None and not isinstance(err, MemoryError):  # built from the raw files
            bad = CorruptFileError(
                raw,
                f"{raw}: PyG could not build {name} from these raw files "
                f"({type(err).__name__}: {err}). Each of them reads, so they may not fit "
                "together (an index past the feature rows, files of different sizes, an "
                "empty graph): put the official files in their place.",
            )
        if bad is None:
            raise
        raise bad from err


def is_synthetic(dataset) -> bool:
    """Whether a loaded dataset was built from :func:`write_synthetic_ppi`'s files."""
    return (Path(dataset.raw_dir) / SYNTHETIC_MARKER).exists()


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
    if not isinstance(name, str) or name.lower() not in ("cora", "citeseer", "pubmed"):
        raise ValueError(f"name must be Cora, CiteSeer or PubMed, got {name!r}")
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
        base = prepare_raw(name, files, base, raw_dir, how, _planetoid_download)

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
            _explain_failures(
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


def load_ppi(
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    transform: Callable | None = None,
    force_reload: bool = False,
) -> tuple[PPI, PPI, PPI]:
    """PyG's ``PPI`` train/val/test splits (20/2/2 graphs), from pre-placed or downloaded
    raw files.

    Arguments as in :func:`load_planetoid`; the raw folder is ``<root>/PPI/raw``.
    """
    how = f"The official archive is {PPI.url} (unzip it into the raw folder)."
    base = data_root(root)
    with file_lock(base / "PPI" / "processed"):
        base = prepare_raw("PPI", ppi_raw_files(), base, raw_dir, how, _ppi_download)

        def what(f: str) -> str:
            if f.endswith(".json"):
                return "a networkx node-link graph in JSON"
            return "a numpy .npy array"

        processed = base / "PPI" / "processed"  # (PyG's file names)
        built = force_reload or not all((processed / f"{s}.pt").exists() for s in _PPI_NAMES)
        with _explain_failures("PPI", base, ppi_raw_files(), _read_ppi_file, what, built):
            reload = (force_reload, False, False)  # (the first builds all three caches)
            splits = tuple(
                _PPI(str(base / "PPI"), split=s, transform=transform, force_reload=again)
                for s, again in zip(_PPI_NAMES, reload, strict=True)
            )
        for split, split_name in zip(splits, _PPI_NAMES, strict=True):
            for i in range(len(split)):
                problems = graph_problems(split.get(i), multi_label=True)  # (no transform)
                if problems:
                    cache = processed / f"{split_name}.pt"
                    raise CorruptFileError(
                        cache,
                        f"{cache}: graph {i} is no PPI graph: {'; '.join(problems)}. It or "
                        "the raw files it was built from are damaged: with the official raw "
                        "files in place, delete it (or pass force_reload=True) to rebuild it.",
                    )
        return splits


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


class _PPI(StrictLoad, PPI):
    """PyG's ``PPI`` whose processed caches are read with ``weights_only=True`` only, and
    whose graphs number their nodes from their own first node."""

    cache_keys = ("x", "edge_index", "y")

    def process(self) -> None:
        """PyG's ``PPI.process``, but a graph's edges are renumbered from the graph's first
        node (its smallest id in ``graph_id.npy``), not from the smallest id that has an
        edge: a graph whose first node has none had every edge moved onto other nodes."""
        import networkx as nx
        from networkx.readwrite import json_graph

        raw = Path(self.raw_dir)
        for split, path in zip(_PPI_SPLITS, self.processed_paths, strict=True):
            links = json.loads((raw / f"{split}_graph.json").read_text())
            graph = nx.DiGraph(json_graph.node_link_graph(links, edges="links"))
            x = torch.from_numpy(np.load(raw / f"{split}_feats.npy")).float()
            y = torch.from_numpy(np.load(raw / f"{split}_labels.npy")).float()
            graph_id = torch.from_numpy(np.load(raw / f"{split}_graph_id.npy")).long()
            graph_id = graph_id - graph_id.min()
            data_list = []
            for i in range(int(graph_id.max()) + 1):
                nodes = (graph_id == i).nonzero().view(-1)
                edges = list(graph.subgraph(nodes.tolist()).edges)
                edge_index = torch.tensor(edges, dtype=torch.long).view(-1, 2).t()
                edge_index, _ = remove_self_loops(edge_index - nodes.min())
                data = Data(edge_index=edge_index, x=x[nodes], y=y[nodes])
                if self.pre_filter is not None and not self.pre_filter(data):
                    continue
                data_list.append(data if self.pre_transform is None else self.pre_transform(data))
            self.save(data_list, path)


def write_synthetic_ppi(
    raw_dir: str | os.PathLike,
    graphs: tuple[int, int, int] = (20, 2, 2),
    nodes_per_graph: int = 30,
    num_features: int = 50,
    num_labels: int = 121,
    avg_degree: float = 4.0,
    seed: int = 0,
) -> Path:
    """Write a tiny **synthetic** PPI in PyG's raw layout; for tests only.

    NOT the real PPI: random undirected graphs whose labels are a noisy linear
    function of the node features and of their neighbours' mean, so that a
    graph model can learn something. Writes, per split in ``train``,
    ``valid``, ``test``: ``{split}_graph.json`` (networkx node-link data,
    nodes numbered from 0 within the split), ``{split}_feats.npy`` ``[n, F]``
    float32, ``{split}_labels.npy`` ``[n, L]`` 0/1, ``{split}_graph_id.npy``
    ``[n]`` graph ids.

    Returns:
        ``raw_dir``.
    """
    rng = np.random.default_rng(seed)
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / SYNTHETIC_MARKER).write_text(
        "SYNTHETIC stand-in for PPI written by hiergraph.datasets.planetoid."
        "write_synthetic_ppi: random graphs, features and labels. NOT the real PPI dataset.\n"
    )
    proj = rng.normal(size=(2 * num_features, num_labels))
    first_id = 1
    for split, count in zip(_PPI_SPLITS, graphs, strict=True):
        n = count * nodes_per_graph
        graph_id = np.repeat(np.arange(first_id, first_id + count), nodes_per_graph)
        first_id += count
        links = []
        for g in range(count):
            offset = g * nodes_per_graph
            # a path keeps every graph connected (PyG re-bases ids on the smallest edge end)
            links += [(offset + i, offset + i + 1) for i in range(nodes_per_graph - 1)]
            num_edges = int(avg_degree * nodes_per_graph / 2) - (nodes_per_graph - 1)
            ends = rng.integers(0, nodes_per_graph, size=(max(num_edges, 0), 2))
            links += [(offset + a, offset + b) for a, b in ends if a != b]
        feats = rng.normal(size=(n, num_features)).astype(np.float32)
        neigh = np.zeros_like(feats)
        deg = np.ones(n)
        for a, b in links:
            neigh[a] += feats[b]
            neigh[b] += feats[a]
            deg[a] += 1
            deg[b] += 1
        logits = np.concatenate([feats, neigh / deg[:, None]], axis=1) @ proj
        labels = (logits + rng.normal(scale=0.5, size=logits.shape) > 0).astype(np.float32)
        node_link = {
            "directed": False,
            "multigraph": False,
            "graph": {},
            "nodes": [{"id": i} for i in range(n)],
            "links": [{"source": int(a), "target": int(b)} for a, b in links],
        }
        (raw_dir / f"{split}_graph.json").write_text(json.dumps(node_link))
        np.save(raw_dir / f"{split}_feats.npy", feats)
        np.save(raw_dir / f"{split}_labels.npy", labels)
        np.save(raw_dir / f"{split}_graph_id.npy", graph_id)
    return raw_dir
