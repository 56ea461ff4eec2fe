"""``benchmarks/README.md`` is what ``benchmarks/report.py`` renders from the committed JSON
results, and no result file records an absolute path."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # report.py's modules, as it imports them
import report_results  # noqa: E402
from report_format import mean_std, num, spread  # noqa: E402
from report_gpu import crashed  # noqa: E402
from report_zeroshot import _mcnemar  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
#: Prefixes of machine-specific absolute paths that must not appear in a result file.
ABSOLUTE = re.compile(r"(?<![\w.])/(?:work|tmp|root|home|Users|mnt|scratch)/")


@pytest.fixture
def report():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_report", REPO / "benchmarks/report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_rendered_from_the_json(report):
    readme = (REPO / "benchmarks" / "README.md").read_text()
    assert readme == report.render(), (
        "benchmarks/README.md is out of date: run `python benchmarks/report.py` and commit it"
    )
    assert report.main(["--check"]) == 0


def test_every_plot_and_source_the_readme_links_exists():
    readme = (REPO / "benchmarks" / "README.md").read_text()
    links = re.findall(r"\]\((results/[^)]+)\)", readme)
    assert links
    missing = [link for link in links if not (REPO / "benchmarks" / link).exists()]
    assert not missing, missing


def test_the_readme_links_every_result_file():
    """No committed result is left out of the report (a number quoted in the docs from a file
    the report does not render would be typed by hand)."""
    readme = (REPO / "benchmarks" / "README.md").read_text()
    linked = set(re.findall(r"\]\(results/([^)]+\.json)\)", readme))
    files = {path.relative_to(RESULTS).as_posix() for path in RESULTS.rglob("*.json")}
    assert files - linked == set()


def _strings(value, path=""):
    """Every string of a JSON value (keys included), with where it sits."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}/{key} (key)", key
            yield from _strings(item, f"{path}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def test_no_result_file_holds_an_absolute_path():
    files = sorted(RESULTS.rglob("*.json"))
    assert files
    bad = [
        f"{file.relative_to(RESULTS)}{where}: {text[:120]!r}"
        for file in files
        for where, text in _strings(json.loads(file.read_text()))
        if ABSOLUTE.search(text)
    ]
    assert not bad, "\n".join(bad)


def test_optional_results_render_when_present(report, tmp_path, monkeypatch):
    """A GPU run and a second ``hsa_short`` file (written by other scripts) get their
    sections; without them the GPU section says that no run was made."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    monkeypatch.setattr(report_results, "RESULTS", results)
    shutil.rmtree(results / "gpu", ignore_errors=True)
    assert "No GPU run is recorded" in report.render()
    (results / "gpu").mkdir()
    rows = [
        {"section": "hsa", "case": "8x2048", "dtype": "bf16", "method": "hsa", "status": "ok",
         "median_ms": 2.0, "times_ms": [2.5, 2.0, 1.5], "rounds": 3, "peak_mib": 10.0,
         "ratio_to_hsa": 1.0},
        {"section": "hsa", "case": "8x2048", "dtype": "bf16", "method": "sdpa-flash",
         "status": "ok", "median_ms": 1.0, "times_ms": [1.0, 1.1, 0.9], "rounds": 3,
         "peak_mib": 20.0, "ratio_to_hsa": 0.5},
        {"section": "hsa", "case": "8x2048", "dtype": "bf16", "method": "sdpa-efficient",
         "status": "skipped", "reason": "section time cap"},
        {"section": "profile", "case": "8x2048", "dtype": "bf16", "method": "hsa",
         "status": "ok", "median_ms": 2.0, "times_ms": [2.0] * 3, "rounds": 3,
         "profile": {"unit": "kernels", "per_step": 160.0, "busy_ms": 1.25, "wall_ms": 9.5,
                     "top": [{"name": "bmm_kernel", "calls": 12.0, "ms": 0.4},
                             {"name": "softmax", "calls": 6.0, "ms": 0.2}]}},
    ]  # fmt: skip
    gpu = {
        "meta": {"device": "cuda", "device_name": "Some GPU", "torch": "2.x", "cuda": "12.x",
                 "command": "python benchmarks/gpu.py --out benchmarks/results/gpu"},
        "sections": {"hsa": {"status": "done"}},
        "tests": {"passed": 7, "failed": 0, "errors": 0, "skipped": 1},
        "rows": rows,
    }  # fmt: skip
    (results / "gpu" / "gpu.json").write_text(json.dumps(gpu))
    text = report.render()
    short = text[text.index("## HSA at short lengths") :]
    assert "**2 threads, CPU capability AVX2**" in short  # recorded in the file's meta
    assert "**2 threads, CPU capability not recorded**" in short  # files from before that
    gpu_part = text[text.index("## GPU") :]
    assert "Some GPU" in gpu_part and "passed 7" in gpu_part
    assert "2.00 ms [1.50 ms–2.50 ms] ×3" in gpu_part and "0.500× (hsa)" in gpu_part
    assert "skipped: section time cap" in gpu_part
    assert "| 8x2048 | bf16 | hsa | 160 kernels | 1.25 ms | 9.5 ms | `bmm_kernel` ×12 0.4 ms" in (
        gpu_part
    )


def test_a_crashed_subprocess_is_reported_with_its_error():
    log = "\n".join([
        "k.cu:16: gather_kernel: block: [2,0,0] Assertion `ind < size` failed.",
        "k.cu:16: gather_kernel: block: [3,0,0] Assertion `ind < size` failed.",
        "Traceback (most recent call last):",
        '  File "gpu.py", line 9, in <module>',
        "torch.AcceleratorError: CUDA error: device-side assert triggered",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    ])  # fmt: skip
    (line,) = [x for x in crashed({"status": "error", "returncode": 1, "reason": log}) if x]
    assert line.startswith("The process exited with code 1: ")
    assert "`torch.AcceleratorError: CUDA error: device-side assert triggered`" in line
    assert "gather_kernel: block: [2,0,0] Assertion" in line and "[3,0,0]" not in line
    assert crashed({"status": "done"}) == []


def test_spreads_and_means():
    assert spread([0.003, 0.001, 0.002]) == "2.00 ms [1.00 ms–3.00 ms] ×3"
    assert spread([0.001, 0.0015, 0.009]).startswith("1.50 ms ")  # the median, not 3.83
    assert spread([2.0]) == "2.00 s ×1"
    assert mean_std([0.8, 0.9]) == "0.8500 ± 0.0707 [0.800–0.900]"
    assert num(1234.5) == "1,234" and num(0.000012, 2) == "1.2e-05"
    # exact McNemar: 20 : 2 discordant documents -> 2 * (1 + 22 + 231) / 2^22
    a, b = "1" * 20 + "0" * 2 + "11", "0" * 20 + "1" * 2 + "11"
    only_a, only_b, p = _mcnemar(a, b)
    assert (only_a, only_b) == (20, 2) and p == pytest.approx(2 * 254 / 2**22)
