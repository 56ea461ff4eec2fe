"""Where datasets live, how their official files are fetched, and the processing lock.

* :func:`data_root`: the data root, ``root`` if given, else ``$HIERGRAPH_DATA``, else the
  user cache folder ``$XDG_CACHE_HOME/hiergraph`` (``~/.cache/hiergraph`` when
  ``XDG_CACHE_HOME`` is unset). Each dataset keeps ``raw/`` and ``processed/`` below it.
* :func:`fetch`: download one official file into place. The bytes go to a temporary
  file next to the destination, which is renamed into place only when the download is
  complete and its SHA-256 matches :attr:`RemoteFile.sha256`; a cut connection, a
  checksum mismatch or an interruption leave nothing at the destination, and the partial
  file of a killed run is removed by the next download of that file. Set
  ``$HIERGRAPH_OFFLINE=1`` to never try the network.
* :func:`file_lock`: an exclusive lock on ``<folder>/.lock`` (``fcntl.flock`` where
  available, a portable lock file otherwise), held while a dataset downloads its raw
  files and builds its processed cache, so that concurrent first runs do not both
  write the cache.
* :func:`locate_raw`: the one path every loader takes to its raw files: look in the
  places the dataset accepts, else download the official files (unless offline), else
  raise :class:`FileNotFoundError` listing the places searched and how to fix it.
* :func:`atomic_path`: every file a loader writes (downloads, unpacked raw files,
  processed caches) is written to a temporary file beside it and renamed into place
  when complete, so an interrupted run never leaves a partial file in its place (a killed
  process leaves its temporary file, hidden, beside it).
* :class:`CorruptFileError`: a file on disk is not what it should be (a truncated
  archive, a damaged pickle, an archive member far larger than expected). Its message
  names the file and what was expected.

:data:`REMOTE_FILES` lists the official archives of the document corpora with their
SHA-256 checksums; :data:`PLANETOID_SHA256` those of the Planetoid raw files. A
checksum constant must be the SHA-256 of the official file: if a publisher replaces a
file, downloads fail with a checksum error until the constant is updated.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import secrets
import socket
import stat
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hiergraph._environment import OFF

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None

#: Environment variable for the data root (where ``<Name>/raw`` and ``processed`` live).
DATA_ENV = "HIERGRAPH_DATA"
#: Environment variable for a read-only folder of pre-placed raw files.
RAW_ENV = "HIERGRAPH_RAW"
#: Environment variable that, set to anything but ``0``, forbids every download.
OFFLINE_ENV = "HIERGRAPH_OFFLINE"

_CHUNK = 1 << 20
_USER_AGENT = "hiergraph (dataset download)"
#: Seconds a socket may wait for the server (connection or next bytes).
TIMEOUT = 60.0
#: A download that receives fewer than ``MIN_RATE`` bytes per second over ``SLOW_SECONDS``
#: is given up (a server that trickles a byte now and then never meets :data:`TIMEOUT`).
MIN_RATE, SLOW_SECONDS = 1024, 120.0
#: Seconds after which a download's temporary file that nothing wrote to is a dead one's.
DEAD_SECONDS = 4 * SLOW_SECONDS


class CorruptFileError(ValueError):
    """A dataset file exists but cannot be read as what it should be.

    Attributes:
        path: the file.
    """

    def __init__(self, path: str | os.PathLike, message: str):
        super().__init__(message)
        self.path = Path(path)


def regular_file(path: Path, what: str) -> Path:
    """``path`` if it is (or links to) a regular file; else a :class:`CorruptFileError`
    naming ``what`` should be there: a FIFO there blocks its reader forever (holding the
    dataset's lock), a device such as ``/dev/zero`` never ends. A missing file raises
    ``FileNotFoundError``, which callers report their own way."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise CorruptFileError(
            path,
            f"{path}: {what} is not a regular file (a FIFO, a device or a folder): put the "
            "file itself there",
        )
    return path


class DownloadError(OSError):
    """A download failed. ``unreachable`` is true when no server could be reached at all
    (no network, unknown host, refused or timed-out connection)."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class RemoteFile:
    """An official file: its name on disk, where to get it (mirrors in order) and its
    SHA-256 (``None``: no checksum is known; the download is then only checked for
    completeness)."""

    filename: str
    urls: tuple[str, ...]
    sha256: str | None


#: Official archives of the document corpora (keys: the dataset ``name``). Each checksum
#: is the SHA-256 of the official file at the first URL; the figshare URL is the copy of
#: the same 20 Newsgroups archive that scikit-learn downloads. No checksum is published
#: for BBC News: its download is only checked for completeness (and the zip's CRCs when
#: it is read).
REMOTE_FILES: dict[str, RemoteFile] = {
    "IMDB": RemoteFile(
        "aclImdb_v1.tar.gz",
        ("https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",),
        "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe",
    ),
    "20NG": RemoteFile(
        "20news-bydate.tar.gz",
        (
            "http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz",
            "https://ndownloader.figshare.com/files/5975967",
        ),
        "8f1b2514ca22a5ade8fbb9cfa5727df95fa587f4c87b786e15c759fa66d95610",
    ),
    "BBCNews": RemoteFile(
        "bbc-fulltext.zip", ("http://mlg.ucd.ie/files/datasets/bbc-fulltext.zip",), None
    ),
}

#: SHA-256 of the raw Planetoid files that ``torch_geometric.datasets.Planetoid``
#: downloads (``Planetoid.url``, the kimiyoung/planetoid repository).
PLANETOID_SHA256: dict[str, str] = {
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.pubmed.x": "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
    "ind.pubmed.tx": "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
    "ind.pubmed.allx": "508e538e2abdccdd54c4d3e9f49d638b4af7107d85845f66ddea5a5152658b7e",
    "ind.pubmed.y": "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
    "ind.pubmed.ty": "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
    "ind.pubmed.ally": "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
    "ind.pubmed.graph": "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
    "ind.pubmed.test.index": "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5",
}


# ------------------------------------------------------------------ where data lives
def cache_dir() -> Path:
    """The user cache folder: ``$XDG_CACHE_HOME/hiergraph``, else ``~/.cache/hiergraph``."""
    if os.environ.get("XDG_CACHE_HOME"):
        return _folder_of("XDG_CACHE_HOME") / "hiergraph"
    return Path.home() / ".cache" / "hiergraph"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data root: ``root``, else ``$HIERGRAPH_DATA``, else :func:`cache_dir`.

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


def downloads_allowed() -> bool:
    """False when ``$HIERGRAPH_OFFLINE`` is set, to anything but an empty string or a
    switch's off value (``0``, ``false``, ``no``, ``off``, any case: ``false`` was
    offline)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("", *OFF)


# ------------------------------------------------------------------------- download
def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unreachable(err: BaseException) -> bool:
    """No server answered: ``urlopen`` wraps DNS failures and refused or timed-out
    connections in ``URLError`` (``HTTPError``, an answer from a server, is not one)."""
    if isinstance(err, urllib.error.HTTPError):
        return False
    return isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout))


def _download_once(
    url: str, dest: Path, sha256: str | None, timeout: float, max_bytes: int | None
) -> None:
    """Download ``url`` to a temporary file beside ``dest``, check it, rename it into place."""
    with atomic_path(dest) as tmp:
        digest, received = hashlib.sha256(), 0
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
        with open(tmp, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as r:
            length = r.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            if max_bytes is not None and (expected or 0) > max_bytes:
                raise DownloadError(f"{url} is {expected:,} bytes, more than {max_bytes:,}")
            since, recent = time.monotonic(), 0  # bytes of the current window of SLOW_SECONDS
            try:  # read1: what has arrived, so a cut names the bytes received so far
                while chunk := r.read1(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    if max_bytes is not None and received > max_bytes:
                        raise DownloadError(f"{url} is more than {max_bytes:,} bytes")
                    recent, elapsed = recent + len(chunk), time.monotonic() - since
                    if elapsed >= SLOW_SECONDS:
                        if recent < MIN_RATE * elapsed:
                            raise DownloadError(
                                f"the download of {url} stalled: {recent} bytes in the last "
                                f"{elapsed:.0f} s (less than {MIN_RATE} bytes/s), "
                                f"{received} received"
                            )
                        since, recent = time.monotonic(), 0
            except DownloadError:
                raise
            except (http.client.HTTPException, OSError) as err:
                raise DownloadError(
                    f"the download of {url} was cut after {received} bytes"
                    + (f" of {expected}" if expected is not None else "")
                    + f" ({type(err).__name__}: {err})"
                ) from err
        if expected is not None and received != expected:
            raise DownloadError(
                f"the download of {url} was cut after {received} of {expected} bytes"
            )
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise DownloadError(
                f"the file downloaded from {url} ({received} bytes) has SHA-256 "
                f"{digest.hexdigest()}, expected {sha256}: it is truncated, damaged or "
                "not the official file"
            )
        if sha256 is None and not _is_archive_like(tmp, dest.name):
            raise DownloadError(
                f"the file downloaded from {url} ({received} bytes) is not the archive its "
                f"name {dest.name} says (an error page, or cut short?)"
            )


def _is_archive_like(path: Path, name: str) -> bool:
    """Whether a file named ``name`` (``.zip`` or NumPy's ``.npz``, ``.tar``, ``.tar.gz``,
    ``.tgz``) opens as that kind of archive; any other name passes (a file without a
    checksum is taken as it comes). An unchecked archive renamed into place would be taken
    as complete."""
    if name.endswith((".zip", ".npz")):  # its central directory, read: not just a marker
        try:  # (an HTML error page that held the end-of-directory bytes passed)
            with zipfile.ZipFile(path) as archive:
                return len(archive.infolist()) > 0
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return False
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        return tarfile.is_tarfile(path)
    return True


def fetch(
    remote: RemoteFile,
    dest: str | os.PathLike,
    timeout: float = TIMEOUT,
    max_bytes: int | None = None,
) -> Path:
    """Download ``remote`` to ``dest`` (tries its URLs in order) and return ``dest``.

    Nothing is written at ``dest`` unless a download is complete and matches
    ``remote.sha256``; a file larger than ``max_bytes`` is refused. Raises
    :class:`DownloadError` (``unreachable=True`` when no server could be reached)
    naming every URL tried and why it failed.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_downloads(dest)
    failures, unreachable = [], True
    for url in remote.urls:
        print(f"Downloading {url} to {dest}", file=sys.stderr)
        try:
            _download_once(url, dest, remote.sha256, timeout, max_bytes)
            return dest
        except DownloadError as err:
            failures.append(str(err))
            unreachable = False
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            failures.append(f"{url}: {err}")
            unreachable = unreachable and _unreachable(err)
    tried = "".join(f"\n  - {f}" for f in failures)
    raise DownloadError(
        f"could not download {remote.filename} to {dest.parent}:{tried}", unreachable
    )


def _remove_dead_downloads(dest: Path) -> None:
    """Remove the temporary files of downloads of ``dest`` that a killed process left
    (:func:`atomic_path`'s ``.<name>.<hex>.tmp``, 33 MB of IMDB after 9 s): those untouched
    for :data:`DEAD_SECONDS`. A live download writes at least every :data:`SLOW_SECONDS`
    or gives up."""
    for tmp in dest.parent.glob(f".{dest.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - tmp.stat().st_mtime > DEAD_SECONDS:
                tmp.unlink()


# ----------------------------------------------------------------------------- lock
#: Seconds to wait for a portable (non-``flock``) lock before giving up.
LOCK_TIMEOUT = 6 * 3600.0


@contextlib.contextmanager
def file_lock(folder: str | os.PathLike, timeout: float = LOCK_TIMEOUT) -> Iterator[Path | None]:
    """Hold an exclusive lock on ``<folder>/.lock`` (created with the folder if needed).

    Uses ``fcntl.flock`` (released by the OS when the process dies), else
    ``msvcrt.locking`` on Windows, else an exclusively created ``.lock.pid`` file
    (removed on exit; a process killed while holding it leaves it behind, and the
    next one waits up to ``timeout`` seconds, then raises :class:`TimeoutError`
    naming the file to delete). A folder that cannot be written to is not locked
    (yields ``None``): nothing can be built there anyway.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "a+b")  # noqa: SIM115 - closed in the finally below
    except OSError:
        handle = None
    if handle is None:
        yield None
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            except OSError:  # e.g. a file system without flock: portable fallback
                with _exclusive_file(folder / ".lock.pid", timeout):
                    yield folder / ".lock"
                return
            try:
                yield folder / ".lock"
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        elif msvcrt is not None:  # pragma: no cover - Windows
            _msvcrt_lock(handle, timeout)
            try:
                yield folder / ".lock"
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            with _exclusive_file(folder / ".lock.pid", timeout):
                yield folder / ".lock"
    finally:
        handle.close()


def _msvcrt_lock(handle, timeout: float) -> None:  # pragma: no cover - Windows
    deadline = time.monotonic() + timeout
    while True:
        handle.seek(0)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not lock {handle.name} within {timeout:.0f} s") from None
            time.sleep(0.1)


@contextlib.contextmanager
def _exclusive_file(path: Path, timeout: float, poll: float = 0.1) -> Iterator[None]:
    """Portable lock: whoever creates ``path`` (``O_CREAT | O_EXCL``) holds it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {timeout:.0f} s for the lock file {path}, held by another process "
                    "building this dataset; if no such process is running (one was killed), "
                    "delete the file and try again"
                ) from None
            time.sleep(poll)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# ------------------------------------------------------------------ atomic writes
@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed to ``path`` when the block succeeds.

    The block writes the file at the yielded path (an empty file, created with the
    permissions a plain ``open(path, "w")`` would give); if it raises, or the process
    is interrupted, the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # tempfile.mkstemp would make the file private (0o600), whatever the umask
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


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
