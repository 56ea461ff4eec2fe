"""``benchmarks/dispatch_count.py`` counts the operations of its quick cases (HSA on equal
and on padded trees, strictly causal HSA, H-matrix attention) on the ``meta`` device, for
the installed library and for one given by ``--library``."""

import itertools
import json
import shutil

from tests.benchmark_scripts import REPO, run_benchmark


def test_quick_run_counts_every_case(tmp_path):
    out, other = tmp_path / "dispatch_count.json", tmp_path / "other.json"
    run_benchmark("dispatch_count", "--quick", "--out", str(out))
    # another copy of the library, one comment apart: its digest tells which one ran
    library = tmp_path / "library"
    shutil.copytree(
        REPO / "hiergraph", library / "hiergraph", ignore=shutil.ignore_patterns("__py*")
    )
    with (library / "hiergraph" / "__init__.py").open("a") as f:
        f.write("# a copy\n")
    run_benchmark(
        "dispatch_count", "--quick", "--library", str(library), "--label", "copy",
        "--out", str(other),
    )  # fmt: skip
    report, same = (json.loads(p.read_text()) for p in (out, other))
    cases = ["4x128", "1x2048"], ["hsa", "hsa-heads-first"], ["float32", "bfloat16"]
    keys = [(r["case"], r["dtype"], r["method"]) for r in report["rows"]]
    causal = [("4x128", dtype, "hsa-causal") for dtype in cases[2]]
    mixed = [("4x128 mixed", dtype, "hsa") for dtype in cases[2]]
    ragged = [("4x128 ragged", dtype, m) for m in ("hsa", "hsa-blocks") for dtype in cases[2]]
    hmatrix = [("L=512", dtype, "hmatrix") for dtype in cases[2]]
    hsa = [(case, dtype, method) for case, method, dtype in itertools.product(*cases)]
    assert keys == [*hsa, *causal, *mixed, *ragged, *hmatrix]
    for key, row in zip(keys, report["rows"], strict=True):
        # one autograd node but for the strictly causal op and the block kernel
        recorded = key in causal or key[2] == "hsa-blocks"
        assert row["path"] == ("recorded" if recorded else "fused")
        assert 0 < row["views"] < row["ops"] and 0 < sum(row["top"].values()) <= row["ops"]
    # deeper trees take more operations; heads-first inputs need no layout copy
    ops = {key: row["ops"] for key, row in zip(keys, report["rows"], strict=True)}
    assert ops["1x2048", "float32", "hsa"] > ops["4x128", "float32", "hsa"]
    assert ops["4x128", "float32", "hsa-heads-first"] < ops["4x128", "float32", "hsa"]
    # off the CPU random windows run on their embedding, in fewer operations than in blocks
    assert 3 * ops["4x128 ragged", "float32", "hsa"] < ops["4x128 ragged", "float32", "hsa-blocks"]
    assert report["meta"]["command"] == "python benchmarks/dispatch_count.py --quick"
    assert same["meta"]["label"] == "copy" and "--library DIR" in same["meta"]["command"]
    assert same["meta"]["library_sha1"] != report["meta"]["library_sha1"]
    assert same["rows"] == report["rows"]  # the same code counts the same
    assert out.with_suffix(".png").stat().st_size > 0
    assert str(tmp_path) not in out.read_text()
