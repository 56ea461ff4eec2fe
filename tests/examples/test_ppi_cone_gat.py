"""examples/ppi_cone_gat.py runs on a generated SYNTHETIC PPI in PyG's raw layout."""

import pytest
import torch

from hiergraph.datasets import planetoid as hp


def test_ppi_example_runs_on_synthetic_fixture(no_env, no_network, load_example, tmp_path, capsys):
    ppi_cone_gat = load_example("ppi_cone_gat")
    raw = hp.write_synthetic_ppi(tmp_path / "raw", graphs=(4, 2, 2), nodes_per_graph=12)
    argv = ["--root", str(tmp_path), "--raw-dir", str(raw), "--epochs", "2", "--hidden", "8"]
    scores = ppi_cone_gat.main([*argv, "--attention", "umbral", "--device", "cpu"])
    assert len(scores) == 1 and 0.0 <= scores[0] <= 1.0
    printed = capsys.readouterr().out
    assert "SYNTHETIC PPI stand-in (not the real dataset) umbral" in printed
    assert "over 1 seed: " in printed  # (not "1 seeds")


def test_missing_files_point_to_the_synthetic_stand_in(no_env, no_network, load_example, tmp_path):
    ppi_cone_gat = load_example("ppi_cone_gat")
    with pytest.raises(FileNotFoundError, match="--synthetic <folder> runs on a generated"):
        ppi_cone_gat.main(["--root", str(tmp_path), "--device", "cpu"])


def test_quick_budget_by_default_and_the_papers_with_paper(load_example):
    ppi_cone_gat = load_example("ppi_cone_gat")
    quick = ppi_cone_gat.parse_args([])
    assert (quick.seeds, quick.epochs, quick.patience, quick.hidden) == (1, 5, 100, 256)
    paper = ppi_cone_gat.parse_args(["--paper"])
    assert (paper.seeds, paper.epochs, paper.patience) == (10, 200, 100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attention", ["gat", "dot", "penumbral", "umbral"])
def test_ppi_example_trains_on_cuda(no_env, no_network, load_example, tmp_path, attention):
    ppi_cone_gat = load_example("ppi_cone_gat")
    raw = hp.write_synthetic_ppi(tmp_path / "raw", graphs=(4, 2, 2), nodes_per_graph=12)
    argv = ["--root", str(tmp_path), "--raw-dir", str(raw), "--epochs", "2", "--hidden", "8"]
    scores = ppi_cone_gat.main([*argv, "--attention", attention, "--device", "cuda"])
    assert len(scores) == 1 and 0.0 <= scores[0] <= 1.0


def test_root_is_refused_with_the_synthetic_stand_in(load_example, capsys, tmp_path):
    """The stand-in is written and read in its own folder: ``--root`` would be ignored."""
    ppi_cone_gat = load_example("ppi_cone_gat")
    with pytest.raises(SystemExit) as stop:
        ppi_cone_gat.main(["--synthetic", str(tmp_path), "--root", str(tmp_path / "other")])
    assert stop.value.code == 2
    assert "--root applies without --synthetic only" in capsys.readouterr().err
