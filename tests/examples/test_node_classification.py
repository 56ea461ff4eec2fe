"""examples/node_classification.py: the hybrid runs end to end on the PPI and ogbn fixtures and
on the real Cora and CiteSeer files (where present), with its budgets."""

import argparse
import json

import pytest
import torch

from tests.conftest import planetoid_raw
from tests.datasets.test_ogbn import needs_ogb, write_tiny_arxiv


@pytest.fixture
def nc(load_example):
    return load_example("node_classification")


def test_hybrid_on_synthetic_ppi_is_labelled_and_scored(nc, tmp_path):
    args = "--dataset ppi --model hsa_hybrid --seeds 0 --epochs 2 --max-family 8 --device cpu"
    out = nc.main(
        [*args.split(), "--synthetic-ppi", str(tmp_path), "--json", str(tmp_path / "r.json")]
    )
    assert out["dataset"] == "ppi (SYNTHETIC)" and out["metric"] == "micro-F1"
    assert 0.0 <= out["mean"] <= 1.0 and out["num_seeds"] == 1
    assert out["hierarchy_stats"]["family_max"] <= 8
    assert json.loads((tmp_path / "r.json").read_text())["ppi/hsa_hybrid[gat]"]["device"] == "cpu"


@needs_ogb
def test_hybrid_on_tiny_ogbn_fixture_uses_the_ogb_evaluator(nc, tmp_path):
    write_tiny_arxiv(tmp_path)
    args = "--dataset ogbn-arxiv --model hsa_hybrid --seeds 0 --epochs 2 --max-family 4".split()
    out = nc.main([*args, "--root", str(tmp_path)])
    assert out["metric"] == "accuracy (OGB)" and out["args"]["tree"] == "lp"
    assert out["runs"][0]["test"] in (0.0, 1 / 3, 2 / 3, 1.0)  # 3 test nodes


def test_gated_hybrid_starts_as_the_gat_model_and_then_departs(nc):
    # same seed: the attention layers get the same initial weights and, in training, the
    # same dropout masks; with the gate at tanh(0) = 0 the HSA branch adds nothing
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import stochastic_blockmodel_graph

    from hiergraph.transforms import GraphHierarchy

    torch.manual_seed(0)
    edge_index = stochastic_blockmodel_graph([12, 10], [[0.5, 0.05], [0.05, 0.5]])
    data = GraphHierarchy(max_family=4, pe_dim=4)(
        Data(x=torch.rand(22, 5), edge_index=edge_index, num_nodes=22)
    )
    args = argparse.Namespace(
        heads=2,
        pe_dim=4,
        attn_dropout=0.0,
        hsa_dropout=0.0,
        no_gate=False,
        kernel="edge",
        smooth=False,
        hubs=0,
        attention="gat",
        r=None,
    )
    outs = {}
    for name in ("gat", "hsa_hybrid"):
        torch.manual_seed(1)
        model = nc.build_model(name, 5, 3, args)
        torch.manual_seed(2)
        outs[name] = model(data.x, data.edge_index, data.hierarchy())  # training mode
    torch.testing.assert_close(outs["hsa_hybrid"], outs["gat"], rtol=0, atol=0)
    with torch.no_grad():
        model.layers[0].gate.fill_(1.0)
    model.eval()
    gated = model(data.x, data.edge_index, data.hierarchy())
    assert torch.isfinite(gated).all() and not torch.allclose(gated, outs["gat"])


def test_early_stopping_reads_test_at_best_validation_ties_by_loss(nc):
    # (val score, val loss) per epoch; epoch 3 ties epoch 2 on score with a lower loss
    script = iter([(0.5, 1.0), (0.7, 0.9), (0.7, 0.8), (0.7, 0.85), (0.6, 0.5), (0.9, 0.1)])
    epoch = {"n": 0}

    def train():
        epoch["n"] += 1

    args = argparse.Namespace(epochs=6, patience=2)
    run = nc.early_stopping(args, 0, train, lambda: next(script), lambda: 10.0 * epoch["n"])
    assert (run["best_epoch"], run["test"], run["val"], run["epochs"]) == (3, 30.0, 0.7, 5)


def test_resume_from_reuses_finished_seeds_with_the_same_settings(nc, tmp_path):
    first = tmp_path / "first.json"
    common = [
        "--dataset",
        "ppi",
        "--synthetic-ppi",
        str(tmp_path),
        "--model",
        "gcn",
        "--epochs",
        "2",
        "--name",
        "row",
    ]
    nc.main([*common, "--seeds", "0", "--json", str(first)])
    out = nc.main([*common, "--seeds", "0", "1", "--resume-from", str(first)])
    assert [r["seed"] for r in out["runs"]] == [0, 1]
    assert out["runs"][0]["resumed_from"] == str(first) and "resumed_from" not in out["runs"][1]
    with pytest.raises(ValueError, match="other settings.*epochs"):
        nc.main([*common[:-4], "--epochs", "3", "--name", "row", "--resume-from", str(first)])
    # files that hold no results end in one line (a JSONDecodeError or TypeError before)
    for text, match in (("not json", "unreadable"), ("[1, 2]", "has no row 'row' of results"),
                        ('{"row": 1}', "has no row 'row' of results")):  # fmt: skip
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(nc.OptionError, match=match):
            nc.main([*common, "--seeds", "0", "--resume-from", str(bad)])


def test_paper_budget_runs_ten_seeds_and_explicit_options_win(nc, tmp_path):
    args = "--dataset ppi --model gcn --paper --epochs 1".split()
    out = nc.main([*args, "--synthetic-ppi", str(tmp_path)])
    assert out["num_seeds"] == 10 and [r["seed"] for r in out["runs"]] == list(range(10))
    assert (out["args"]["epochs"], out["args"]["patience"]) == (1, 100)
    assert 1 <= out["threads"] <= 2  # torch's default, capped


@pytest.mark.parametrize("dataset", ["cora", "citeseer"])
def test_planetoid_datasets_run_the_hybrid_with_the_quick_budget(
    nc, tmp_path, dataset, no_env, no_network
):
    name = {"cora": "Cora", "citeseer": "CiteSeer"}[dataset]
    if planetoid_raw(name) is None:
        pytest.skip(f"real {name} raw files absent")
    raw = planetoid_raw(name)
    argv = ["--dataset", dataset, "--epochs", "2", "--root", str(tmp_path), "--raw-dir", str(raw)]
    out = nc.main(argv)  # the default model: the HSA hybrid
    assert out["model"] == "hsa_hybrid" and out["dataset"] == dataset and out["num_seeds"] == 1
    assert out["args"]["patience"] == 100 and out["hierarchy_stats"]["num_leaves"] > 2000
    assert 0.0 <= out["mean"] <= 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dataset", ["ppi", pytest.param("ogbn-arxiv", marks=needs_ogb), "cora"])
def test_hybrid_trains_on_cuda(nc, tmp_path, dataset, no_env, no_network):
    # the three data paths: batched graphs, one graph scored by OGB's evaluator, CSR features
    argv = ["--dataset", dataset, "--seeds", "0", "--epochs", "2", "--device", "cuda"]
    if dataset == "ppi":
        argv += ["--max-family", "8", "--synthetic-ppi", str(tmp_path)]
    elif dataset == "ogbn-arxiv":
        write_tiny_arxiv(tmp_path)
        argv += ["--max-family", "4", "--root", str(tmp_path)]
    elif planetoid_raw("Cora") is None:
        pytest.skip("real Cora raw files absent")
    else:
        argv += ["--root", str(tmp_path), "--raw-dir", str(planetoid_raw("Cora"))]
    out = nc.main(argv)  # the default model: the HSA hybrid
    assert out["device"] == "cuda" and out["args"]["device"] == "cuda"
    assert 0.0 <= out["mean"] <= 1.0 and out["num_seeds"] == 1


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["--model", "gcn", "--hubs", "4"], "--hubs applies to --model hsa_hybrid only"),
        (["--dataset", "cora", "--synthetic-ppi", "x"], "--synthetic-ppi applies with --dataset"),
        (["--model", "gat", "--hidden", "32"], "--hidden applies to --model gcn and gps_full"),
        (["--dataset", "ogbn-arxiv", "--raw-dir", "x"], "--raw-dir applies to the Planetoid"),
        (
            ["--dataset", "ppi", "--synthetic-ppi", "x", "--raw-dir", "y"],
            "--raw-dir applies without --synthetic-ppi only",
        ),
        (
            ["--dataset", "ppi", "--synthetic-ppi", "x", "--root", "y"],
            "--root applies without --synthetic-ppi only",
        ),
    ],
)
def test_options_that_would_be_ignored_are_refused(nc, capsys, argv, refused):
    with pytest.raises(SystemExit) as stop:
        nc.main(argv)
    assert stop.value.code == 2 and refused in capsys.readouterr().err


def test_ppi_takes_its_raw_files_from_raw_dir(nc, tmp_path):
    """The PPI loader takes ``raw_dir=`` (what the missing-data hint calls ``--raw-dir``);
    the script refused the option for PPI."""
    from hiergraph.datasets.planetoid import write_synthetic_ppi

    raw = write_synthetic_ppi(tmp_path / "raw", graphs=(2, 1, 1), nodes_per_graph=12)
    argv = ["--dataset", "ppi", "--model", "gcn", "--epochs", "1", "--device", "cpu"]
    out = nc.main([*argv, "--root", str(tmp_path / "root"), "--raw-dir", str(raw)])
    assert out["dataset"] == "ppi (SYNTHETIC)" and out["num_seeds"] == 1
