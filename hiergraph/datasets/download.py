"""How the official files of a dataset are fetched.

* :func:`fetch`: download one official file into place. The bytes go to a temporary
  file next to the destination, which is renamed into place only when the download is
  complete and its SHA-256 matches :attr:`RemoteFile.sha256`; a cut connection, a
  checksum mismatch or an interruption leave nothing at the destination, and the partial
  file of a killed run is removed by the next download of that file. Set
  ``$HIERGRAPH_OFFLINE=1`` to never try the network.

:data:`REMOTE_FILES` lists the official archives of the document corpora with their
SHA-256 checksums; :data:`PLANETOID_SHA256` those of the Planetoid raw files. A
checksum constant must be the SHA-256 of the official file: if a publisher replaces a
file, downloads fail with a checksum error until the constant is updated.

The errors (:class:`~hiergraph.datasets.errors.CorruptFileError`,
:class:`~hiergraph.datasets.errors.DownloadError`), the lock and atomic writes
(:mod:`hiergraph.datasets.locks`) and where data lives (:mod:`hiergraph.datasets.locate`)
are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import socket
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hiergraph.datasets.errors import CorruptFileError, DownloadError, regular_file
from hiergraph.datasets.locate import (
    DATA_ENV,
    OFFLINE_ENV,
    RAW_ENV,
    cache_dir,
    data_root,
    describe_places,
    downloads_allowed,
    locate_raw,
    resolve_inside,
)
from hiergraph.datasets.locks import LOCK_TIMEOUT, atomic_path, file_lock

__all__ = [
    "DATA_ENV",
    "DEAD_SECONDS",
    "LOCK_TIMEOUT",
    "MIN_RATE",
    "OFFLINE_ENV",
    "PLANETOID_SHA256",
    "RAW_ENV",
    "REMOTE_FILES",
    "SLOW_SECONDS",
    "TIMEOUT",
    "CorruptFileError",
    "DownloadError",
    "RemoteFile",
    "atomic_path",
    "cache_dir",
    "data_root",
    "describe_places",
    "downloads_allowed",
    "fetch",
    "file_lock",
    "locate_raw",
    "regular_file",
    "resolve_inside",
    "sha256_of",
]

_CHUNK = 1 << 20
_USER_AGENT = "hiergraph (dataset download)"
#: Seconds a socket may wait for the server (connection or next bytes).
TIMEOUT = 60.0
#: A download that receives fewer than ``MIN_RATE`` bytes per second over ``SLOW_SECONDS``
#: is given up (a server that trickles a byte now and then never meets :data:`TIMEOUT`).
MIN_RATE, SLOW_SECONDS = 1024, 120.0
#: Seconds after which a download's temporary file that nothing wrote to is a dead one's.
DEAD_SECONDS = 4 * SLOW_SECONDS


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
