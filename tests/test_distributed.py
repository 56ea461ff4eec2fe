"""Data-parallel training: 2 gloo processes equal one process on the union of their shards.

The end-to-end test launches ``examples/ddp_train.py`` with ``torchrun`` on
loopback (2 processes, gloo, float64) and compares its final parameters with a
single process that sees the union of the shards (twice the per-rank batch),
trained for one epoch, checkpointed, and resumed for the second: DDP's gradient
averaging, the sharding of ``DistributedSampler`` and checkpoint/resume are all
checked by one equality.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hiergraph.distributed import (
    DistributedContext,
    init_distributed,
    load_checkpoint,
    main_process_first,
    save_checkpoint,
    seed_everything,
    unwrap,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "ddp_train.py"
# a tiny float64 HTE run: 16 synthetic trees, 2 steps per epoch and rank
TINY = [
    *("--num-trees 16 --tree-leaves 24 --hidden 8 --layers 1 --heads 2".split()),
    *("--epochs 2 --dtype float64 --backend gloo --seed 3".split()),
]
# a hang guard, not a speed target: on a contended 2-core VM the two gloo processes took > 110 s
TIMEOUT_S = 300


def run(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend")
def test_two_gloo_processes_equal_one_process_on_the_union(tmp_path, monkeypatch):
    ddp, single = tmp_path / "ddp.pt", tmp_path / "single.pt"
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    run([*torchrun, str(SCRIPT), *TINY, "--batch-size", "4", "--checkpoint", str(ddp)], tmp_path)
    union = [str(SCRIPT), *TINY, "--batch-size", "8", "--checkpoint", str(single)]
    run([*union, "--epochs", "1"], tmp_path)
    run([*union, "--resume"], tmp_path)

    a = torch.load(ddp, weights_only=False)
    b = torch.load(single, weights_only=False)
    assert a["epoch"] == b["epoch"] == 1
    assert a["step"] == b["step"] == 4  # 2 epochs x 2 steps, per rank and single
    for name, value in a["model"].items():
        torch.testing.assert_close(value, b["model"][name], rtol=1e-9, atol=1e-11, msg=name)
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    # and training did move them away from the (seeded) initialisation
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the examples' shared helpers
    init = initial_state()
    assert init.keys() == a["model"].keys()
    assert sum(not torch.equal(init[k], a["model"][k]) for k in init) > len(init) // 2


def initial_state() -> dict:
    """The script's model right after its seeded initialisation (``--seed 3``)."""
    spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seed_everything(3)
    return module.TreeClassifier(8, 8, 4, 1, 2).double().state_dict()


def test_single_process_context_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = init_distributed("gloo")
    assert ctx == DistributedContext(0, 1, 0, torch.device("cpu"), None)
    assert ctx.is_main and not ctx.distributed
    with main_process_first(ctx):  # no process group: a plain block
        pass


@pytest.mark.parametrize("torchrun", [False, True], ids=["single", "torchrun"])
def test_with_cuda_each_process_takes_its_local_gpu_and_nccl(monkeypatch, torchrun):
    """Where CUDA is available the default backend is NCCL: the process binds the GPU of
    its ``LOCAL_RANK`` before any collective, and hands it to the process group
    (``device_id``); CUDA itself is stubbed, so this runs without a GPU."""
    bound, groups = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: groups.append((a, kw)))
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "1")
    if torchrun:
        monkeypatch.setenv("WORLD_SIZE", "4")
    else:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed(timeout_s=7)
    gpu = torch.device("cuda", 1)
    assert bound == [gpu]
    if not torchrun:
        assert ctx == DistributedContext(0, 1, 1, gpu, None) and groups == []  # its GPU
        return
    assert ctx == DistributedContext(3, 4, 1, gpu, "nccl")
    [(args, kwargs)] = groups
    assert args == ("nccl",) and kwargs["device_id"] == gpu
    assert kwargs["timeout"].total_seconds() == 7


def test_bad_backend():
    with pytest.raises(ValueError, match="backend must be"):
        init_distributed("mpi-ish")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            init_distributed("nccl")


def test_seed_everything_is_a_function_of_seed_epoch_rank():
    def draw(*key):
        seed_everything(*key)
        return torch.rand(3)

    assert torch.equal(draw(1, 2, 0), draw(1, 2, 0))
    assert not torch.equal(draw(1, 2, 0), draw(1, 2, 1))
    assert not torch.equal(draw(1, 2, 0), draw(1, 3, 0))


def test_checkpoint_without_context_follows_the_process_group(tmp_path, monkeypatch):
    # under DDP without a context, only rank 0 writes, and every rank waits at the barrier
    barriers = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(1))
    model = nn.Linear(2, 2)
    for rank, written in ((1, False), (0, True)):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        save_checkpoint(tmp_path / f"rank{rank}.pt", model)
        assert (tmp_path / f"rank{rank}.pt").exists() == written
    assert len(barriers) == 2


def test_checkpoint_round_trip(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = tmp_path / "sub" / "c.pt"
    save_checkpoint(path, model, opt, epoch=5, step=7)
    assert [p.name for p in path.parent.iterdir()] == ["c.pt"]  # no temporary left behind

    other = nn.Linear(3, 2)
    other_opt = torch.optim.Adam(other.parameters())
    state = load_checkpoint(path, other, other_opt)
    assert state == {"epoch": 5, "step": 7}
    assert torch.equal(other.weight, model.weight)
    assert other_opt.state_dict()["state"][0]["step"] == 1

    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", other)
    save_checkpoint(path, model)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(path, other, other_opt)
    for wrong in (nn.Linear(4, 2), nn.Sequential(nn.Linear(3, 2))):  # sizes, layers
        with pytest.raises(ValueError, match="holds the weights of another model"):
            load_checkpoint(path, wrong)  # (torch's RuntimeError before)


def test_unwrap():
    inner = nn.Linear(2, 2)
    wrapper = nn.Module()
    wrapper._orig_mod = inner  # what torch.compile's OptimizedModule holds
    assert unwrap(wrapper) is inner
    assert unwrap(inner) is inner


class _RunsACommand:
    """Pickles to a call of ``os.system``: what a malicious checkpoint holds."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_load_checkpoint_refuses_code_in_the_file(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": _RunsACommand(f"touch '{marker}'"), "epoch": 0}, path)
    with pytest.raises(ValueError, match="refusing to load") as info:
        load_checkpoint(path, nn.Linear(3, 2))
    assert str(path) in str(info.value)
    assert "system" in str(info.value)  # names what was refused
    assert not marker.exists()

    # the same with the object hidden in the extra state
    model = nn.Linear(3, 2)
    torch.save({"model": model.state_dict(), "extra": [_RunsACommand(f"touch '{marker}'")]}, path)
    with pytest.raises(ValueError, match="refusing to load"):
        load_checkpoint(path, model)
    assert not marker.exists()


def test_load_checkpoint_plain_state_and_non_checkpoints(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = tmp_path / "c.pt"
    state = dict(epoch=2, step=9, best=0.5, tag="run-a", history=[{"loss": 1.0}], pair=(1, 2))
    save_checkpoint(path, model, opt, **state)
    other = nn.Linear(3, 2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    assert load_checkpoint(path, other, other_opt) == state
    assert torch.equal(other.bias, model.bias)
    assert torch.equal(
        other_opt.state_dict()["state"][0]["momentum_buffer"],
        opt.state_dict()["state"][0]["momentum_buffer"],
    )
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_checkpoint(path, other)


def test_a_refused_checkpoint_leaves_the_model_and_optimizer_as_they_were(tmp_path):
    """(torch copied the matching tensors, then raised; the optimizer check came after the
    model was loaded.)"""
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    path = tmp_path / "c.pt"
    save_checkpoint(path, model)
    other = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 1))  # one more layer
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(ValueError, match=r"holds the weights of another model: missing \['2.bias'"):
        load_checkpoint(path, other)
    same = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    before = [p.detach().clone() for p in same.parameters()]
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(path, same, torch.optim.SGD(same.parameters(), lr=0.1))
    assert all(torch.equal(a, b) for a, b in zip(before, same.parameters(), strict=True))
    save_checkpoint(path, model, torch.optim.SGD(model[0].parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"state of another optimizer: parameter groups of \[2\]"):
        load_checkpoint(path, same, torch.optim.SGD(same.parameters(), lr=0.1))
    assert all(torch.equal(a, b) for a, b in zip(before, same.parameters(), strict=True))


@pytest.mark.parametrize("stepped", [False, True], ids=["fresh", "stepped"])
def test_another_kind_of_optimizer_is_refused_before_anything_is_written(tmp_path, stepped):
    """An SGD checkpoint into Adam: before SGD's first step it loaded, and Adam's next step
    failed (no betas); after it, Adam raised a bare KeyError with the model written."""
    torch.manual_seed(0)
    source = nn.Linear(3, 4)
    sgd = torch.optim.SGD(source.parameters(), lr=0.1, momentum=0.9)
    if stepped:
        source(torch.randn(2, 3)).sum().backward()
        sgd.step()
    save_checkpoint(tmp_path / "sgd.pt", source, sgd)
    model = nn.Linear(3, 4)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    before, settings = model.weight.detach().clone(), dict(adam.param_groups[0])
    with pytest.raises(ValueError, match="another kind of optimizer: settings dampening, momen"):
        load_checkpoint(tmp_path / "sgd.pt", model, adam)
    assert torch.equal(model.weight, before) and adam.param_groups[0] == settings


def test_an_optimizer_state_the_optimizer_cannot_take_leaves_it_as_it_was(tmp_path):
    """A state that passes the checks and fails in the optimizer's own loading (here,
    Adam's per-parameter state without its step count) gives the optimizer its own state
    back, and leaves the model as it was."""
    model = nn.Linear(3, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path / "c.pt", model, optimizer)
    broken = torch.load(tmp_path / "c.pt", weights_only=True)
    del broken["optimizer"]["state"][0]["step"]
    broken["model"]["weight"] += 1
    torch.save(broken, tmp_path / "c.pt")
    own, weight = optimizer.state_dict(), model.weight.detach().clone()
    with pytest.raises(ValueError, match="holds an optimizer state this optimizer cannot take"):
        load_checkpoint(tmp_path / "c.pt", model, optimizer)
    assert torch.equal(model.weight, weight)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], own["state"][0]["exp_avg"])
    assert torch.equal(optimizer.state_dict()["state"][0]["step"], own["state"][0]["step"])


def test_a_checkpoint_file_has_the_mode_a_plain_save_gives_it(tmp_path):
    """(It was written 0600, mkstemp's mode, and overwriting a 0644 file made it 0600.)"""
    model = nn.Linear(3, 2)
    torch.save({}, tmp_path / "plain.pt")
    save_checkpoint(tmp_path / "c.pt", model)

    def mode(name: str) -> int:
        return (tmp_path / name).stat().st_mode & 0o777

    assert mode("c.pt") == mode("plain.pt")
    (tmp_path / "c.pt").chmod(0o640)
    save_checkpoint(tmp_path / "c.pt", model)  # a file replaced keeps its mode
    assert mode("c.pt") == 0o640


def test_a_fifo_in_a_checkpoints_place_is_no_missing_checkpoint(tmp_path):
    """(It was reported missing, "train without --resume first", and a run then replaced
    it.)"""
    os.mkfifo(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="is not a regular file"):
        load_checkpoint(tmp_path / "c.pt", nn.Linear(3, 2))


def test_files_that_are_no_checkpoint_give_one_value_error(tmp_path):
    """(A truncated file was a RuntimeError, an empty one an EOFError, a text file a
    KeyError, a NumPy file 'could run arbitrary code'.)"""
    import numpy as np

    model = nn.Linear(3, 2)
    good = tmp_path / "good.pt"
    save_checkpoint(good, model)
    files = {
        "truncated.pt": good.read_bytes()[: good.stat().st_size // 2],
        "empty.pt": b"",
        "text.pt": b"epoch,loss\n1,0.5\n",
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    np.save(tmp_path / "array.npy", np.zeros(3))
    for name in (*files, "array.npy"):
        with pytest.raises(ValueError, match="is not a (readable )?checkpoint"):
            load_checkpoint(tmp_path / name, model)
    with pytest.raises(ValueError, match="is a folder, not a checkpoint file"):
        load_checkpoint(tmp_path, model)
    torch.save({"model": "weights"}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match="no 'model' weights"):
        load_checkpoint(tmp_path / "odd.pt", model)


def test_save_refuses_state_that_load_would_refuse_and_writes_no_link(tmp_path):
    import numpy as np

    model, path = nn.Linear(3, 2), tmp_path / "c.pt"
    with pytest.raises(TypeError, match=r"state\['best'\] is a numpy.float64"):
        save_checkpoint(path, model, best=np.float64(0.5))  # (saved, then refused on resume)
    with pytest.raises(TypeError, match=r"state\['log'\]\[1\]\['rng'\] is a builtins.object"):
        save_checkpoint(path, model, log=[{}, {"rng": object()}])
    assert not path.exists() and list(tmp_path.iterdir()) == []
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "c.pt.tmp").symlink_to(victim)  # (the old fixed temporary name was followed)
    save_checkpoint(path, model, epoch=1)
    assert victim.read_text() == "keep" and load_checkpoint(path, model) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "c.pt.tmp", "victim.txt"]
