"""examples/cora_cone_gat.py on the real Cora and CiteSeer raw files (skipped where they are
absent), its budgets, and its early-stopping rules."""

import json

import pytest
import torch

from tests.conftest import needs_planetoid, planetoid_raw


@needs_planetoid("Cora")
def test_cora_example_smoke(no_env, no_network, load_example, tmp_path, capsys):
    cora_cone_gat = load_example("cora_cone_gat")

    argv = ["--root", str(tmp_path), "--raw-dir", str(planetoid_raw("Cora")), "--epochs", "2"]
    argv += ["--device", "cpu"]
    out_json = tmp_path / "acc.json"
    results = cora_cone_gat.main(
        [*argv, "--seeds", "1", "--attention", "dot", "umbral", "--json", str(out_json)]
    )
    assert sorted(results) == ["dot", "umbral"]
    assert all(len(accs) == 1 and all(0.0 <= a <= 1.0 for a in accs) for accs in results.values())
    assert "±" in capsys.readouterr().out
    cora_cone_gat.main(
        [*argv, "--seeds", "1", "--attention", "penumbral", "--gamma", "2", "--json", str(out_json)]
    )  # rows merge into the same file
    rows = json.loads(out_json.read_text())["rows"]
    assert sorted(rows) == ["dot", "penumbral[gamma=2]", "umbral"]
    assert rows["umbral"]["budget"] == {"max_epochs": 2, "patience": 100, "stop_at_final": False}
    assert rows["umbral"]["final_model"]["epoch"] == [2]  # the budget ran out first
    assert rows["penumbral[gamma=2]"]["cone_options"]["gamma"] == 2.0
    assert {row["device"] for row in rows.values()} == {"cpu"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_planetoid("Cora")
def test_cora_example_trains_every_attention_on_cuda(no_env, no_network, load_example, tmp_path):
    cora_cone_gat = load_example("cora_cone_gat")
    out_json = tmp_path / "acc.json"
    argv = ["--root", str(tmp_path), "--raw-dir", str(planetoid_raw("Cora")), "--epochs", "2"]
    argv += ["--seeds", "1", "--device", "cuda", "--json", str(out_json)]
    results = cora_cone_gat.main([*argv, "--attention", *cora_cone_gat.ATTENTIONS])
    assert sorted(results) == sorted(cora_cone_gat.ATTENTIONS)
    assert all(len(accs) == 1 and 0.0 <= accs[0] <= 1.0 for accs in results.values())
    rows = json.loads(out_json.read_text())["rows"]
    assert {row["device"] for row in rows.values()} == {"cuda"}


@needs_planetoid("Cora")
def test_cut_run_keeps_its_finished_seeds(no_env, no_network, load_example, tmp_path, monkeypatch):
    cora_cone_gat = load_example("cora_cone_gat")
    run_seed, calls = cora_cone_gat.run_seed, []

    def cut_after_first(data, attention, seed, args):
        calls.append(seed)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return run_seed(data, attention, seed, args)

    monkeypatch.setattr(cora_cone_gat, "run_seed", cut_after_first)
    out_json = tmp_path / "acc.json"
    argv = ["--root", str(tmp_path), "--raw-dir", str(planetoid_raw("Cora")), "--epochs", "2"]
    with pytest.raises(KeyboardInterrupt):
        cora_cone_gat.main([*argv, "--seeds", "3", "--attention", "dot", "--json", str(out_json)])
    row = json.loads(out_json.read_text())["rows"]["dot"]
    assert row["seeds"] == [0] and len(row["test_accuracy"]) == 1


def test_quick_budget_by_default_and_the_papers_with_paper(load_example):
    cora_cone_gat = load_example("cora_cone_gat")
    quick = cora_cone_gat.parse_args([])
    assert (quick.seeds, quick.epochs, quick.patience, quick.dataset) == (2, 300, 100, "Cora")
    paper = cora_cone_gat.parse_args(["--paper"])
    assert (paper.seeds, paper.epochs, paper.patience) == (10, 10000, 1000)
    mixed = cora_cone_gat.parse_args(["--paper", "--epochs", "5"])  # explicit options win
    assert (mixed.seeds, mixed.epochs, mixed.patience) == (10, 5, 1000)


@needs_planetoid("CiteSeer")
def test_citeseer_runs_and_is_keyed_by_dataset(no_env, no_network, load_example, tmp_path):
    cora_cone_gat = load_example("cora_cone_gat")
    raw = planetoid_raw("CiteSeer")
    out_json = tmp_path / "acc.json"
    argv = ["--dataset", "CiteSeer", "--root", str(tmp_path), "--raw-dir", str(raw)]
    results = cora_cone_gat.main(
        [*argv, "--epochs", "2", "--seeds", "1", "--attention", "gat", "--json", str(out_json)]
    )
    assert list(results) == ["citeseer/gat"] and 0.0 <= results["citeseer/gat"][0] <= 1.0
    row = json.loads(out_json.read_text())["rows"]["citeseer/gat"]
    assert row["dataset"] == "CiteSeer" and row["threads"] >= 1


def _scripted(cora_cone_gat, history, epochs, patience, **kwargs):
    """Run the early-stopping loop on a scripted ``(val score, val loss)`` history; the test
    score read at epoch ``e`` is ``10 e``."""
    script, epoch = iter(history), {"n": 0}

    def train():
        epoch["n"] += 1

    return cora_cone_gat.train_with_early_stopping(
        epochs, patience, train, lambda: next(script), lambda: 10.0 * epoch["n"], **kwargs
    )


def test_early_stopping_also_reads_the_papers_final_model(load_example):
    cora_cone_gat = load_example("cora_cone_gat")
    # epoch 3 ties epoch 2 with a lower loss: a new best here, no gain for the paper's rule,
    # whose patience (2) runs out at epoch 4; ours runs out at epoch 5
    history = [(0.5, 1.0), (0.7, 0.9), (0.7, 0.8), (0.7, 0.85), (0.6, 0.5), (0.9, 0.1)]
    run = _scripted(cora_cone_gat, history, epochs=6, patience=2)
    assert (run["best_epoch"], run["test"], run["epochs"]) == (3, 30.0, 5)
    assert (run["final_epoch"], run["test_final"]) == (4, 40.0)
    run = _scripted(cora_cone_gat, history, epochs=6, patience=2, stop_at_final=True)
    assert (run["best_epoch"], run["test"], run["epochs"]) == (3, 30.0, 4)
    assert (run["final_epoch"], run["test_final"]) == (4, 40.0)
    # a gain after the paper's stop does not move its final model
    history = [(0.5, 1.0), (0.5, 0.9), (0.5, 0.95), (0.9, 0.1)]
    run = _scripted(cora_cone_gat, history, epochs=4, patience=2)
    assert (run["best_epoch"], run["test"], run["epochs"]) == (4, 40.0, 4)
    assert (run["final_epoch"], run["test_final"]) == (3, 30.0)
    # the epoch budget ends first: the last model is the final one
    run = _scripted(cora_cone_gat, [(0.5, 1.0), (0.6, 0.9)], epochs=2, patience=5)
    assert (run["final_epoch"], run["test_final"]) == (2, 20.0)
