"""Where datasets live, and the one path every loader takes to its raw files.

* :func:`data_root`: the data root, ``root`` if given, else ``$HIERGRAPH_DATA``, else the
  user cache folder ``$XDG_CACHE_HOME/hiergraph`` (``~/.cache/hiergraph`` when
  ``XDG_CACHE_HOME`` is unset). Each dataset keeps ``raw/`` and ``processed/`` below it.
* :func:`locate_raw`: look in the places the dataset accepts, else download the official
  files (unless offline: :func:`downloads_allowed`, ``$HIERGRAPH_OFFLINE``), else raise
  :class:`FileNotFoundError` listing the places searched and how to fix it.
* :func:`given_raw_dir`: the folder a ``raw_dir=`` argument names, refused where it names
  none.
* :func:`resolve_inside`: a raw file's path with every symlink resolved, refused where it
  leads out of its raw folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hiergraph._environment import OFF
from hiergraph.datasets.errors import DownloadError

#: Environment variable for the data root (where ``<Name>/raw`` and ``processed`` live).
DATA_ENV = "HIERGRAPH_DATA"
#: Environment variable for a read-only folder of pre-placed raw files.
RAW_ENV = "HIERGRAPH_RAW"
#: Environment variable that, set to anything but ``0``, forbids every download.
OFFLINE_ENV = "HIERGRAPH_OFFLINE"


# ------------------------------------------------------------------ where data lives
def cache_dir() -> Path:
    """The user cache folder: ``$XDG_CACHE_HOME/hiergraph``, else ``~/.cache/hiergraph``."""
    if os.environ.get("XDG_CACHE_HOME"):
        return _folder_of("XDG_CACHE_HOME") / "hiergraph"
    return Path.home() / ".cache" / "hiergraph"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data root: ``root``, else ``$HIERGRAPH_DATA``, else :func:`cache_dir`.

    Args:
        root: the data root to use (``~`` expanded); ``None`` (default):
            ``$HIERGRAPH_DATA``, else :func:`cache_dir`.

    Raises:
        NotADirectoryError: naming the variable, where ``$HIERGRAPH_DATA`` or
            ``$XDG_CACHE_HOME`` names a file (a bare error of a folder below it before).
    """
    if root is not None:
        return Path(root).expanduser()
    if os.environ.get(DATA_ENV):
        return _folder_of(DATA_ENV)
    return cache_dir()


def _folder_of(variable: str) -> Path:
    """The folder the environment ``variable`` names (``~`` expanded), refused if a file."""
    path = Path(os.environ[variable]).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"${variable} names {path}, a file: set it to a folder")
    return path


def given_raw_dir(raw_dir: str | os.PathLike | None) -> Path | None:
    """The folder a loader's ``raw_dir=`` argument names (``~`` expanded), or ``None``.

    Raises:
        FileNotFoundError: naming the argument, where it names nothing (a mistyped folder
            was passed over for the other raw sources without a word).
        NotADirectoryError: where it names a file (the raw folder is the one holding it).
    """
    if raw_dir is None:
        return None
    path = Path(raw_dir).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"raw_dir={str(raw_dir)!r}: no such folder")
    if not path.is_dir():
        raise NotADirectoryError(
            f"raw_dir={str(raw_dir)!r} is a file: pass the folder that holds it"
        )
    return path


def downloads_allowed() -> bool:
    """False when ``$HIERGRAPH_OFFLINE`` is set, to anything but an empty string or a
    switch's off value (``0``, ``false``, ``no``, ``off``, any case: ``false`` was
    offline)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("", *OFF)


def describe_places(places: Sequence[os.PathLike | str]) -> str:
    """Bulleted list of folders, one per line; a place that is a file is marked as one (a
    raw folder given as the path of the archive in it)."""
    marked = [
        f"{p} (a file: name the folder that holds it)" if Path(p).is_file() else p for p in places
    ]
    return "".join(f"\n  - {p}" for p in marked) or " (none)"


# -------------------------------------------- locate, else download, else explain
T = TypeVar("T")


def locate_raw(
    name: str,
    places: Sequence[Path],
    find: Callable[[Path], T | None],
    expected: str | Callable[[], str],
    download: Callable[[], object] | None = None,
    *,
    how_to_get: str = "",
    noun: str = "it",
    raw_env: str | None = RAW_ENV,
    raw_dir_argument: bool = True,
    data_folder: str | None = None,
) -> T:
    """A dataset's raw data: found in ``places``, else downloaded, else explained.

    1. ``find(place)`` runs on each of ``places`` in order (it may link what it finds
       into place); the first result that is not ``None`` is returned.
    2. Otherwise, unless there is no ``download`` or ``$HIERGRAPH_OFFLINE`` is set,
       ``download()`` fetches the official files into ``places[0]`` (where the raw
       files belong) and the search runs again. A download that fails on the way (cut,
       not the official file, a server's error) raises :class:`DownloadError` naming
       ``name``, what went wrong and the fix below; an unreachable network goes on to 3.
    3. Raises :class:`FileNotFoundError`::

           <name>: no raw data found. Expected <expected>; searched:
             - <each of places>
           <no download | downloads switched off | the download failed (offline?)>
           Fix: put <noun> into <places[0]>, or pass raw_dir=<folder holding <noun>>,
           or set <raw_env>=<folder holding <noun>>, or set HIERGRAPH_DATA/root= to a
           data root that has <data_folder>. <how_to_get>

       (the ``raw_dir=``, ``raw_env`` and data-root ways only where the dataset takes
       them: ``raw_dir_argument``, ``raw_env`` and ``data_folder``; ``$HIERGRAPH_RAW``
       also takes a collection holding ``<name>/raw``).

    Args:
        name: the dataset, first word of every message.
        places: the folders searched, in order; ``places[0]`` is where the files belong.
        find: what to return for a place that has the files, else ``None``.
        expected: what the files are (or a function saying it, for messages that list
            what is still missing).
        download: fetches the official files into ``places[0]``; ``None``: no download.
        how_to_get: where the official files are, appended to the fix.
        noun: how the messages name the files (``"it"``, ``"the files"``).
    """

    def search() -> T | None:
        for place in places:
            found = find(place)
            if found is not None:
                return found
        return None

    found = search()
    if found is not None:
        return found
    target = places[0]
    ways = [f"put {noun} into {target}"]
    if raw_dir_argument:
        ways.append(f"pass raw_dir=<folder holding {noun}>")
    if raw_env:
        collection = f" or {name}/raw" if raw_env == RAW_ENV else ""
        ways.append(f"set {raw_env}=<folder holding {noun}{collection}>")
    if data_folder:
        ways.append(f"set {DATA_ENV}/root= to a data root that has {data_folder}")
    fix = f"Fix: {', or '.join(ways)}. {how_to_get}".rstrip()
    failure = None
    if download is None:
        tried = "This dataset has no automatic download."
    elif not downloads_allowed():
        tried = f"Downloads are switched off (${OFFLINE_ENV})."
    else:
        try:
            download()
        except DownloadError as err:
            if not err.unreachable:
                raise DownloadError(f"{name}: {err}\n{fix}") from err
            failure = err
            tried = f"Downloading {noun} failed (offline?): {err}"
        else:
            found = search()
            if found is not None:
                return found
            tried = f"The download finished but did not provide {noun}."
    what = expected() if callable(expected) else expected
    raise FileNotFoundError(
        f"{name}: no raw data found. Expected {what}; searched:{describe_places(places)}\n"
        f"{tried}\n{fix}"
    ) from failure


def resolve_inside(root: str | os.PathLike, path: str | os.PathLike, entry: str) -> Path:
    """``path`` with every symlink resolved, checked to lie inside the folder ``root``.

    ``path`` is a file system path (usually ``root / <relative name>``; joining
    an absolute name replaces ``root``, which this check then catches). Both
    are resolved before the comparison, so ``root`` itself may be a symlink,
    and so may files inside it as long as they point inside it.

    Args:
        root: the raw folder.
        path: the file to read.
        entry: what asked for the file (e.g. an index entry), for the error.

    Returns:
        the resolved path.

    Raises:
        ValueError: the resolved path is outside the resolved ``root``; the
            message names ``entry`` and ``root``.
    """
    base = Path(root).resolve()
    target = Path(path).resolve()
    if not target.is_relative_to(base):
        raise ValueError(
            f"{entry}: {os.fspath(path)!r} leads to {str(target)!r}, outside the raw folder "
            f"{os.fspath(root)!r}. Raw files must lie inside the raw folder: no absolute "
            "paths, no '..' climbing out of it, no symlinks pointing out of it."
        )
    return target
