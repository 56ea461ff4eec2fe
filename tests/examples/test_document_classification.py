"""examples/document_classification.py: its budgets, and a run on a generated IMDB archive."""

import json

import pytest
import torch

from tests.datasets.test_documents import imdb_files, write_tar


@pytest.fixture
def dc(load_example):
    return load_example("document_classification")


def test_quick_budget_by_default_and_whole_splits_with_paper(dc):
    quick = dc.parse_args([])
    assert (quick.seeds, quick.epochs) == ([0], 3)
    assert (quick.train_size, quick.val_size, quick.test_size) == (2000, 500, 1000)
    paper = dc.parse_args(["--paper"])
    assert (paper.seeds, paper.epochs) == ([0, 1, 2], 3)
    assert (paper.train_size, paper.val_size, paper.test_size) == (None, None, None)
    assert dc.parse_args(["--train-size", "0"]).train_size is None  # 0: the whole split
    assert dc.parse_args(["--paper", "--epochs", "1"]).epochs == 1  # explicit options win


def quick_run(dc, tmp_path, monkeypatch, device: str, raw_dir_option: bool = False) -> dict:
    """The quick budget of a tiny HSA model on a generated IMDB archive, on ``device``; the
    archive's folder given by ``$HIERGRAPH_RAW`` or, with ``raw_dir_option``, ``--raw-dir``."""
    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    write_tar(tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files().items()})
    raw = ["--raw-dir", str(tmp_path)] if raw_dir_option else []
    if not raw_dir_option:
        monkeypatch.setenv("HIERGRAPH_RAW", str(tmp_path))
    return dc.main([
        "--dataset", "imdb", "--root", str(tmp_path / "imdb"), *raw, "--tokenizer", "simple",
        "--embedding", "learned", "--model", "hsa", "--hidden", "16", "--heads", "2",
        "--pos-channels", "8", "--mlp", "16", "--proj", "0", "--no-progress",
        "--device", device, "--json", str(tmp_path / "r.json"),
    ])  # fmt: skip


@pytest.mark.parametrize("raw_dir_option", [False, True], ids=["raw-env", "raw-dir-option"])
def test_quick_run_on_a_generated_archive(dc, tmp_path, monkeypatch, capsys, raw_dir_option):
    out = quick_run(dc, tmp_path, monkeypatch, "cpu", raw_dir_option)
    assert out["sizes"] == {"train": 18, "val": 2, "test": 8}  # the quick subsets hold them all
    (run,) = out["runs"]
    assert run["seed"] == 0 and len(run["history"]) == 3 and 0.0 <= run["test_acc"] <= 1.0
    assert out["torch_threads"] == 1  # one thread: this model's fastest
    config = json.loads((tmp_path / "r.json").read_text())["config"]
    assert (config["epochs"], config["device"]) == (3, "cpu")
    last = capsys.readouterr().out.strip().splitlines()[-1]  # one line for a reader
    accuracy = out["summary"]["test_acc"]["mean"]
    assert last.startswith(f"hsa on imdb: test accuracy {accuracy:.3f} (std 0.000 over 1 seed")
    assert last.endswith("3 epoch(s) on 18 training documents)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_run_trains_on_cuda(dc, tmp_path, monkeypatch):
    out = quick_run(dc, tmp_path, monkeypatch, "cuda")
    (run,) = out["runs"]
    assert len(run["history"]) == 3 and 0.0 <= run["test_acc"] <= 1.0
    assert json.loads((tmp_path / "r.json").read_text())["config"]["device"] == "cuda"
