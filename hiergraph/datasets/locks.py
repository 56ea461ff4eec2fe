"""Cross-process locks and atomic writes for the files a loader writes.

* :func:`file_lock`: an exclusive lock on ``<folder>/.lock`` (``fcntl.flock`` where
  available, a portable lock file otherwise), held while a dataset downloads its raw
  files and builds its processed cache, so that concurrent first runs do not both
  write the cache.
* :func:`atomic_path`: every file a loader writes (downloads, unpacked raw files,
  processed caches) is written to a temporary file beside it and renamed into place
  when complete, so an interrupted run never leaves a partial file in its place (a killed
  process leaves its temporary file, hidden, beside it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None


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
