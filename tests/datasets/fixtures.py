"""Tiny generated raw files for the dataset tests (synthetic, never real data)."""

from __future__ import annotations

import functools
import http.server
import io
import pickle
import tarfile
import threading
from pathlib import Path

import numpy as np
import scipy.sparse as sp

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


def write_tiny_planetoid(raw: Path, name: str = "cora", seed: int = 0) -> Path:
    """A **synthetic** Planetoid in the official raw format: 40 training nodes, the 500
    validation nodes PyG assumes, 20 test nodes, 8 features, 3 classes, a ring graph."""
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
    return raw


class Server:
    """An HTTP server on 127.0.0.1 serving a folder, in a thread.

    ``cut[name] = n`` makes ``/name`` announce its full ``Content-Length`` but close
    the connection after ``n`` bytes. ``requests`` lists the paths asked for.
    """

    def __init__(self, folder: Path):
        self.folder, self.cut, self.requests = Path(folder), {}, []
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
