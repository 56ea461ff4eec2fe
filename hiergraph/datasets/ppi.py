"""Loader for PyG's ``PPI`` (protein-protein interaction graphs), and a labelled synthetic
PPI for tests.

:func:`load_ppi` takes the raw files from ``raw_dir=`` or ``$HIERGRAPH_RAW``, else
downloads PyG's ``PPI.url`` zip and moves the raw files out of it (each through a
temporary file that is renamed into place once complete), into ``<root>/PPI/raw``
(:func:`~hiergraph.datasets.pyg_raw.prepare_raw`). PyG then builds its processed caches
while the loader holds a lock on ``<root>/PPI/processed/.lock``, so concurrent first runs
build them once. A raw file that PyG cannot read raises
:class:`~hiergraph.datasets.errors.CorruptFileError` naming it.

:func:`write_synthetic_ppi` writes a tiny **synthetic** PPI (random graphs,
features and labels) in PyG's raw layout, for tests and smoke runs only. It
also writes a marker file, :data:`SYNTHETIC_MARKER`, that travels with the raw
files, so that :func:`is_synthetic` can label any result computed from them.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import PPI
from torch_geometric.utils import remove_self_loops

from hiergraph.datasets.download import RemoteFile, fetch
from hiergraph.datasets.errors import CorruptFileError
from hiergraph.datasets.graph_checks import graph_problems
from hiergraph.datasets.locate import data_root
from hiergraph.datasets.locks import atomic_path, file_lock
from hiergraph.datasets.processed import StrictLoad
from hiergraph.datasets.pyg_raw import SYNTHETIC_MARKER, explain_failures, prepare_raw

__all__ = [
    "SYNTHETIC_MARKER",
    "is_synthetic",
    "load_ppi",
    "ppi_raw_files",
    "write_synthetic_ppi",
]

_PPI_SPLITS = ("train", "valid", "test")  # (the raw files' names)
_PPI_NAMES = ("train", "val", "test")  # (PyG's splits and processed files)


def ppi_raw_files() -> list[str]:
    """The twelve raw file names PyG's ``PPI`` reads, e.g. ``train_graph.json``."""
    files = ("feats.npy", "graph_id.npy", "graph.json", "labels.npy")
    return [f"{split}_{f}" for split in _PPI_SPLITS for f in files]


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


def _read_ppi_file(path: Path) -> None:
    if path.suffix == ".json":
        json.loads(path.read_text())
    else:
        np.load(path, allow_pickle=False)


def is_synthetic(dataset) -> bool:
    """Whether a loaded dataset was built from :func:`write_synthetic_ppi`'s files.

    Args:
        dataset: a loaded PyG dataset (anything with a ``raw_dir``), such as a split of
            :func:`load_ppi`; its raw folder holds :data:`SYNTHETIC_MARKER` if synthetic.
    """
    return (Path(dataset.raw_dir) / SYNTHETIC_MARKER).exists()


def load_ppi(
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    transform: Callable | None = None,
    force_reload: bool = False,
) -> tuple[PPI, PPI, PPI]:
    """PyG's ``PPI`` train/val/test splits (20/2/2 graphs), from pre-placed or downloaded
    raw files.

    Args:
        root: data root (default ``$HIERGRAPH_DATA``, else the user cache folder: see
            :func:`~hiergraph.datasets.data_root`); the raw folder is ``<root>/PPI/raw``.
        raw_dir: optional folder of pre-placed raw files (:func:`ppi_raw_files`), or of a
            ``PPI/raw`` folder holding them, to link them from.
        transform: as in PyG, applied to every graph on access.
        force_reload: link the raw files again from ``raw_dir`` / ``$HIERGRAPH_RAW``
            (where one holds them all) and rebuild the processed caches.
    """
    how = f"The official archive is {PPI.url} (unzip it into the raw folder)."
    base = data_root(root)
    with file_lock(base / "PPI" / "processed"):
        base = prepare_raw(
            "PPI", ppi_raw_files(), base, raw_dir, how, _ppi_download, refresh=force_reload
        )

        def what(f: str) -> str:
            if f.endswith(".json"):
                return "a networkx node-link graph in JSON"
            return "a numpy .npy array"

        processed = base / "PPI" / "processed"  # (PyG's file names)
        built = force_reload or not all((processed / f"{s}.pt").exists() for s in _PPI_NAMES)
        with explain_failures("PPI", base, ppi_raw_files(), _read_ppi_file, what, built):
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
    ``[n]`` graph ids; and the marker file :data:`SYNTHETIC_MARKER`.

    Args:
        raw_dir: the folder to write into (created if missing).
        graphs: the number of graphs of ``train``, ``valid`` and ``test`` (default
            PPI's ``(20, 2, 2)``).
        nodes_per_graph: nodes of every graph.
        num_features: ``F``, features per node (standard normal).
        num_labels: ``L``, binary labels per node (default PPI's 121).
        avg_degree: the mean node degree aimed at: every graph is a path through its
            nodes plus random edges, ``int(avg_degree * nodes_per_graph / 2)`` edges in
            all before self-loops are dropped (the path alone where that is fewer).
        seed: seed of the NumPy generator that draws the graphs, features and labels.

    Returns:
        ``raw_dir``.
    """
    rng = np.random.default_rng(seed)
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / SYNTHETIC_MARKER).write_text(
        "SYNTHETIC stand-in for PPI written by hiergraph.datasets."
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
