"""``examples/hierarchical_lm.py`` on a tiny written stand-in for ``aclImdb_50k.tar.gz``."""

import io
import json
import tarfile

import pytest
import torch

REVIEWS = [
    "A fine film. I liked it a lot!<br /><br />The cast was good.",
    "Too long. The plot dragged on and on, and nothing happened at all.",
    "Great music, weak story. Still worth a look on a rainy day.",
    "I walked out. Never again.",
]


def _write_tar(path):
    with tarfile.open(path, "w:gz") as archive:
        for split in ("train", "test"):
            for i, text in enumerate(REVIEWS):
                data = text.encode()
                info = tarfile.TarInfo(f"{split}/pos/{i}_8.txt")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


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
    assert list((tmp_path / "cache").glob("reviews_4_400.json"))
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
