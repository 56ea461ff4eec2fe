"""Tiny generated raw files for the dataset tests (synthetic, never real data)."""

from __future__ import annotations

import functools
import http.server
import io
import multiprocessing
import os
import pickle
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
import torch
from torch_geometric.io import fs

from hiergraph.datasets.download import PLANETOID_SHA256, sha256_of
from hiergraph.datasets.planetoid import planetoid_raw_files


class Zeros(io.RawIOBase):
    """``size`` zero bytes, produced on demand (a huge tar member without the memory)."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def review(i: int, label: int) -> str:
    words = ("great", "wonderful", "superb", "loved")[i % 4] if label else "awful"
    return f"This film was {words}. Really {words}!<br /><br />Overall {words} {i}."


def imdb_files(per_class: int = 10, test_per_class: int = 4, top: str = "aclImdb/"):
    """Official IMDB layout (``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``)."""
    files = {}
    for label, name in enumerate(("neg", "pos")):
        for i in range(per_class):
            files[f"{top}train/{name}/{i}_{7 if label else 2}.txt"] = review(i, label)
        for i in range(test_per_class):
            files[f"{top}test/{name}/{i}_{8 if label else 3}.txt"] = review(100 + i, label)
    return files


def write_tar(path: Path, files: dict[str, str], huge: dict[str, int] | None = None) -> Path:
    """A ``.tar.gz`` of ``files``; ``huge`` adds zero-filled members of the given sizes
    first (so a reader must get past them), compressed to almost nothing."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, size in (huge or {}).items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BufferedReader(Zeros(size)))
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def truncate(path: Path, fraction: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


def trust_planetoid(raw: Path) -> Path:
    """Pin the SHA-256 of the Planetoid raw files in ``raw`` as the official ones, for the
    running test (``tests/datasets/conftest.py`` restores the pinned checksums after each
    test): the loader reads no other Planetoid files."""
    for path in raw.glob("ind.*"):
        PLANETOID_SHA256[path.name] = sha256_of(path)
    return raw


def write_tiny_planetoid(
    raw: Path, name: str = "cora", seed: int = 0, trusted: bool = True
) -> Path:
    """A **synthetic** Planetoid in the official raw format: 40 training nodes, the 500
    validation nodes PyG assumes, 20 test nodes, 8 features, 3 classes, a ring graph; with
    ``trusted``, its files pinned as the official ones for the running test
    (:func:`trust_planetoid`)."""
    rng = np.random.default_rng(seed)
    n_train, n_all, n_test, dim, classes = 40, 540, 20, 8, 3

    def features(n):
        return sp.csr_matrix((rng.random((n, dim)) > 0.7).astype(np.float32))

    def labels(n):
        return np.eye(classes, dtype=np.int64)[rng.integers(0, classes, n)]

    allx, ally = features(n_all), labels(n_all)
    items = {
        "x": allx[:n_train],
        "y": ally[:n_train],
        "allx": allx,
        "ally": ally,
        "tx": features(n_test),
        "ty": labels(n_test),
        "graph": {i: [(i + 1) % (n_all + n_test)] for i in range(n_all + n_test)},
    }
    raw.mkdir(parents=True, exist_ok=True)
    for file in planetoid_raw_files(name):
        suffix = file.removeprefix(f"ind.{name}.")
        if suffix == "test.index":
            (raw / file).write_text("".join(f"{i}\n" for i in range(n_all, n_all + n_test)))
        else:
            (raw / file).write_bytes(pickle.dumps(items[suffix], protocol=2))
    return trust_planetoid(raw) if trusted else raw


class Server:
    """An HTTP server on 127.0.0.1 serving a folder, in a thread.

    ``cut[name] = n`` makes ``/name`` announce its full ``Content-Length`` but close
    the connection after ``n`` bytes; ``trickle[name] = (n, seconds)`` sends it ``n`` bytes
    at a time, ``seconds`` apart. ``requests`` lists the paths asked for.
    """

    def __init__(self, folder: Path):
        self.folder, self.cut, self.trickle, self.requests = Path(folder), {}, {}, []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                name = self.path.lstrip("/")
                if name in server.cut:
                    data = (server.folder / name).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: server.cut[name]])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if name in server.trickle:
                    data, (piece, pause) = (server.folder / name).read_bytes(), server.trickle[name]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    try:
                        for start in range(0, len(data), piece):
                            self.wfile.write(data[start : start + piece])
                            self.wfile.flush()
                            time.sleep(pause)
                    except OSError:  # the client gave up
                        pass
                    self.close_connection = True
                    return
                super().do_GET()

        handler = functools.partial(Handler, directory=str(self.folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class Killed(BaseException):
    """Stands for the process being killed in the middle of writing a file."""


def cut_writes(monkeypatch) -> None:
    """Make the next ``torch.save`` to a file (also through PyG's ``fs.torch_save``) write
    half of its bytes and raise :class:`Killed`, as a run killed mid-write would."""
    real = torch.save

    def save(obj, path, *args, **kwargs):
        if not isinstance(path, (str, os.PathLike)):  # a buffer: PyG's fs.torch_save
            return real(obj, path, *args, **kwargs)
        buffer = io.BytesIO()
        real(obj, buffer)
        Path(path).write_bytes(buffer.getvalue()[: buffer.tell() // 2])
        raise Killed(str(path))

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(fs, "torch_save", save)


class FakeTokenizer:
    """Stands in for the MiniLM tokenizer: one id per word (its length)."""

    def encode_batch(self, texts, add_special_tokens=False):
        return [SimpleNamespace(ids=[len(w) for w in t.split()]) for t in texts]


def count_raw_checks(monkeypatch, reader) -> Counter:
    """Count, per path, the calls of ``resolve_inside`` made by the ``reader`` module and by
    processing (``multimodal_records``); the MiniLM tokenizer is replaced by
    :class:`FakeTokenizer`."""
    from hiergraph.datasets import multimodal_records, static_embeddings

    checked, real = Counter(), multimodal_records.resolve_inside

    def counting(root, path, entry):
        checked[Path(path)] += 1
        return real(root, path, entry)

    monkeypatch.setattr(reader, "resolve_inside", counting)
    monkeypatch.setattr(multimodal_records, "resolve_inside", counting)
    monkeypatch.setattr(static_embeddings, "minilm_tokenizer", FakeTokenizer)
    return checked


class SlowProcess:
    """Dataset mixin: ``process()`` logs its start and end to ``event_log`` and takes at
    least a second, so that concurrent first runs overlap."""

    event_log: str = ""

    def process(self) -> None:
        with open(self.event_log, "a") as f:
            f.write(f"start {os.getpid()} {time.time()}\n")
        time.sleep(1.0)
        super().process()
        with open(self.event_log, "a") as f:
            f.write(f"end {os.getpid()} {time.time()}\n")


def first_runs_in_two_processes(worker, args: tuple, log: Path) -> tuple[list, list[str]]:
    """Run ``worker(*args, log, barrier, queue)`` in two spawned processes that start
    together; returns what each put on the queue and the words of ``log``."""
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(*args, str(log), barrier, queue)) for _ in "ab"]
    for w in workers:
        w.start()
    results = [queue.get(timeout=300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    return results, log.read_text().split()
