"""``benchmarks/gpu_targets.py``: the GPU check's targets, read off a ``gpu.py`` run."""

import json
import subprocess
import sys

import pytest

from tests.conftest import BENCHMARKS, load_benchmark

targets = load_benchmark("gpu_targets")
RECORDED = BENCHMARKS / "results" / "gpu"
#: targets (by words of their names) of methods the recorded run may predate
NEWER_METHODS = {"Triton kernels": "hsa-triton", "TF32 matmuls": "hmatrix-tf32"}


def _row(section, case, dtype, method, ms=None, footprint=None):
    row = {"section": section, "case": case, "dtype": dtype, "method": method}
    return row | {"median_ms": ms, "footprint_mib": footprint}


def _run(rows=(), tests=None) -> dict:
    """A ``gpu.json`` of a CUDA run with ``rows`` (and ``tests``)."""
    return {"meta": {"device": "cuda"}, "rows": list(rows), "tests": tests or {}}


def _by_target(result: list[dict], dtype: str) -> dict:
    return {t["target"]: t for t in result if t["dtype"] == dtype}


def test_ratios_against_their_bounds():
    """``≥`` targets divide the peer's time by ours, ``≤`` targets ours by the peer's; a
    value on the bound meets it, one past it does not."""
    rows = [
        _row("hsa", "1x262144", "bf16", "hsa", 10.0),
        _row("hsa", "1x262144", "bf16", "sdpa-flash", 500.0),  # exactly 50x: met
        _row("hsa", "1x262144", "bf16", "level-bound", 4.0),  # 2.5x the bound: not met
        _row("hsa", "32x512", "bf16", "hsa", 3.0),
        _row("hsa", "32x512", "bf16", "sdpa-flash", 2.0),
        _row("hsa", "32x512", "bf16", "level-bound", 1.5),  # exactly 2x: met
        _row("hmatrix", "L=65536", "fp32", "hmatrix", 10.0),
        _row("hmatrix", "L=65536", "fp32", "sdpa", 99.0),  # 9.9x: not met
    ]
    result = targets.evaluate(_run(rows))
    bf16, fp32 = _by_target(result, "bf16"), _by_target(result, "fp32")
    flash = bf16["HSA ≥ 50× flash SDPA, 256K leaves"]
    assert flash["value"] == pytest.approx(50) and flash["met"] is True
    assert flash["need"] == "≥ 50"
    bound = bf16["HSA ≤ 2× the per-level bound, 1x262144"]
    assert bound["value"] == pytest.approx(2.5) and bound["met"] is False
    assert bf16["HSA ≤ 2× the per-level bound, 32x512"]["met"] is True
    slower = bf16["HSA not slower than flash SDPA, 32x512"]
    assert slower["value"] == pytest.approx(1.5) and slower["met"] is False
    hmatrix = fp32["H-matrix ≥ 10× SDPA, 64K tokens"]
    assert hmatrix["value"] == pytest.approx(9.9) and hmatrix["met"] is False


def test_the_tf32_variant_is_read_in_bf16_against_sdpa():
    rows = [
        _row("hmatrix", "L=65536", "bf16", "hmatrix", 12.0),
        _row("hmatrix", "L=65536", "bf16", "hmatrix-tf32", 4.0),
        _row("hmatrix", "L=65536", "bf16", "sdpa", 60.0),
    ]
    bf16 = _by_target(targets.evaluate(_run(rows)), "bf16")
    assert bf16["H-matrix ≥ 10× SDPA, 64K tokens"]["met"] is False
    tf32 = bf16["H-matrix, TF32 matmuls, ≥ 10× SDPA, 64K tokens"]
    assert tf32["value"] == pytest.approx(15) and tf32["met"] is True


def test_unmeasured_targets_are_never_met():
    """A skipped method, a missing case or a run without CUDA tests leaves its targets
    unmeasured, with what is missing named."""
    rows = [
        _row("hsa", "8x2048", "bf16", "hsa", 5.0),
        _row("hsa", "8x2048", "bf16", "level-bound", None),  # skipped
    ]
    result = targets.evaluate(_run(rows, {"status": "skipped"}))
    assert all(t["met"] is None and t["value"] is None for t in result)
    bound = _by_target(result, "bf16")["HSA ≤ 2× the per-level bound, 8x2048"]
    assert "level-bound" in bound["why"]
    assert "NOT MET" not in "\n".join(targets.lines(result))


def test_cuda_tests_target():
    """Met by a ``pytest -m cuda`` run without failures or errors; other test runs (the CPU
    smoke test's one test) measure nothing."""
    done = {"status": "done", "passed": 120, "failed": 0, "errors": 0, "command": "pytest -m cuda"}
    assert targets.evaluate(_run(tests=done))[0]["met"] is True
    assert targets.evaluate(_run(tests=done | {"failed": 1}))[0]["met"] is False
    assert targets.evaluate(_run(tests=done | {"errors": 2}))[0]["met"] is False
    other = done | {"command": "pytest tests/test_host_sync.py"}
    assert targets.evaluate(_run(tests=other))[0]["met"] is None
    twins = targets.evaluate(_run(tests=done), twin="+graph")  # the twins' run is timed only
    assert all(t["target"] != "every CUDA test passes" for t in twins)


def test_a_run_off_cuda_measures_no_target():
    """The targets are a GPU's: a CPU run of the full sizes meets none of them."""
    rows = [_row("hsa", "1x262144", "bf16", "hsa", 1.0)]
    rows.append(_row("hsa", "1x262144", "bf16", "sdpa-flash", 100.0))
    done = {"status": "done", "passed": 1, "failed": 0, "errors": 0, "command": "pytest -m cuda"}
    run = _run(rows, done) | {"meta": {"device": "cpu"}}
    result = targets.evaluate(run)
    assert all(t["met"] is None and t["why"] == "not a CUDA run" for t in result)
    on_cuda = _by_target(targets.evaluate(_run(rows)), "bf16")
    assert on_cuda["HSA ≥ 50× flash SDPA, 256K leaves"]["met"] is True


def test_memory_targets_read_the_steps_own_footprint():
    rows = [
        _row("hsa", "1x1048576", "fp32", "hsa", 1.0, footprint=41 * 1024),
        _row("graph_hsa", "n=1000000", "fp32", "graph_hsa_net", 1.0, footprint=10 * 1024),
    ]
    fp32 = _by_target(targets.evaluate(_run(rows)), "fp32")
    assert fp32["1M-leaf HSA fits in 40 GiB"]["met"] is False
    assert fp32["1M-node GraphHSANet fits in 40 GiB"]["value"] == pytest.approx(10)
    assert fp32["1M-node GraphHSANet fits in 40 GiB"]["met"] is True


def test_graph_twins_fall_back_to_a_peers_eager_step():
    """With ``twin="+graph"`` both sides are read from their twins; a peer without a twin
    counts with its eager step, and the target names both methods."""
    rows = [
        _row("hsa", "32x512", "bf16", "hsa", 6.0),
        _row("hsa", "32x512", "bf16", "hsa+graph", 1.0),
        _row("hsa", "32x512", "bf16", "level-bound+graph", 1.0),
        _row("masked", "window n=65536", "bf16", "ours", 10.0),
        _row("masked", "window n=65536", "bf16", "ours+graph", 4.0),
        _row("masked", "window n=65536", "bf16", "transformer_conv", 100.0),
    ]
    bf16 = _by_target(targets.evaluate(_run(rows), twin="+graph"), "bf16")
    bound = bf16["HSA ≤ 2× the per-level bound, 32x512"]
    assert bound["value"] == pytest.approx(1) and bound["why"] == ""
    masked = bf16["MaskedAttentionConv ≥ 5× TransformerConv, window mask, 64K nodes"]
    assert masked["value"] == pytest.approx(25)
    assert masked["why"] == "ours+graph vs transformer_conv"
    assert not any(t["target"].endswith("40 GiB") for t in bf16.values())


@pytest.mark.skipif(not (RECORDED / "gpu.json").exists(), reason="no recorded GPU run")
def test_the_recorded_run_measures_every_target():
    """The recorded GPU run has every case and method the targets read (their names follow
    ``gpu.py``'s; the Triton kernels' targets where it timed them), and each value is the
    quotient of that run's medians."""
    run = json.loads((RECORDED / "gpu.json").read_text())
    result = targets.evaluate(run)
    unmeasured = [t["target"] for t in result if t["met"] is None]
    assert all(any(words in t for words in NEWER_METHODS) for t in unmeasured)
    methods = {r["method"] for r in run["rows"]}
    for words, method in NEWER_METHODS.items():
        assert any(words in t for t in unmeasured) != (method in methods)
    median = {(r["case"], r["dtype"], r["method"]): r.get("median_ms") for r in run["rows"]}
    flash = _by_target(result, "bf16")["HSA ≥ 50× flash SDPA, 256K leaves"]
    ratio = median[("1x262144", "bf16", "sdpa-flash")] / median[("1x262144", "bf16", "hsa")]
    assert flash["value"] == pytest.approx(ratio)


@pytest.mark.skipif(not (RECORDED / "gpu.json").exists(), reason="no recorded GPU run")
def test_command_line_prints_one_line_a_target():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_targets.py"), str(RECORDED / "gpu.json")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == len(targets.evaluate(json.loads((RECORDED / "gpu.json").read_text())))
    measured = [line for line in lines if not any(words in line for words in NEWER_METHODS)]
    assert measured and all(line.startswith(("met ", "NOT MET ")) for line in measured)
