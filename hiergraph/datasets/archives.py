"""Reading a dataset's raw files from a folder, a ``.tar(.gz|.bz2|.xz)`` or a ``.zip``, without
extracting it, guarded against wrong and damaged sources.

:func:`iter_raw_files` yields ``(relative path, content)`` of the regular files a dataset
wants, selected by name before any content is read, so unused members cost no memory. It
refuses, with :class:`~hiergraph.datasets.errors.CorruptFileError` naming the archive, the
member and what it should hold:

* sizes: a wanted file larger than :data:`MAX_MEMBER_BYTES` (or the dataset's own limit),
  by its declared size before it is read, and a zip member whose content outgrows its
  declared size;
* links: a symbolic link inside a tar (a hard link is read as the file it names, checked at
  that file's size, and a link to a member the archive lacks is a damaged archive); in a
  folder, a file that a symlink leads out of the folder raises ``ValueError``;
* duplicate members: an archive that holds a wanted name twice (it would be read twice);
* truncated tar ends: a tar without its end-of-archive block or with a cut compressed
  stream, which ``tarfile`` silently takes for the end of the archive; likewise any archive
  its reader fails on (truncated, damaged, encrypted or of an unknown compression method).

:func:`decode` reads a file's bytes as UTF-8, as UTF-16 when they start with its byte-order
mark, else as Latin-1. :class:`FirstCopies` reads each document of a corpus that holds a
folder twice once, and refuses two copies that differ.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import lzma
import os
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from hiergraph.datasets.errors import CorruptFileError, regular_file
from hiergraph.datasets.locate import resolve_inside

#: Largest archive member (or file) a dataset reads, in bytes: far above any document of
#: the supported corpora, so that a wrong or malicious archive fails fast, before it is
#: read into memory.
MAX_MEMBER_BYTES = 64 << 20

#: Errors of the archive readers on a truncated or damaged file.
_ARCHIVE_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    lzma.LZMAError,
    OSError,  # e.g. bz2's "Invalid data stream"
    RuntimeError,  # an encrypted zip member ("password required")
    NotImplementedError,  # a zip member of a compression method Python lacks
)


def _member_name(name: str) -> str:
    return re.sub(r"^(?:\./)+", "", name).lstrip("/")


def _check_size(source: Path, name: str, size: int, max_bytes: int, what: str) -> None:
    if size > max_bytes:
        raise CorruptFileError(
            source,
            f"{source}: {name!r} is {size:,} bytes, more than the {max_bytes:,} bytes allowed "
            f"for one file of {what}; is this the right archive? (Raise the limit with the "
            "dataset's max_member_bytes if the file is genuine.)",
        )


def _check_tar_end(archive: tarfile.TarFile) -> None:
    """Raise ``tarfile.ReadError`` unless the archive ends with its end-of-archive block
    and, when compressed, its compressed stream is complete. (``tarfile`` takes a cut or
    unreadable header after the first member for the end of the archive, silently.)"""
    archive.fileobj.seek(archive.offset)
    block = archive.fileobj.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE or block.count(0) != tarfile.BLOCKSIZE:
        raise tarfile.ReadError(f"no end-of-archive block after byte {archive.offset}")
    while archive.fileobj.read(1 << 20):  # a truncated gzip/bz2/xz stream raises here
        pass


def iter_raw_files(
    source: str | os.PathLike,
    wanted: Callable[[str], bool] | None = None,
    max_bytes: int = MAX_MEMBER_BYTES,
    what: str = "the dataset",
) -> Iterator[tuple[str, bytes]]:
    """``(relative path, content)`` of the regular files in a folder, ``.tar(.gz|.bz2|.xz)``
    or ``.zip``.

    Only files whose relative path passes ``wanted`` (default: all) are read, and
    their names are checked before their content is touched, so unused members cost
    no memory. A wanted file larger than ``max_bytes`` (its declared size), an archive
    that holds a wanted name twice (it would be read twice) and a truncated or damaged
    archive raise :class:`~hiergraph.datasets.errors.CorruptFileError` naming the
    archive, the member and ``what`` it should hold; a folder's file that a symlink leads
    out of the folder raises ``ValueError``
    (:func:`~hiergraph.datasets.locate.resolve_inside`).
    """
    source = Path(source)
    keep = wanted if wanted is not None else (lambda name: True)
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            name = path.relative_to(source).as_posix()
            if path.is_file() and keep(name):
                path = resolve_inside(source, path, f"{what}, file {name!r}")
                _check_size(source, name, path.stat().st_size, max_bytes, what)
                yield name, path.read_bytes()
        return
    yield from _unique(source, _archive_files(source, keep, max_bytes, what), what)


def _unique(source: Path, files: Iterator[tuple[str, bytes]], what: str):
    """``files`` as they come, refusing a name seen before."""
    seen = set()
    for name, content in files:
        if name in seen:
            raise CorruptFileError(
                source,
                f"{source} holds {name!r} twice; expected {what}, each file once. Is this "
                "the right archive? Put the official one in its place.",
            )
        seen.add(name)
        yield name, content


def _archive_files(source: Path, keep, max_bytes: int, what: str):
    """:func:`iter_raw_files` of a ``.tar(.gz|.bz2|.xz)`` or ``.zip``."""
    if source.name.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")):
        kind = "tar"
    elif source.suffix == ".zip":
        kind = "zip"
    else:
        raise ValueError(f"cannot read {source}: expected a folder, a .tar(.gz) or a .zip")
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    regular_file(source, what)  # (a FIFO there was reported missing)
    try:
        if kind == "tar":
            with tarfile.open(source, "r:*") as archive:
                for member in archive:
                    name = _member_name(member.name)
                    if not keep(name) or member.isdir():
                        continue
                    if member.issym():  # (dropped without a word before)
                        raise CorruptFileError(
                            source,
                            f"{source}: {name} is a symbolic link inside the archive; expected "
                            f"{what} holding the files themselves",
                        )
                    if member.isfile() or member.islnk():  # a hard link: a file's second name
                        size = member.size if member.isfile() else _link_size(archive, member)
                        _check_size(source, name, size, max_bytes, what)
                        yield name, archive.extractfile(member).read()
                _check_tar_end(archive)
        else:
            with zipfile.ZipFile(source) as archive:
                for info in archive.infolist():
                    if not info.is_dir() and keep(info.filename):
                        _check_size(source, info.filename, info.file_size, max_bytes, what)
                        with archive.open(info) as f:
                            content = f.read(max_bytes + 1)
                        _check_size(source, info.filename, len(content), max_bytes, what)
                        yield info.filename, content
    except CorruptFileError:
        raise
    except (FileNotFoundError, PermissionError):
        raise
    except _ARCHIVE_ERRORS as err:
        raise CorruptFileError(
            source,
            f"{source} is not a readable {kind} archive ({type(err).__name__}: {err}); "
            f"expected {what}. It is probably truncated or damaged: delete it and download "
            "it again, or put an intact copy in its place.",
        ) from err


def _link_size(archive: tarfile.TarFile, link: tarfile.TarInfo) -> int:
    """The size of the file a tar hard link names (the link's own header says 0)."""
    try:
        return archive.getmember(link.linkname).size
    except KeyError:  # (tarfile's read of it fails the same way)
        raise tarfile.TarError(f"{link.name} links to {link.linkname}, which it lacks") from None


def decode(content: bytes) -> str:
    """UTF-8 text, UTF-16 text that starts with its byte-order mark, else Latin-1 (20
    Newsgroups and BBC have Latin-1 files; any bytes read as Latin-1, those of a damaged
    UTF-16 file too)."""
    bom = content.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    for encoding in ("utf-16",) if bom else ("utf-8",):  # (a mark is never UTF-8)
        try:
            return content.decode(encoding)
        except UnicodeDecodeError:
            continue
    return content.decode("latin-1")


class FirstCopies:
    """Keeps the first copy of each document of a corpus, by key (its split, class and id):
    a corpus that holds a folder twice (a copy under another name, ``train/`` beside
    ``val/`` with the same files, an alias of a class) reads each document once, for a copy
    in the training and one in the validation part would leak. Two copies that differ (other
    than in their line endings) are refused. The same text under another id is another
    document: the official corpora hold such repeats (IMDB: 123 texts, whitespace aside, in
    both its official training and test sets), kept as in their official splits."""

    def __init__(self, source: Path):
        self.source, self.seen = source, {}  # key -> (path, digest of its text)

    def first(self, key: tuple, path: str, text: str, what: str) -> bool:
        """Whether ``path`` holds the first copy of document ``key`` (``what``, for the
        error: e.g. "article 002 of 'sport'")."""
        normal = text.replace("\r\n", "\n").replace("\r", "\n")  # (other line endings)
        digest = hashlib.sha256(normal.encode("utf-8", "surrogatepass")).digest()
        if key not in self.seen:
            self.seen[key] = path, digest
            return True
        if self.seen[key][1] != digest:
            raise ValueError(
                f"{self.source}: {path} and {self.seen[key][0]} are both {what} but differ; "
                "keep one copy of the corpus"
            )
        return False
