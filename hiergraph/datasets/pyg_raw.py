"""Raw folders of PyG's datasets (Planetoid, PPI): raw files put in place, and failures
named by file.

:func:`prepare_raw`

1. resolves the data root: the ``root`` argument, else ``$HIERGRAPH_DATA``, else the
   user cache folder ``~/.cache/hiergraph`` (``$XDG_CACHE_HOME/hiergraph``; see
   :func:`~hiergraph.datasets.locate.data_root`);
2. if raw files are missing there and a raw source is given (``raw_dir=`` or
   ``$HIERGRAPH_RAW``), links (or, where links fail, copies) the raw files into
   ``<root>/<Name>/raw``, so that read-only sources work: PyG writes
   ``processed/`` next to ``raw/``; a forced rebuild (``force_reload=True``) links every
   file again from the first source that holds them all, so that it reads the files the
   source holds now;
3. otherwise downloads the missing files from PyG's own sources (the loader's
   ``download``) into ``<root>/<Name>/raw``;
4. raises :class:`FileNotFoundError` naming the expected files and how to get
   them if anything is still missing (offline, or ``$HIERGRAPH_OFFLINE=1``).

A raw source is a folder holding the raw files themselves (``.../Cora/raw``)
or a dataset collection holding ``<Name>/raw`` (``$HIERGRAPH_RAW``, e.g.
``HIERGRAPH_RAW=/data/collection`` with ``/data/collection/Cora/raw/ind.cora.x``).
A source that holds :data:`SYNTHETIC_MARKER` has its marker linked too.

:func:`explain_failures` turns a failure of PyG's dataset class into a
:class:`~hiergraph.datasets.errors.CorruptFileError` naming the damaged raw file or
processed cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from hiergraph.datasets.errors import CorruptFileError
from hiergraph.datasets.locate import RAW_ENV, data_root, given_raw_dir, locate_raw

#: Marker file written next to synthetic raw files (never present in real data).
SYNTHETIC_MARKER = "SYNTHETIC.txt"


def prepare_raw(
    name: str,
    files: list[str],
    root: str | os.PathLike | None = None,
    raw_dir: str | os.PathLike | None = None,
    how_to_get: str = "",
    download: Callable[[Path, list[str]], None] | None = None,
    refresh: bool = False,
) -> Path:
    """Make sure ``<root>/<name>/raw`` holds ``files``; returns the data root.

    Missing files are linked (copied where symlinks fail) from ``raw_dir`` or
    ``$HIERGRAPH_RAW``; with ``refresh`` (a forced rebuild) every file is linked again
    from the first of them that holds them all, whatever the raw folder holds; failing
    that, ``download(raw folder, missing files)`` fetches them (unless
    ``$HIERGRAPH_OFFLINE`` is set). Raises :class:`FileNotFoundError` if any stays missing
    because the network is unreachable, :class:`~hiergraph.datasets.errors.DownloadError`
    if a download fails on the way (see :func:`~hiergraph.datasets.locate.locate_raw`).
    """
    root = data_root(root)
    target = root / name / "raw"
    sources = _raw_sources(name, raw_dir)
    if refresh:
        source = next((s for s in sources if all((s / f).exists() for f in files)), None)
        if source is not None:
            _link_files(source, files, target, every=True)

    def missing() -> list[str]:  # (a link into a folder since removed or emptied too)
        return [f for f in files if not (target / f).exists()]

    def take(place: Path) -> Path | None:
        """``root`` once ``target`` has every file, the missing ones linked from ``place``."""
        absent = missing()
        if absent and (place == target or not all((place / f).exists() for f in absent)):
            return None
        if absent:
            _link_files(place, absent, target, every=False)
        return root

    def fetch_missing() -> None:
        download(target, missing())

    return locate_raw(
        name,
        [target, *sources],
        take,
        lambda: f"the raw files {', '.join(missing())} (all in one folder)",
        fetch_missing if download is not None else None,
        how_to_get=how_to_get,
        noun="the files",
        data_folder=f"{name}/raw",
    )


def _raw_sources(name: str, raw_dir: str | os.PathLike | None) -> list[Path]:
    sources = []
    for base in (given_raw_dir(raw_dir), os.environ.get(RAW_ENV) or None):
        if base is not None:
            base = Path(base).expanduser()  # (a literal "~" folder was searched)
            sources += [base, base / name / "raw"]
    return sources


def _link_files(place: Path, files: list[str], target: Path, every: bool) -> None:
    """Link ``files`` of ``place`` into ``target``, with ``place``'s :data:`SYNTHETIC_MARKER`
    where it has one; ``every``: these are all the raw files, so a marker of the files they
    replace is removed where ``place`` has none. A file that already is ``place``'s (the
    same folder, or a link to it) stays as it is."""
    target.mkdir(parents=True, exist_ok=True)
    marker = (place / SYNTHETIC_MARKER).exists()
    if every and not marker:
        (target / SYNTHETIC_MARKER).unlink(missing_ok=True)
    for f in files + ([SYNTHETIC_MARKER] if marker else []):
        if (target / f).resolve() != (place / f).resolve():
            _link_or_copy(place / f, target / f)


def _link_or_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` a link to ``src`` (a copy where links are not allowed), replacing what
    ``dst`` held: never a write through an old link into the folder it points to."""
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        dst.symlink_to(src.resolve())
    except OSError:
        shutil.copyfile(src, dst)


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
def explain_failures(
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
