"""The processing lock (two processes building one cache, the flock and portable locks) and
atomic writes of every file a loader writes."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest
import torch

from hiergraph.datasets import locks
from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.locate import OFFLINE_ENV
from hiergraph.datasets.locks import atomic_path, file_lock
from hiergraph.datasets.ogbn import load_ogbn, ogbn_dir
from tests.datasets.fixtures import (
    Killed,
    SlowProcess,
    cut_writes,
    first_runs_in_two_processes,
    imdb_files,
    write_tar,
    write_tiny_planetoid,
)
from tests.datasets.test_ogbn import needs_ogb, write_tiny_arxiv

NAME = "aclImdb_v1.tar.gz"


# --------------------------------------------------------------------------- lock


class SlowIMDB(SlowProcess, IMDB):
    """IMDB whose processing logs its start and end and takes at least a second."""


def _build(root: str, raw: str, log: str, barrier, queue) -> None:
    os.environ[OFFLINE_ENV] = "1"
    torch.set_num_threads(1)
    SlowIMDB.event_log = log
    barrier.wait(timeout=120)
    ds = SlowIMDB(root, tokenizer="simple", raw_dir=raw)
    queue.put((os.getpid(), len(ds), int(ds._data.x.sum()), ds.meta["vocab"][:5]))


def test_two_processes_build_one_cache(tmp_path):
    write_tar(tmp_path / NAME, imdb_files(per_class=30))
    args = (str(tmp_path / "imdb"), str(tmp_path))
    results, events = first_runs_in_two_processes(_build, args, tmp_path / "process.log")
    assert events.count("start") == 1 and events.count("end") == 1, events  # built once
    assert results[0][1:] == results[1][1:] and results[0][1] == 54
    cache = tmp_path / "imdb" / "processed"
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [".lock"]


@pytest.mark.parametrize("kind", ["flock", "portable"])
def test_lock_is_exclusive(tmp_path, monkeypatch, kind):
    if kind == "portable":
        monkeypatch.setattr(locks, "fcntl", None)
        monkeypatch.setattr(locks, "msvcrt", None)
    elif locks.fcntl is None:
        pytest.skip("no fcntl here")
    inside, peak, lock = [0], [0], threading.Lock()

    def work():
        for _ in range(5):
            with file_lock(tmp_path / "processed"):
                with lock:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(0.01)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1
    assert not (tmp_path / "processed" / ".lock.pid").exists()


def test_portable_lock_left_by_a_killed_process_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "fcntl", None)
    monkeypatch.setattr(locks, "msvcrt", None)
    (tmp_path / ".lock.pid").write_text("12345")
    with pytest.raises(TimeoutError, match=r"\.lock\.pid.*delete the file"):
        with file_lock(tmp_path, timeout=0.3):
            pass


# ---------------------------------------------------------------- atomic writes
def test_atomic_path_leaves_nothing_when_interrupted_and_keeps_the_umask(tmp_path):
    path = tmp_path / "sub" / "file.bin"
    with pytest.raises(Killed):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise Killed
    assert os.listdir(tmp_path / "sub") == []
    old = os.umask(0o022)
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"all")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"all" and os.listdir(tmp_path / "sub") == ["file.bin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as a plain open() would make it


def test_interrupted_planetoid_cache_leaves_no_partial_file(no_env, tmp_path, monkeypatch):
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    root = tmp_path / "data"
    with monkeypatch.context() as m:
        cut_writes(m)
        with pytest.raises(Killed):
            hp.load_planetoid("Cora", root=root, raw_dir=raw)
    processed = root / "Cora" / "processed"
    assert sorted(p.name for p in processed.iterdir()) == [".lock"]
    data = hp.load_planetoid("Cora", root=root, raw_dir=raw)[0]  # built again, in full
    assert data.num_nodes == 560


@needs_ogb
def test_interrupted_ogb_cache_leaves_no_partial_file(tmp_path, monkeypatch):
    labels, _ = write_tiny_arxiv(tmp_path)
    with monkeypatch.context() as m:
        cut_writes(m)
        with pytest.raises(Killed):
            load_ogbn("ogbn-arxiv", root=tmp_path)
    processed = ogbn_dir("ogbn-arxiv", tmp_path) / "processed"
    assert sorted(p.name for p in processed.iterdir()) == [".lock"]
    data, _ = load_ogbn("ogbn-arxiv", root=tmp_path)  # processed again, in full
    assert torch.equal(data.y, labels)
    assert (processed / "geometric_data_processed.pt").is_file()
