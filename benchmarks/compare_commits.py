"""Speed of two commits side by side: the quick HSA, masked-attention and cone benchmarks.

    python benchmarks/compare_commits.py --old REV [--new REV] [--rounds 3]
    python benchmarks/compare_commits.py --old REV --hsa-sizes 16384 65536 262144

Checks both commits out into temporary git worktrees and runs, in every round, each
benchmark once from the old tree and once from the new one (interleaved, so both see the
same machine load):

* ``benchmarks/hsa_scaling.py --quick --no-memory`` (forward+backward of each method, and
  its forward alone under ``torch.no_grad()``; ``--hsa-sizes``: at those leaf counts
  instead of the quick run's 1K and 4K),
* ``benchmarks/masked_attention.py --quick --methods ours`` (the layer, steady state),
* ``benchmarks/cone.py --reps 20`` (CPU time of a layer and of an epoch; needs Cora's raw
  files in ``$HIERGRAPH_RAW/Cora/raw``, else it is left out).

Every script runs with freed CPU memory kept for reuse
(:func:`hiergraph.runtime.reuse_freed_memory`, from this checkout), whatever its own commit
sets, so that the two commits differ only in their code. Every timing of every round is
kept; the ratio old ÷ new of the medians (above 1: the new commit is faster) goes to
``benchmarks/results/compare_commits.json`` (``--out``: another path) with both commits.
The refactor check of a restructuring is that no ratio falls far below 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: ``python -c PRELUDE script.py args…`` runs ``script.py`` as ``__main__`` (its folder first
#: on the path, as ``python script.py`` would) after keeping freed memory for reuse.
RUNTIME = REPO / "hiergraph" / "runtime.py"
PRELUDE = f"""
import importlib.util, pathlib, runpy, sys
spec = importlib.util.spec_from_file_location("_runtime", {str(RUNTIME)!r})
runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime)
runtime.reuse_freed_memory()
sys.argv = sys.argv[1:]
sys.path.insert(0, str(pathlib.Path(sys.argv[0]).resolve().parent))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def run_round(
    tree: Path, scratch: Path, cora_raw: Path | None, hsa_sizes: list[int] | None = None
) -> dict[str, float]:
    """One run of each benchmark from the checkout ``tree``: ``{case: seconds}``."""
    env = dict(os.environ, PYTHONPATH=str(tree), HIERGRAPH_DATA=str(scratch / "data"))

    def python(*args: str) -> None:
        subprocess.run([sys.executable, "-c", PRELUDE, *args], cwd=tree, env=env, check=True,
                       capture_output=True)  # fmt: skip

    times = {}
    sizes = ["--sizes", *map(str, hsa_sizes)] if hsa_sizes else ["--quick"]
    # The JSON goes to the scratch folder (a quick run without --out writes to a fresh
    # temporary one); a commit whose hsa_scaling.py has no --out writes into its own tree.
    scaling = scratch / "hsa_scaling.json"
    out = ["--out", str(scaling)]
    if "--out" not in (tree / "benchmarks/hsa_scaling.py").read_text():
        scaling, out = tree / "benchmarks/results/hsa_scaling.json", []
    python("benchmarks/hsa_scaling.py", *sizes, "--no-memory", *out)
    for row in json.loads(scaling.read_text())["rows"]:
        times[f"hsa_scaling {row['method']} N={row['n']}"] = row["forward_backward_s"]
        times[f"hsa_scaling {row['method']} forward N={row['n']}"] = row["forward_s"]
    python("benchmarks/masked_attention.py", "--quick", "--methods", "ours",
           "--out", str(scratch / "masked"))  # fmt: skip
    for case in json.loads((scratch / "masked/masked_attention.json").read_text())["cases"]:
        ours = case["methods"].get("ours", {})
        if "median_s" in ours:
            times[f"masked_attention {case['mask']} N={case['num_nodes']}"] = ours["median_s"]
    if cora_raw is not None:
        python("benchmarks/cone.py", "--raw-dir", str(cora_raw), "--reps", "20",
               "--out", str(scratch / "cone"))  # fmt: skip
        results = json.loads((scratch / "cone/cone.json").read_text())["results"]
        for part, methods in results.items():
            for method, stats in methods.items():
                if isinstance(stats, dict) and "median_ms" in stats:
                    times[f"cone {part} {method}"] = stats["median_ms"] / 1e3
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="the commit to compare against")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hsa-sizes", type=int, nargs="+", metavar="N", help="leaf counts of the HSA scaling run"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "compare_commits.json")
    args = parser.parse_args()
    raw = os.environ.get("HIERGRAPH_RAW")
    cora_raw = Path(raw) / "Cora" / "raw" if raw else None
    cora_raw = cora_raw if cora_raw is not None and cora_raw.is_dir() else None
    commits = {side: git("rev-parse", "--short", rev) for side, rev in
               (("old", args.old), ("new", args.new))}  # fmt: skip
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {side: Path(tmp) / side for side in commits}
        for side, tree in trees.items():
            git("worktree", "add", "--detach", str(tree), commits[side])
        try:
            for _ in range(args.rounds):
                for side, tree in trees.items():
                    scratch = Path(tmp) / f"scratch-{side}"
                    times = run_round(tree, scratch, cora_raw, args.hsa_sizes)
                    for case, seconds in times.items():
                        samples[side].setdefault(case, []).append(seconds)
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree))
    cases = sorted(set(samples["old"]) & set(samples["new"]))
    rows = [
        {"case": case, "old_s": samples["old"][case], "new_s": samples["new"][case],
         "old_over_new": statistics.median(samples["old"][case])
         / statistics.median(samples["new"][case])}
        for case in cases
    ]  # fmt: skip
    meta = {"old": commits["old"], "new": commits["new"], "rounds": args.rounds,
            "command": f"python benchmarks/compare_commits.py --old {commits['old']} "
                       f"--new {commits['new']} --rounds {args.rounds}"
                       + (" --hsa-sizes " + " ".join(map(str, args.hsa_sizes))
                          if args.hsa_sizes else ""),
            "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    for row in rows:
        print(f"{row['case']:<40} old ÷ new {row['old_over_new']:.2f}")


if __name__ == "__main__":
    main()
