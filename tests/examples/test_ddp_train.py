"""examples/ddp_train.py in one process with a tiny budget (``tests/test_distributed.py``
launches it under torchrun)."""


def test_single_process_run_trains_and_reports_every_epoch(load_example, capsys):
    ddp = load_example("ddp_train")
    args = ddp.parse_args(
        "--epochs 2 --num-trees 16 --tree-leaves 24 --hidden 8 --layers 1 --heads 2".split()
    )
    out = ddp.train(args)
    assert out["world_size"] == 1 and [r["epoch"] for r in out["history"]] == [0, 1]
    assert all(r["train_loss"] > 0 for r in out["history"])
    assert capsys.readouterr().out.count('"epoch"') == 2  # one JSON line per epoch
