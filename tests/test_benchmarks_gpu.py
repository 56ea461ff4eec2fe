"""``benchmarks/gpu.py``, the one-command GPU check, runs end to end on the CPU (tiny sizes)
and writes a complete report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import triton_runs_kernels

REPO = Path(__file__).resolve().parents[1]
SECTIONS = [
    "tests", "hsa", "triton", "hmatrix", "vcc", "masked", "cone", "graph_hsa", "profile", "graphs",
    "compiled",
]  # fmt: skip
PEERS = {  # section -> methods every case compares
    "hsa": {"hsa", "hsa-heads-first", "sdpa-flash", "sdpa-efficient", "level-bound"},
    "hmatrix": {"hmatrix", "sdpa"},
    "vcc": {"vcc-layer", "full-layer"},
    "masked": {"ours", "transformer_conv"},
    "cone": {"gat", "penumbral", "umbral"},
    "graph_hsa": {"graph_hsa_net", "gcn"},
}
MIXED = {"hsa", "hsa-blocks", "sdpa-masked"}  # the hsa batch of different lengths
CAUSAL = {"hsa-causal", "sdpa-flash", "sdpa-efficient"}  # the hsa batches, strictly causal
#: Every section's time cap in the CPU run: the quick sizes take a few seconds each, and a
#: section that nears its cap times its last cases in fewer rounds, which these tests refuse;
#: the caps are wide so that a loaded machine (a slower run) still times every round.
CAP_S = 300


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    command = [
        sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--quick", "--out", str(out),
        # the tests section runs one fast test instead of the (skipping) CUDA tests
        "--pytest", "tests/test_host_sync.py -k recorder_sees",
        "--compiled-pytest", "tests/test_host_sync.py -k recorder_sees",
        "--deadline", str(len(SECTIONS) * CAP_S), "--caps", *(f"{s}={CAP_S}" for s in SECTIONS),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "gpu.json").read_text()), done.stdout


@pytest.fixture
def gpu(monkeypatch):
    """``benchmarks/gpu.py`` as a module (``benchmarks`` is no package)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    return gpu


def test_report_has_every_section_and_the_environment(report):
    out, data, stdout = report
    assert (out / "gpu.png").stat().st_size > 0 and (out / "pytest_cuda.xml").exists()
    meta = data["meta"]
    for key in ("device", "device_name", "torch", "cuda", "command", "caps_s", "elapsed_s"):
        assert key in meta
    assert meta["device"] == "cpu" and meta["quick"] and not meta["stopped_by_deadline"]
    assert list(data["sections"]) == SECTIONS
    statuses = {name: s["status"] for name, s in data["sections"].items()}
    assert statuses.pop("graphs") == "skipped"  # CUDA graphs need CUDA
    assert statuses.pop("triton") == "skipped"  # Triton's kernels are timed on CUDA
    assert set(statuses.values()) == {"done"}, data["sections"]
    tests, compiled = data["tests"], data["sections"]["compiled"]
    assert (tests["passed"], tests["failed"], tests["errors"]) == (1, 0, 0), tests
    assert (compiled["passed"], compiled["failed"], compiled["errors"]) == (1, 0, 0), compiled
    assert (out / "pytest_compiled.xml").exists()
    assert "section" in stdout and "fwd+bwd" in stdout  # the table
    # then the targets: a GPU's, so none is measured by a CPU run
    targets = stdout.split("\ntargets:\n")[1].splitlines()[:-1]  # the last: "wrote ..."
    assert "every CUDA test passes" in targets[0] and len(targets) > 10
    assert all(line.startswith("not measured") for line in targets)


def test_every_case_times_each_method_against_its_peers(report):
    _, data, _ = report
    rows = data["rows"]
    for section, methods in PEERS.items():
        mine = [r for r in rows if r["section"] == section]
        for case in {r["case"] for r in mine}:
            for dtype in ("fp32", "bf16"):
                got = {r["method"] for r in mine if r["case"] == case and r["dtype"] == dtype}
                kinds = {"mixed": MIXED, "ragged": MIXED, "causal": CAUSAL}
                expected = kinds.get(case.split()[-1], methods)
                assert expected <= got, (section, case, dtype, got)
    firsts = {}  # (section, case, dtype) -> the row of the case's first method
    for row in rows:
        first = firsts.setdefault((row["section"], row["case"], row["dtype"]), row)
        assert row["status"] in ("ok", "skipped", "error"), row
        if row["status"] != "ok":
            assert row["reason"], row
            continue
        assert row["rounds"] == 3 == len(row["times_ms"])  # a smoke run: the fewest rounds
        assert 0 < row["median_ms"] and row["peak_mib"] is None  # no CUDA allocator on CPU
        if first["status"] == "ok":
            assert row[f"ratio_to_{first['method']}"] > 0
    ok = {r["section"] for r in rows if r["status"] == "ok"}
    assert ok == set(PEERS) | {"profile"}


def test_profiled_steps_say_where_their_time_goes(report):
    """The profile section times HSA eager, heads-first and compiled beside the bound and
    flash SDPA, and H-matrix beside SDPA, in bf16, each with its operator breakdown."""
    _, data, _ = report
    rows = [r for r in data["rows"] if r["section"] == "profile"]
    hsa = {"hsa", "hsa-heads-first", "hsa-compiled", "level-bound", "sdpa-flash"}
    assert {r["method"] for r in rows} == hsa | {"hmatrix", "sdpa"}
    assert {r["dtype"] for r in rows} == {"bf16"} and all(r["status"] == "ok" for r in rows)
    per_step = {}
    for row in rows:
        profile = row["profile"]
        assert profile["unit"] == "operators" and profile["wall_ms"] > 0
        assert 0 < profile["busy_ms"] and 0 < len(profile["top"]) <= 12
        top = [t["ms"] for t in profile["top"]]
        assert top == sorted(top, reverse=True) and all(t["calls"] > 0 for t in profile["top"])
        per_step[row["method"]] = profile["per_step"]
    # compiled, the forward and backward are a few kernels in place of one call per op
    assert per_step["hsa-compiled"] < per_step["hsa"] / 3


def test_deadline_stops_the_run_and_keeps_the_report(tmp_path):
    command = [
        sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--quick", "--out", str(tmp_path),
        "--deadline", "0", "--sections", "hsa", "cone",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["meta"]["stopped_by_deadline"]
    assert all(s["status"] == "skipped" for s in data["sections"].values())
    assert data["rows"] == []


def test_cuda_marker_selects_the_cuda_variants_only():
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
        "-m", "cuda", "tests/ops/test_gpu_path.py", "tests/test_host_sync.py",
        "tests/test_benchmarks_gpu.py", "tests/test_distributed.py",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert "tests/ops/test_gpu_path.py::test_autocast_bf16[hsa-dense-cuda]" in ids
    assert "tests/test_host_sync.py::test_no_host_sync_cuda[hsa-dense]" in ids
    assert "tests/ops/test_gpu_path.py::test_cuda_matches_cpu[hmatrix]" in ids
    assert "tests/ops/test_gpu_path.py::test_no_host_sync_in_hot_loop[banded]" in ids  # skipif
    assert not any("cpu" in i.partition("[")[2] for i in ids), ids  # no CPU variant
    # CPU-only tests that merely mention CUDA in their code are not selected (this one's
    # fixture would run the whole CPU report inside the GPU run's test section)
    assert not any(("test_report_has" in i or "test_bad_backend" in i) for i in ids), ids


def test_compiled_section_selects_its_three_cuda_tests(gpu):
    """The ``compiled`` section's default selection is what its docstring says (a typo in
    its ``-k`` expression would select nothing on the GPU and pass)."""

    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only"]
    done = subprocess.run(
        command + gpu.COMPILED_TESTS, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids == [
        f"tests/ops/test_gpu_path.py::test_compiled_matches_eager[{name}-cuda]"
        for name in ("hsa-uniform", "hsa-strict-causal", "hmatrix")
    ], done.stdout[-2000:]


def test_graph_twins_on_cuda_only(gpu):
    import torch

    methods = {"a": gpu.Method(None, graph=True), "b": gpu.Method(None)}
    assert list(gpu.with_graph_twins(methods, torch.device("cpu"))) == ["a", "b"]
    twins = gpu.with_graph_twins(methods, torch.device("cuda"))
    assert list(twins) == ["a", "a+graph", "b"]
    assert twins["a+graph"].graphed and not twins["a+graph"].graph and not twins["a"].graphed


def test_profiled_cases_get_no_graph_twins(gpu, monkeypatch, tmp_path):
    """A profiled case (here with ``--graphs`` on) times and profiles its methods as they
    are; the other cases get their twins."""
    import argparse

    import torch

    twinned = []

    def with_graph_twins(methods, device):
        twinned.append(1)
        return methods

    monkeypatch.setattr(gpu, "with_graph_twins", with_graph_twins)
    x = torch.ones(3, requires_grad=True)
    method = gpu.Method(lambda dtype, device: ((lambda: x * 2), [x]), graph=True)
    args = argparse.Namespace(graphs=True, deadline=60.0, out=str(tmp_path))
    run = gpu.Run(args, torch.device("cpu"), gpu.QUICK, started=time.monotonic())
    end = time.monotonic() + 30
    gpu.run_case(run, "profile", end, "c", {"m": method}, ("fp32",), profile=True)
    assert twinned == [] and "profile" in run.rows[-1]
    gpu.run_case(run, "hsa", end, "c", {"m": method}, ("fp32",))
    assert twinned == [1] and "profile" not in run.rows[-1]


def test_a_tf32_method_runs_its_whole_step_on_tf32_matmuls(gpu, tmp_path):
    """``hmatrix-tf32`` (a CUDA run's) is H-matrix attention's step with float32 matrix
    products on TF32 cores, forward and backward; the setting before it comes back after."""
    import argparse

    import torch

    assert "hmatrix-tf32" not in gpu.hmatrix_methods(64)
    assert gpu.hmatrix_methods(64, tf32=True)["hmatrix-tf32"].tf32
    seen = []

    def build(dtype, device):
        x = torch.ones(3, requires_grad=True)
        x.register_hook(lambda grad: seen.append(torch.get_float32_matmul_precision()))

        def forward():
            seen.append(torch.get_float32_matmul_precision())
            return x * 2

        return forward, [x]

    args = argparse.Namespace(deadline=60.0, out=str(tmp_path))
    run = gpu.Run(args, torch.device("cpu"), gpu.QUICK, started=time.monotonic())
    before = torch.get_float32_matmul_precision()
    step, _ = gpu._prepare(run, gpu.Method(build, tf32=True), torch.float32)
    step()
    assert seen == ["high", "high"] and torch.get_float32_matmul_precision() == before
    gpu._prepare(run, gpu.Method(build), torch.float32)[0]()
    assert seen[2:] == [before, before]


def test_storage_bytes_counts_each_storage_once(gpu):
    import torch

    x = torch.zeros(10, 4)
    assert gpu.storage_bytes([x, x.t(), x[2:]]) == 160
    assert gpu.storage_bytes([x, torch.zeros(3, dtype=torch.float64)]) == 184


@pytest.mark.parametrize("case", ["equal", "mixed"])
def test_triton_methods_run_the_kernels_on_a_cuda_run(gpu, monkeypatch, case):
    """A CUDA run with Triton times ``hsa-triton`` beside ``hsa`` in its triton section: the
    same step with the kernels turned on for its call only (built here on the CPU, where
    Triton's interpreter runs them; batches of different lengths on their padded forest)."""
    if not triton_runs_kernels():
        pytest.skip("needs Triton on a GPU or its interpreter from 3.7 on")
    from types import SimpleNamespace

    import torch

    from hiergraph.ops.hsa import native, triton_uniform
    from tests.conftest import spy_calls

    monkeypatch.setattr(native, "_enabled", False)  # off the CPU: the padded forest
    cpu = torch.device("cpu")
    assert not gpu.times_triton_kernels(SimpleNamespace(device=cpu))
    run = SimpleNamespace(device=torch.device("cuda"), sizes=gpu.QUICK)
    build = gpu.hsa_methods if case == "equal" else gpu.hsa_lengths_methods
    assert "hsa-triton" not in build(run, 2, 32)  # the HSA section's
    methods = build(run, 2, 32, triton=True)  # the triton section's
    calls = spy_calls(monkeypatch, triton_uniform, "triton_uniform_attention")
    outputs = {}
    for name in ("hsa", "hsa-triton"):
        forward, _ = methods[name].build(torch.float32, cpu)
        outputs[name] = forward()
        assert len(calls) == (name == "hsa-triton") and not triton_uniform.enabled()
    assert outputs["hsa-triton"].shape == outputs["hsa"].shape


@pytest.mark.parametrize("returncode", [0, 1])
def test_triton_section_runs_in_a_child_whose_rows_join(gpu, monkeypatch, tmp_path, returncode):
    """The triton section's child ``gpu.py`` (here a stand-in that writes one row, then
    exits with ``returncode``): its rows join the run's, also when it died."""
    import argparse

    import torch

    def child(command, **kwargs):
        out = Path(command[command.index("--out") + 1])
        assert {"--triton-child", "--graphs"} <= set(command)
        assert command[command.index("--sections") + 1] == "triton"
        out.mkdir(parents=True)
        (out / "gpu.json").write_text(json.dumps({"rows": [{"section": "triton", "case": "c"}]}))
        return subprocess.CompletedProcess(command, returncode, "", "Traceback\nRuntimeError: x")

    monkeypatch.setattr(gpu, "times_triton_kernels", lambda run: True)
    monkeypatch.setattr(gpu.subprocess, "run", child)
    args = argparse.Namespace(triton_child=False, quick=True, deadline=60.0, out=str(tmp_path))
    run = gpu.Run(args, torch.device("cuda"), gpu.QUICK, started=time.monotonic())
    status = gpu.section_triton(run, time.monotonic() + 30)
    assert run.rows == [{"section": "triton", "case": "c"}]
    assert status["status"] == ("done" if returncode == 0 else "error")
    assert ("RuntimeError: x" in status.get("reason", "")) == bool(returncode)


def test_triton_child_killed_at_its_limit_keeps_its_rows(gpu, monkeypatch, tmp_path):
    """A child still running at the section's end is killed; what it wrote joins the run.
    Its deadline is on the parent's clock, a margin before that end."""
    import argparse

    import torch

    def child(command, timeout, **kwargs):
        out = Path(command[command.index("--out") + 1])
        assert float(command[command.index("--clock-start") + 1]) == run.started
        deadline = run.started + float(command[command.index("--deadline") + 1])
        assert abs(deadline - (end - gpu.CHILD_MARGIN_S)) < 1
        out.mkdir(parents=True)
        (out / "gpu.json").write_text(json.dumps({"rows": [{"section": "triton", "case": "c"}]}))
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(gpu, "times_triton_kernels", lambda run: True)
    monkeypatch.setattr(gpu.subprocess, "run", child)
    args = argparse.Namespace(triton_child=False, quick=True, deadline=600.0, out=str(tmp_path))
    run = gpu.Run(args, torch.device("cuda"), gpu.QUICK, started=time.monotonic() - 100)
    end = time.monotonic() + 60
    status = gpu.section_triton(run, end)
    assert status["status"] == "timeout"
    assert run.rows == [{"section": "triton", "case": "c"}]


def test_a_broken_cuda_context_stops_the_sections_of_this_process_only(gpu, monkeypatch, tmp_path):
    """After a sticky CUDA error (here: ``release`` reports it after the first section),
    the sections that run in this process are skipped, those in subprocesses still run."""
    ran = []
    for name in ("hsa", "cone", "tests"):
        monkeypatch.setitem(gpu.SECTIONS, name, lambda run, end, name=name: ran.append(name))
    monkeypatch.setattr(gpu, "release", lambda device: False)
    monkeypatch.setattr(gpu, "plot", lambda rows, path: None)
    gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--sections", "hsa", "cone",
              "tests"])  # fmt: skip
    sections = json.loads((tmp_path / "gpu.json").read_text())["sections"]
    assert ran == ["hsa", "tests"]
    assert sections["cone"] == {"status": "skipped", "reason": gpu.BROKEN}
    assert sections["hsa"]["status"] == sections["tests"]["status"] == "done"


def test_release_and_free_memory_survive_a_cuda_error(gpu):
    """Without a usable CUDA context every CUDA call raises, as after a sticky error."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine whose CUDA calls fail")
    assert gpu.release(torch.device("cuda")) is False
    assert gpu.free_bytes(torch.device("cuda")) == float("inf")
    assert gpu.release(torch.device("cpu")) is True


def test_inputs_come_from_the_script_s_own_generator(gpu):
    """Not from the device's default generator, which a failed CUDA-graph capture breaks;
    reseeded before every build, so a method's inputs are the same in every run."""
    import torch

    cpu = torch.device("cpu")
    state = torch.get_rng_state()
    gpu.seed_inputs(cpu)
    first = gpu.randn(4, 3, device=cpu)
    assert torch.equal(torch.get_rng_state(), state)
    gpu.seed_inputs(cpu)
    assert torch.equal(gpu.randn(4, 3, device=cpu), first)
    assert not torch.equal(gpu.randn(4, 3, device=cpu), first)  # a stream, not one draw


def test_a_pytest_section_interrupted_at_its_cap_keeps_the_report(gpu, monkeypatch, tmp_path):
    """At its cap pytest gets Ctrl-C (SIGINT), so its JUnit report still counts the tests
    that ran; a kill would leave none."""
    monkeypatch.setattr(gpu, "INTERRUPT_GRACE_S", 20.0)
    tests = tmp_path / "test_slow.py"
    tests.write_text(
        "import time\n\ndef test_fast():\n    pass\n\ndef test_slow():\n    time.sleep(120)\n"
    )
    xml = tmp_path / "report.xml"
    result = gpu.run_pytest([str(tests)], xml, timeout=gpu.INTERRUPT_GRACE_S + 8)
    assert result["status"] == "timeout" and result["elapsed_s"] < 60
    assert result["passed"] == 1 and xml.exists()
