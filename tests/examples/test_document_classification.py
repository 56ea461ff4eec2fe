"""examples/document_classification.py: its budgets, and a run on a generated IMDB archive."""

import json

import pytest

from tests.datasets.test_documents import imdb_files, write_tar


@pytest.fixture
def dc(load_example):
    return load_example("document_classification")


def test_quick_budget_by_default_and_whole_splits_with_paper(dc):
    quick = dc.parse_args([])
    assert (quick.seeds, quick.epochs) == ([0], 1)
    assert (quick.train_size, quick.val_size, quick.test_size) == (2000, 500, 1000)
    paper = dc.parse_args(["--paper"])
    assert (paper.seeds, paper.epochs) == ([0, 1, 2], 3)
    assert (paper.train_size, paper.val_size, paper.test_size) == (None, None, None)
    assert dc.parse_args(["--train-size", "0"]).train_size is None  # 0: the whole split
    assert dc.parse_args(["--paper", "--epochs", "1"]).epochs == 1  # explicit options win


def test_quick_run_on_a_generated_archive(dc, tmp_path, monkeypatch):
    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)
    write_tar(tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files().items()})
    monkeypatch.setenv("HIERGRAPH_RAW", str(tmp_path))
    out = dc.main([
        "--dataset", "imdb", "--root", str(tmp_path / "imdb"), "--tokenizer", "simple",
        "--embedding", "learned", "--model", "hsa", "--hidden", "16", "--heads", "2",
        "--pos-channels", "8", "--mlp", "16", "--proj", "0", "--no-progress",
        "--json", str(tmp_path / "r.json"),
    ])  # fmt: skip
    assert out["sizes"] == {"train": 18, "val": 2, "test": 8}  # the quick subsets hold them all
    (run,) = out["runs"]
    assert run["seed"] == 0 and len(run["history"]) == 1 and 0.0 <= run["test_acc"] <= 1.0
    assert out["torch_threads"] == 1  # one thread: this model's fastest
    assert json.loads((tmp_path / "r.json").read_text())["config"]["epochs"] == 1
