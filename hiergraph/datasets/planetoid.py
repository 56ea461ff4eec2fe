"""Offline-friendly loaders for PyG's ``Planetoid`` (Cora, CiteSeer, PubMed) and ``PPI``.

PyG's dataset classes download their raw files when ``<root>/<Name>/raw`` is
incomplete. These helpers never download: they

1. resolve the data root: the ``root`` argument, else ``$HIERGRAPH_DATA``, else
   the repository's top-level ``datasets/`` folder (git-ignored);
2. if raw files are missing there and a raw source is given (``raw_dir=`` or
   ``$HIERGRAPH_RAW``), link (or, where links fail, copy) the raw files into
   ``<root>/<Name>/raw``, so that read-only sources work: PyG writes
   ``processed/`` next to ``raw/``;
3. raise :class:`FileNotFoundError` naming the expected files and how to get
   them if anything is still missing, before PyG could try the network.

A raw source is a folder holding the raw files themselves (``.../Cora/raw``)
or a dataset collection holding ``<Name>/raw`` (``$HIERGRAPH_RAW``, e.g.
``HIERGRAPH_RAW=/path/to/shared/datasets``).

:func:`write_synthetic_ppi` writes a tiny **synthetic** PPI (random graphs,
features and labels) in PyG's raw layout, for tests and smoke runs only. It
also writes a marker file, :data:`SYNTHETIC_MARKER`, that travels with the raw
files, so that :func:`is_synthetic` can label any result computed from them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch_geometric.datasets import PPI, Planetoid

#: Environment variable for the data root (where ``<Name>/raw`` and ``processed`` live).
DATA_ENV = "HIERGRAPH_DATA"
#: Environment variable for a read-only source of raw files to link from.
RAW_ENV = "HIERGRAPH_RAW"

#: Marker file written next to synthetic raw files (never present in real data).
SYNTHETIC_MARKER = "SYNTHETIC.txt"

_PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
_PPI_URL = PPI.url
_PPI_SPLITS = ("train", "valid", "test")


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data root: ``root``, else ``$HIERGRAPH_DATA``, else ``<repo>/datasets``."""
    if root is not None:
        return Path(root)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return Path(__file__).resolve().parents[2] / "datasets"


def planetoid_raw_files(name: str) -> list[str]:
    """The eight raw file names PyG's ``Planetoid`` reads, e.g. ``ind.cora.x``."""
    suffixes = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return [f"ind.{name.lower()}.{s}" for s in suffixes]


def ppi_raw_files() -> list[str]:
    """The twelve raw file names PyG's ``PPI`` reads, e.g. ``train_graph.json``."""
    files = ("feats.npy", "graph_id.npy", "graph.json", "labels.npy")
    return [f"{split}_{f}" for split in _PPI_SPLITS for f in files]


def prepare_raw(
    name: str,
    files: list[str],
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    how_to_get: str = "",
) -> Path:
    """Make sure ``<root>/<name>/raw`` holds ``files``; returns the data root.

    Missing files are linked (copied where symlinks fail) from ``raw_dir`` or
    ``$HIERGRAPH_RAW``. Raises :class:`FileNotFoundError` if any stays missing.
    """
    root = data_root(root)
    target = root / name / "raw"
    missing = [f for f in files if not (target / f).exists()]
    sources = _raw_sources(name, raw_dir)
    for source in sources:
        if not missing:
            break
        if all((source / f).exists() for f in missing):
            target.mkdir(parents=True, exist_ok=True)
            marker = [SYNTHETIC_MARKER] if (source / SYNTHETIC_MARKER).exists() else []
            for f in missing + marker:
                _link_or_copy(source / f, target / f)
            missing = []
    if missing:
        searched = "".join(f"\n  - {s}" for s in sources) or " (none given)"
        raise FileNotFoundError(
            f"{name} raw files are missing from {target}: {', '.join(missing)}.\n"
            f"Raw sources searched (raw_dir= argument, ${RAW_ENV}):{searched}\n"
            f"Fix: put the files into {target}, or pass raw_dir=<folder with the files>, "
            f"or set {RAW_ENV}=<folder containing {name}/raw>, or set {DATA_ENV}/root= to "
            f"a data root that has {name}/raw. {how_to_get}"
        )
    return root


def _raw_sources(name: str, raw_dir: str | os.PathLike | None) -> list[Path]:
    sources = []
    for base in (raw_dir, os.environ.get(RAW_ENV) or None):
        if base is not None:
            base = Path(base)
            sources += [base, base / name / "raw"]
    return sources


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        dst.symlink_to(src.resolve())
    except OSError:
        shutil.copyfile(src, dst)


def is_synthetic(dataset) -> bool:
    """Whether a loaded dataset was built from :func:`write_synthetic_ppi`'s files."""
    return (Path(dataset.raw_dir) / SYNTHETIC_MARKER).exists()


def load_planetoid(
    name: str,
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    split: str = "public",
    transform: Callable | None = None,
) -> Planetoid:
    """PyG's ``Planetoid(root, name, split)`` without any download.

    Args:
        name: ``"Cora"``, ``"CiteSeer"`` or ``"PubMed"``.
        root: data root (default ``$HIERGRAPH_DATA`` or ``<repo>/datasets``).
        raw_dir: optional source of the raw ``ind.<name>.*`` files to link from.
        split: Planetoid split (``"public"`` is the Kipf & Welling split).
        transform: e.g. ``torch_geometric.transforms.NormalizeFeatures()``.
    """
    if name.lower() not in ("cora", "citeseer", "pubmed"):
        raise ValueError(f"name must be Cora, CiteSeer or PubMed, got {name!r}")
    how = (
        f"The official files are ind.{name.lower()}.* under {_PLANETOID_URL} "
        f"(Planetoid(root, {name!r}) fetches them on a machine with internet)."
    )
    root = prepare_raw(name, planetoid_raw_files(name), root, raw_dir, how)
    return Planetoid(str(root), name, split=split, transform=transform)


def load_ppi(
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    transform: Callable | None = None,
) -> tuple[PPI, PPI, PPI]:
    """PyG's ``PPI`` train/val/test splits (20/2/2 graphs) without any download.

    Arguments as in :func:`load_planetoid`; the raw folder is ``<root>/PPI/raw``.
    """
    how = f"The official archive is {_PPI_URL} (unzip it into the raw folder)."
    root = str(prepare_raw("PPI", ppi_raw_files(), root, raw_dir, how) / "PPI")
    return tuple(PPI(root, split=s, transform=transform) for s in ("train", "val", "test"))


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
