"""examples/node_classification.py: the hybrid runs end to end on the PPI and ogbn fixtures."""

import pytest

from tests.datasets.test_ogbn import needs_ogb, write_tiny_arxiv


@pytest.fixture
def nc(load_example):
    return load_example("node_classification")


def test_hybrid_on_synthetic_ppi_is_labelled_and_scored(nc, tmp_path):
    out = nc.main(
        ["--dataset", "ppi", "--synthetic-ppi", str(tmp_path), "--model", "hsa_hybrid",
         "--seeds", "0", "--epochs", "2", "--max-family", "8", "--json", str(tmp_path / "r.json")]
    )
    assert out["dataset"] == "ppi (SYNTHETIC)" and out["metric"] == "micro-F1"
    assert 0.0 <= out["mean"] <= 1.0 and out["num_seeds"] == 1
    assert out["hierarchy_stats"]["family_max"] <= 8
    assert (tmp_path / "r.json").exists()


@needs_ogb
def test_hybrid_on_tiny_ogbn_fixture_uses_the_ogb_evaluator(nc, tmp_path):
    write_tiny_arxiv(tmp_path)
    out = nc.main(
        ["--dataset", "ogbn-arxiv", "--root", str(tmp_path), "--model", "hsa_hybrid",
         "--seeds", "0", "--epochs", "2", "--max-family", "4"]
    )
    assert out["metric"] == "accuracy (OGB)" and out["args"]["tree"] == "lp"
    assert out["runs"][0]["test"] in (0.0, 1 / 3, 2 / 3, 1.0)  # 3 test nodes
