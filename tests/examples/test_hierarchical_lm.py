"""``examples/hierarchical_lm.py`` on a tiny written stand-in for ``aclImdb_50k.tar.gz``."""

import hashlib
import io
import json
import tarfile

import pytest
import torch

from hiergraph.datasets.download import OFFLINE_ENV, REMOTE_FILES, RemoteFile
from tests.datasets.fixtures import Server

REVIEWS = [
    "A fine film. I liked it a lot!<br /><br />The cast was good.",
    "Too long. The plot dragged on and on, and nothing happened at all.",
    "Great music, weak story. Still worth a look on a rainy day.",
    "I walked out. Never again.",
]


def _write_tar(path, prefix=""):
    """The repacked layout (``train/pos/*.txt``), or with ``prefix="aclImdb/"`` the official
    one, with its unlabelled reviews and url lists beside the labelled ones."""
    with tarfile.open(path, "w:gz") as archive:
        files = {f"{split}/pos/{i}_8.txt": text for split in ("train", "test")
                 for i, text in enumerate(REVIEWS)}  # fmt: skip
        if prefix:
            files |= {"train/unsup/0_0.txt": "not labelled", "train/urls_pos.txt": "http://x"}
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_reads_the_official_and_the_repacked_layouts(load_example, tmp_path):
    lm = load_example("hierarchical_lm")
    for prefix in ("", "aclImdb/"):
        tar = tmp_path / f"{prefix.strip('/') or 'repacked'}.tar.gz"
        _write_tar(tar, prefix)
        texts = lm.read_reviews(tar, 3, 10, tmp_path / "cache")
        assert texts == {"train": REVIEWS[:3], "test": REVIEWS}


def test_finds_the_imdb_loaders_archive_else_downloads_it_there(
    load_example, tmp_path, monkeypatch
):
    """Without ``--tar`` the archive is looked up where the IMDB loader keeps it (``<data
    root>/IMDB/raw``), and downloaded there (checksum checked) when it is nowhere; offline,
    the error names the official URL."""
    lm = load_example("hierarchical_lm")
    for var in ("HIERGRAPH_RAW", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("HIERGRAPH_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    raw = tmp_path / "data" / "IMDB" / "raw"
    assert lm.default_tar() == raw / "aclImdb_v1.tar.gz"  # nothing found: the download's place
    monkeypatch.setenv(OFFLINE_ENV, "1")
    with pytest.raises(FileNotFoundError, match="https://ai.stanford.edu/.*aclImdb_v1.tar.gz"):
        lm.read_reviews(lm.default_tar(), 3, 4, tmp_path / "cache")
    (tmp_path / "www").mkdir()
    _write_tar(tmp_path / "www" / "aclImdb_v1.tar.gz", "aclImdb/")
    sha256 = hashlib.sha256((tmp_path / "www" / "aclImdb_v1.tar.gz").read_bytes()).hexdigest()
    monkeypatch.delenv(OFFLINE_ENV)
    with Server(tmp_path / "www") as server:
        url = f"{server.url}/aclImdb_v1.tar.gz"
        monkeypatch.setitem(REMOTE_FILES, "IMDB", RemoteFile("aclImdb_v1.tar.gz", (url,), sha256))
        texts = lm.read_reviews(lm.default_tar(), 3, 4, tmp_path / "cache")
    assert texts == {"train": REVIEWS[:3], "test": REVIEWS}
    assert (raw / "aclImdb_v1.tar.gz").exists() and lm.default_tar() == raw / "aclImdb_v1.tar.gz"
    _write_tar(tmp_path / "aclImdb_50k.tar.gz")  # the loader's folder comes before this one
    assert lm.default_tar() == raw / "aclImdb_v1.tar.gz"
    monkeypatch.setenv("HIERGRAPH_RAW", str(tmp_path))  # and $HIERGRAPH_RAW before both
    assert lm.default_tar() == tmp_path / "aclImdb_50k.tar.gz"


def test_an_archive_without_labelled_reviews_is_refused_and_not_cached(load_example, tmp_path):
    """(It was read as no reviews, cached, and every later run failed in batching.)"""
    lm = load_example("hierarchical_lm")
    with tarfile.open(tmp_path / "other.tar.gz", "w:gz") as archive:
        info = tarfile.TarInfo("docs/readme.txt")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="no labelled reviews for train, test"):
        lm.read_reviews(tmp_path / "other.tar.gz", 3, 3, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_tree_events_depend_only_on_earlier_bytes(load_example):
    lm = load_example("hierarchical_lm")
    data = REVIEWS[0].replace("<br />", "\n").encode()
    events = [lm.next_event(data, i) for i in range(len(data))]
    assert events == [lm.next_event(data[: i + 1], i) for i in range(len(data))]
    assert events[0] == (0, 2) and events[data.index(b"I")] == (2, 2)  # a new sentence
    assert events[data.index(b"fine")] == (1, 1)  # a new word


def test_smoke_run(load_example, tmp_path):
    lm = load_example("hierarchical_lm")
    _write_tar(tmp_path / "reviews.tar.gz")
    out = tmp_path / "lm.json"
    lm.main([
        "--tar", str(tmp_path / "reviews.tar.gz"), "--cache-dir", str(tmp_path / "cache"),
        "--out", str(out), "--cpu-seconds", "0.3", "--seq-len", "32", "--batch-size", "2",
        "--channels", "16", "--layers", "1", "--heads", "2", "--train-reviews", "4",
        "--eval-chunks", "2", "--sample-bytes", "4", "--device", "cpu",
    ])  # fmt: skip
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"hsa", "flat"}
    assert results["hsa"]["parameters"] == results["flat"]["parameters"]
    for row in results.values():
        assert row["train_steps"] >= 1 and 0 < row["test_bits_per_byte"] < 20
        assert row["cache_vs_full_pass_max_logit_diff"] < 1e-4
    assert out.with_suffix(".png").exists()
    assert list((tmp_path / "cache").glob("reviews_reviews_4_400.json"))
    args = json.loads(out.read_text())["meta"]["args"]  # no machine-specific paths recorded
    assert args["tar"] == "$HIERGRAPH_RAW/reviews.tar.gz" and args["out"] == "lm.json"
    assert not any(str(v).startswith("/") for v in args.values())
    assert args["device"] == "cpu"


def _tiny_run(tmp_path) -> list[str]:
    """Arguments of the smallest run (0.1 CPU-seconds per model), on the written stand-in."""
    _write_tar(tmp_path / "reviews.tar.gz")
    return [
        "--tar", str(tmp_path / "reviews.tar.gz"), "--cache-dir", str(tmp_path / "cache"),
        "--cpu-seconds", "0.1", "--seq-len", "32", "--batch-size", "2", "--channels", "8",
        "--layers", "1", "--heads", "2", "--train-reviews", "4", "--eval-chunks", "1",
        "--sample-bytes", "2",
    ]  # fmt: skip


def test_without_out_nothing_is_written(load_example, tmp_path):
    lm = load_example("hierarchical_lm")
    result = lm.main(_tiny_run(tmp_path))
    assert set(result["results"]) == {"hsa", "flat"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "reviews.tar.gz"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_hierarchical_lm_runs_on_cuda(load_example, tmp_path):
    lm = load_example("hierarchical_lm")
    result = lm.main([*_tiny_run(tmp_path), "--device", "cuda"])
    assert result["meta"]["args"]["device"] == "cuda"
    for row in result["results"].values():
        assert row["train_steps"] >= 1 and 0 < row["test_bits_per_byte"] < 20
        assert row["cache_vs_full_pass_max_logit_diff"] < 1e-4


def test_sizes_the_library_refuses_end_the_script_before_the_reviews_are_read(
    load_example, tmp_path
):
    """The models are built first: the run ends with one line, not after reading the data
    (here there is none)."""
    lm = load_example("hierarchical_lm")
    argv = ["--tar", str(tmp_path / "absent.tar.gz"), "--channels", "8", "--heads", "3"]
    with pytest.raises(SystemExit) as stop:
        lm.run(lambda: lm.main([*argv, "--cache-dir", str(tmp_path), "--device", "cpu"]))
    assert stop.value.code == "error: heads=3 must divide channels=8"


def test_tar_may_name_the_folder_and_anything_else_ends_in_one_line(load_example, tmp_path):
    """``--tar`` takes the folder holding the archive, as ``$HIERGRAPH_RAW`` does; a folder
    without one, or a file that is no archive, ends the script with one line (an
    ``IsADirectoryError`` or a ``tarfile.ReadError`` traceback before)."""
    lm = load_example("hierarchical_lm")
    _write_tar(tmp_path / "aclImdb_50k.tar.gz")
    assert lm.tar_option(str(tmp_path)) == tmp_path / "aclImdb_50k.tar.gz"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as stop:
        lm.main(["--tar", str(empty)])
    assert stop.value.code == 2  # argparse's usage error, naming the archives looked for
    (tmp_path / "not.tar.gz").write_text("plain text")
    with pytest.raises(SystemExit) as stop:
        argv = ["--tar", str(tmp_path / "not.tar.gz"), "--cache-dir", str(tmp_path / "c")]
        lm.run(lambda: lm.main([*argv, "--device", "cpu"]))
    assert str(stop.value.code).startswith(f"error: {tmp_path / 'not.tar.gz'} is not a .tar.gz")
