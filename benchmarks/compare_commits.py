"""Speed of two commits side by side: the quick HSA, masked-attention and cone benchmarks.

    python benchmarks/compare_commits.py --old REV [--new REV] [--rounds 3]

Checks both commits out into temporary git worktrees and runs, in every round, each
benchmark once from the old tree and once from the new one (interleaved, so both see the
same machine load):

* ``benchmarks/hsa_scaling.py --quick --no-memory`` (forward+backward of each method, and
  its forward alone under ``torch.no_grad()``),
* ``benchmarks/masked_attention.py --quick --methods ours`` (the layer, steady state),
* ``benchmarks/cone.py --reps 20`` (CPU time of a layer and of an epoch; needs Cora's raw
  files in ``$HIERGRAPH_RAW/Cora/raw``, else it is left out).

Every timing of every round is kept; the ratio old ÷ new of the medians (above 1: the new
commit is faster) goes to ``benchmarks/results/compare_commits.json`` with both commits.
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


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def run_round(tree: Path, scratch: Path, cora_raw: Path | None) -> dict[str, float]:
    """One run of each benchmark from the checkout ``tree``: ``{case: seconds}``."""
    env = dict(os.environ, PYTHONPATH=str(tree), HIERGRAPH_DATA=str(scratch / "data"))

    def python(*args: str) -> None:
        subprocess.run([sys.executable, *args], cwd=tree, env=env, check=True,
                       capture_output=True)  # fmt: skip

    times = {}
    python("benchmarks/hsa_scaling.py", "--quick", "--no-memory")
    for row in json.loads((tree / "benchmarks/results/hsa_scaling.json").read_text())["rows"]:
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
                    times = run_round(tree, Path(tmp) / f"scratch-{side}", cora_raw)
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
                       f"--new {commits['new']} --rounds {args.rounds}",
            "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    for row in rows:
        print(f"{row['case']:<40} old ÷ new {row['old_over_new']:.2f}")


if __name__ == "__main__":
    main()
