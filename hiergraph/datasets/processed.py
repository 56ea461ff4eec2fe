"""Processed dataset caches read without running code from the file.

PyG's ``InMemoryDataset.load`` reads a cache with ``torch.load(weights_only=True)`` but,
when the file names a global that is not allow-listed, warns and reads it again with
``weights_only=False``: a cache file that someone replaced (they live in a user folder,
``~/.cache/hiergraph`` by default) would then run whatever its pickle asks for.
:class:`StrictLoad` reads caches with ``weights_only=True`` only, allow-listing the PyG data
classes a cache holds, and turns any failure into a
:class:`~hiergraph.datasets.errors.CorruptFileError` naming the file. Its :meth:`save`
writes a cache through :func:`~hiergraph.datasets.locks.atomic_path`, so an
interrupted build never leaves a partial cache file behind.

PyG also keeps, beside each cache, a record of the ``pre_transform`` and ``pre_filter`` it
was built with (``pre_transform.pt``, ``pre_filter.pt``: a string each), and its
``Dataset._process`` reads them with ``torch.load(weights_only=False)`` before anything
else. :func:`check_records` reads them first with ``weights_only=True`` and refuses a file
that names any class not allow-listed, so a replaced record cannot run code either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.data.data import BaseData, DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import BaseStorage, EdgeStorage, GlobalStorage, NodeStorage

from hiergraph.data import SignalHierarchy
from hiergraph.datasets.errors import CorruptFileError, regular_file
from hiergraph.datasets.graph_checks import label_problems
from hiergraph.datasets.locks import atomic_path

#: The classes a processed cache may name: PyG's data containers and their storages.
SAFE_CLASSES = [
    Data,
    HeteroData,
    SignalHierarchy,
    DataEdgeAttr,
    DataTensorAttr,
    BaseStorage,
    GlobalStorage,
    NodeStorage,
    EdgeStorage,
]


#: PyG's records of the pre-processing a cache was built with.
RECORDS = ("pre_transform.pt", "pre_filter.pt")


def check_records(processed_dir: str | os.PathLike) -> None:
    """Read PyG's pre-processing records in ``processed_dir`` with ``weights_only=True``.

    Call it before PyG's ``Dataset._process``, which reads them with
    ``weights_only=False``: a record that loads here holds only plain data and classes
    allow-listed for ``weights_only`` reads (PyG's and hiergraph's data classes), so that
    read runs no code.

    Raises:
        CorruptFileError: a record is damaged or holds other objects (e.g. code).
    """
    for name in RECORDS:
        path = os.path.join(processed_dir, name)
        if os.path.exists(path):
            what = "PyG's record of a pre-processing step (a string"
            load_weights_only(path, what, "the processed files", allow=())


@contextmanager
def allowing(classes: Sequence[type]) -> Iterator[None]:
    """``torch.load(weights_only=True)`` takes ``classes`` inside the block.

    PyTorch's ``torch.serialization.safe_globals`` removes every class it was given when it
    exits, also those allow-listed before it (PyG's ``Data``, hiergraph's
    ``SignalHierarchy``, registered on import): after it, the user's own PyG datasets
    would no longer read weights-only. This adds, and then removes, only the classes that
    were not allow-listed already."""
    allowed = torch.serialization.get_safe_globals()
    missing = [cls for cls in classes if cls not in allowed]
    with torch.serialization.safe_globals(missing) if missing else nullcontext():
        yield


def load_weights_only(
    path: str | os.PathLike, what: str, rebuilds: str, allow: Sequence[type] = SAFE_CLASSES
):
    """``torch.load(path, weights_only=True)`` with the classes ``allow`` allow-listed (by
    default PyG's data classes; :func:`allowing`).

    Raises:
        CorruptFileError: naming the file, ``what`` it should be and what deleting it
            ``rebuilds``, when it is truncated, damaged, holds other objects (e.g. code) or
            is no regular file (a FIFO there would block the read, holding the dataset's
            lock, without end).
    """
    try:
        regular_file(Path(path), "the file")  # (a FIFO: a read without end)
        with allowing(allow):
            return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a damaged file makes the reader raise
        raise CorruptFileError(
            path,
            f"{path} is not {what}; {type(err).__name__}: {err}); delete it (or pass "
            f"force_reload=True) to rebuild {rebuilds}",
        ) from err


#: PyTorch's switches that force ``torch.load`` to read with, or without, ``weights_only``.
_FORCE, _FORCE_NOT = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextmanager
def weights_only_loads(allow: Sequence[type] = SAFE_CLASSES) -> Iterator[None]:
    """Every ``torch.load`` inside reads with ``weights_only=True`` (the classes ``allow``
    allow-listed), whatever its caller passes and whatever the PyTorch version's default
    (``weights_only=False`` before 2.6): for third-party code that reads files of a user
    folder (``ogb``'s datasets). Sets PyTorch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` (and
    clears ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``) while it runs: not for threads that load
    other files meanwhile."""
    saved = {key: os.environ.get(key) for key in (_FORCE, _FORCE_NOT)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NOT, None)
    try:
        with allowing(allow):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def damaged_cache(path: str | os.PathLike, problem: str) -> CorruptFileError:
    """The error for a processed cache at ``path`` that reads but holds ``problem``."""
    return CorruptFileError(
        path,
        f"{path}: {problem}; the cache is damaged or from another version: delete it (or "
        "pass force_reload=True) to rebuild it from the raw files",
    )


class CheckedRecords:
    """Mixin for a PyG ``Dataset``: :func:`check_records` before PyG's processing step
    (its private ``_process``, which reads the records unsafely first thing), and that step
    under :func:`weights_only_loads` (a record swapped between the check and PyG's read
    would otherwise run its code)."""

    def _process(self) -> None:
        check_records(self.processed_dir)
        with weights_only_loads(allow=()):
            super()._process()


def _is_data_class(value) -> bool:
    """Whether ``value`` is a PyG data class, which a cache may name as its examples' class."""
    return isinstance(value, type) and issubclass(value, BaseData)


class StrictLoad(CheckedRecords):
    """Mixin for an ``InMemoryDataset``: :meth:`load` never falls back to unpickling code,
    the pre-processing records are checked before PyG reads them (:func:`check_records`),
    and :meth:`save` writes the cache file atomically.

    Put it before the dataset base class: ``class MyDataset(StrictLoad, InMemoryDataset)``;
    name the tensors every stored example has in :attr:`cache_keys`.
    """

    #: The tensors every example of the cache holds: :meth:`load` refuses a cache that
    #: lacks one, or whose slices of one do not cut its rows into the examples.
    cache_keys: tuple[str, ...] = ()

    @classmethod
    def save(cls, data_list: Sequence, path: str | os.PathLike) -> None:
        """PyG's ``InMemoryDataset.save``, written to a temporary file beside ``path`` and
        renamed into place once complete."""
        with atomic_path(path) as tmp:
            super().save(data_list, str(tmp))

    def load(self, path: str, data_cls: type = Data) -> None:
        """PyG's ``InMemoryDataset.load`` with ``torch.load(weights_only=True)`` only.

        Raises:
            CorruptFileError: the file is not a processed cache of allow-listed classes
                (truncated, damaged, or holding other objects, e.g. code).
        """
        out = load_weights_only(
            path,
            "a readable processed cache of this dataset (expected PyG data only",
            "it from the raw files",
        )
        if (
            not isinstance(out, tuple)
            or len(out) not in (2, 3)
            or not isinstance(out[0], dict | Data | HeteroData)
            or not isinstance(out[1], dict | None)
            or not all(map(_is_data_class, out[2:]))
        ):
            raise CorruptFileError(path, f"{path} does not hold (data, slices[, data class])")
        data, self.slices = out[:2]
        data_cls = out[2] if len(out) == 3 else data_cls
        self.data = data_cls.from_dict(data) if isinstance(data, dict) else data
        problems = [self._cache_key_problem(key) for key in self.cache_keys]
        if not any(problems) and self.slices is not None:
            examples = {key: self.slices[key].numel() - 1 for key in self.cache_keys}
            if len(set(examples.values())) > 1:
                problems.append(f"its slices cut different numbers of examples ({examples})")
        for problem in filter(None, problems):
            raise damaged_cache(path, problem)

    def _cache_key_problem(self, key: str) -> str | None:
        """What is wrong with the stored ``key`` (``None``: nothing): it must be a tensor,
        and its slices (if any) cut it along the dimension PyG concatenates it in (rows;
        columns of ``edge_index``) from 0 to the end, in order."""
        value = self._data[key] if key in self._data else None
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return f"it holds no tensor {key!r} of examples"
        if self.slices is None:
            return None
        dim = self._data.__cat_dim__(key, value)  # (None: stacked, one entry per example)
        size = value.size(0 if dim is None else dim)
        cuts = self.slices.get(key)
        if (
            not isinstance(cuts, torch.Tensor)
            or cuts.dim() != 1
            or cuts.numel() < 2
            or int(cuts[0]) != 0
            or int(cuts[-1]) != size
            or bool((cuts.diff() < 0).any())
        ):
            return f"its slices of {key!r} do not cut its {size} stored entries in order"
        return None

    def check_labels(self, path: str, classes: int) -> None:
        """Refuse a cache (``path``) whose labels ``y`` are not class ids ``0 … classes - 1``
        (:func:`~hiergraph.datasets.graph_checks.label_problems`; ``classes``: those its
        metadata names)."""
        y = self._data["y"]
        problems = label_problems(y, y.size(0) if y.dim() else -1, classes=classes)
        if problems:
            raise damaged_cache(path, "; ".join(problems))

    def load_meta(self, path: str, keys: Sequence[str]) -> dict:
        """The JSON object the cache keeps beside its splits (class names and the like),
        holding at least ``keys`` and a non-empty ``"classes"`` list of names.

        Raises:
            CorruptFileError: the file is not such an object (damaged or edited).
        """
        try:
            regular_file(Path(path), "the file")  # (a FIFO: a read without end)
            meta = json.loads(Path(path).read_text(encoding="utf-8"))
            missing = [key for key in keys if key not in meta] if isinstance(meta, dict) else keys
            if missing:
                raise ValueError(f"no {', '.join(map(repr, missing))} in {type(meta).__name__}")
            classes = meta["classes"]
            if not isinstance(classes, list) or not classes:
                raise ValueError(f"'classes' must be a non-empty list, got {classes!r}")
        except (OSError, ValueError, RecursionError) as err:  # (JSONDecodeError: a ValueError)
            raise CorruptFileError(
                path,
                f"{path}: cannot load this processed {type(self).__name__} cache file "
                f"({type(err).__name__}: {err}); it is damaged. Rebuild the cache with "
                f"force_reload=True or by deleting {self.processed_dir}.",
            ) from err
        return meta
