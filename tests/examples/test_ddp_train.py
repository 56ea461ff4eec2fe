"""examples/ddp_train.py in one process with a tiny budget (``tests/test_distributed.py``
launches it under torchrun)."""

import pytest

TINY = "--num-trees 16 --tree-leaves 24 --hidden 8 --layers 1 --heads 2".split()


def test_single_process_run_trains_and_reports_every_epoch(load_example, capsys):
    ddp = load_example("ddp_train")
    args = ddp.parse_args([*TINY, "--epochs", "2"])
    out = ddp.train(args)
    assert out["world_size"] == 1 and [r["epoch"] for r in out["history"]] == [0, 1]
    assert all(r["train_loss"] > 0 for r in out["history"])
    assert capsys.readouterr().out.count('"epoch"') == 2  # one JSON line per epoch


def test_sizes_that_leave_no_step_are_refused(load_example, capsys):
    """16 trees on one process make no batch of 32: the epochs reported a train loss of 0.0
    after 0 steps."""
    ddp = load_example("ddp_train")
    with pytest.raises(ddp.OptionError, match="gets 16 training trees, less than one batch"):
        ddp.train(ddp.parse_args([*TINY, "--batch-size", "32"]))
    assert '"train_loss"' not in capsys.readouterr().out


def test_resuming_a_finished_checkpoint_says_so(load_example, tmp_path, capsys):
    """A checkpoint with all ``--epochs`` trains nothing and says so (on stderr: stdout holds
    the records); one past them is refused. Both passed silently."""
    ddp = load_example("ddp_train")
    checkpoint = ["--checkpoint", str(tmp_path / "run" / "ddp.pt")]  # its folder made
    ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "2"]))
    capsys.readouterr()
    again = ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "2", "--resume"]))
    assert again["history"] == []
    shown = capsys.readouterr()
    assert shown.out == "" and "has trained all --epochs 2 epochs: nothing to train" in shown.err
    with pytest.raises(ddp.OptionError, match="has trained 2 epochs, more than --epochs 1"):
        ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "1", "--resume"]))
    wider = [*TINY]  # another model: a checkpoint of it ends in one line, not a traceback
    wider[wider.index("--hidden") + 1] = "16"
    with pytest.raises(ddp.OptionError, match="holds the weights of another model"):
        ddp.train(ddp.parse_args([*wider, *checkpoint, "--epochs", "3", "--resume"]))


def test_resuming_keeps_the_checkpoints_learning_rate_unless_lr_is_given(
    load_example, tmp_path, capsys
):
    """(``--lr`` was silently replaced by the checkpoint's on ``--resume``.)"""
    import torch

    ddp = load_example("ddp_train")
    checkpoint = ["--checkpoint", str(tmp_path / "ddp.pt")]
    ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "1", "--lr", "0.01"]))

    def lr_after(epochs, *options):
        ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", epochs, "--resume", *options]))
        saved = torch.load(tmp_path / "ddp.pt", weights_only=True)
        return saved["optimizer"]["param_groups"][0]["lr"]

    capsys.readouterr()
    assert lr_after("2") == 0.01 and "replaces" not in capsys.readouterr().err
    assert lr_after("3", "--lr", "0.001") == 0.001
    assert "--lr 0.001 replaces the checkpoint's 0.01" in capsys.readouterr().err
    assert ddp.parse_args([]).lr is None  # a fresh run: DEFAULT_LR


@pytest.mark.parametrize("state", [{}, {"epoch": "1", "step": 4}], ids=["none", "a string"])
def test_a_checkpoint_without_this_scripts_epoch_and_step_is_refused(load_example, tmp_path, state):
    """(A checkpoint of save_checkpoint without them ended in a KeyError or TypeError.)"""
    import torch

    ddp = load_example("ddp_train")
    checkpoint = ["--checkpoint", str(tmp_path / "ddp.pt")]
    ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "1"]))
    saved = torch.load(tmp_path / "ddp.pt", weights_only=True)
    kept = {key: saved[key] for key in ("model", "optimizer")}  # the weights fit
    torch.save({**kept, **state}, tmp_path / "ddp.pt")
    with pytest.raises(ddp.OptionError, match="records no epoch and step of this script"):
        ddp.train(ddp.parse_args([*TINY, *checkpoint, "--epochs", "2", "--resume"]))


def test_each_task_has_its_own_default_epochs(load_example):
    """(3 epochs of the GCN on Cora ended at 0.32 test accuracy, which reads as broken.)"""
    ddp = load_example("ddp_train")
    assert ddp.parse_args([]).epochs == 3
    assert ddp.parse_args(["--task", "node"]).epochs == 100
    assert ddp.parse_args(["--task", "node", "--epochs", "2"]).epochs == 2
