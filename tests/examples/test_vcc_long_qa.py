"""examples/vcc_long_qa.py: the synthetic haystack is what it claims, and all three models run."""

import json

import pytest
import torch


@pytest.fixture
def qa(load_example):
    return load_example("vcc_long_qa")


def _args(*extra):
    base = ["--length", "64", "--budget", "0.5", "--eval-batches", "2", "--batch-size", "2"]
    return [*base, "--min-length", "32", "--block-size", "4", "--refined", "2", *extra]


def test_haystack_plants_the_asked_fact_once(qa):
    class A:  # the example's defaults for the vocabulary
        keys, values, fillers, distractors = 8, 8, 64, 3

    tokens, labels = qa.make_batch(5, 200, A, torch.Generator().manual_seed(0))
    facts = A.fillers + A.keys * A.values
    for row, label in zip(tokens, labels, strict=True):
        asked = int(row[0]) - facts  # the question token names a key
        assert 0 <= asked < A.keys
        planted = row[1:][(row[1:] >= A.fillers) & (row[1:] < facts)] - A.fillers
        assert len(planted) == 1 + A.distractors  # distinct keys, none overwritten
        answer = planted[planted // A.values == asked]
        assert answer.tolist() == [asked * A.values + int(label)]


def test_full_vcc_and_truncation_train_and_report(qa, tmp_path, capsys):
    out = tmp_path / "qa.json"
    results = qa.main(_args("--json", str(out), "--threads", "1", "--device", "cpu"))
    assert [r["model"] for r in results] == ["vcc", "full", "truncate"]
    for r in results:
        assert r["steps"] >= 1 and 0.0 <= r["accuracy"] <= 1.0 and r["synthetic"]
        assert r["length"] == 64 and r["reached_length"] in (32, 64)
    # a model evaluated past the length it trained on is flagged
    short = [r["model"] for r in results if r["reached_length"] < 64]
    printed = capsys.readouterr().out
    assert all(
        f"note: {m} trained up to 32 tokens and was evaluated at 64" in printed for m in short
    )
    assert printed.count("note:") == len(short)
    assert json.loads(out.read_text())["args"]["device"] == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_vcc_long_qa_runs_on_cuda(qa):
    # a local layer too: its window mask is built next to the tokens
    results = qa.main(_args("--device", "cuda", "--local-layers", "1", "--local-size", "16"))
    assert [r["model"] for r in results] == ["vcc", "full", "truncate"]
    for r in results:
        assert r["steps"] >= 1 and 0.0 <= r["accuracy"] <= 1.0


def test_rejects_more_facts_than_keys(qa):
    with pytest.raises(SystemExit):
        qa.main(_args("--distractors", "8"))


@pytest.mark.parametrize("value", ["nan", "5", "-1"])
def test_the_advance_threshold_is_an_accuracy(qa, value):
    """(NaN or 5 froze the curriculum at its first length, noted only after training.)"""
    with pytest.raises(SystemExit) as stop:
        qa.main(_args("--advance-at", value))
    assert stop.value.code == 2  # argparse's usage error


def test_a_tiny_budget_still_trains_one_step(qa):
    """A budget shorter than the first step ended in an UnboundLocalError (no loss)."""
    results = qa.main(_args("--models", "full", "--budget", "1e-9", "--device", "cpu"))
    assert results[0]["steps"] == 1 and results[0]["last_loss"] > 0


def test_sizes_the_library_refuses_end_the_script_before_training(qa, monkeypatch):
    monkeypatch.setattr(qa, "train", None)  # never reached
    with pytest.raises(SystemExit) as stop:
        qa.run(lambda: qa.main(_args("--heads", "3")))
    assert stop.value.code == (
        "error: built-in layers need embed_dim divisible by num_heads, got embed_dim=64, "
        "num_heads=3"
    )
