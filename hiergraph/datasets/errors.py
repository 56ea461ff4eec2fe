"""Errors of the dataset loaders, and the check that a dataset file is a regular file.

* :class:`CorruptFileError`: a file on disk is not what it should be (a truncated
  archive, a damaged pickle, an archive member far larger than expected). Its message
  names the file and what was expected.
* :class:`DownloadError`: a download failed (``unreachable``: no server could be reached
  at all).
* :func:`regular_file`: a path that must be a regular file, refused by name if it is a
  FIFO, a device or a folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


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
