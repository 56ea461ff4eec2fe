"""The report's GPU section: the targets, the runs of ``benchmarks/gpu.py``, their
profiles and CUDA-graph twins."""

from __future__ import annotations

import re

import gpu_targets as targets
from report_format import code, num, ratio, spread, table
from report_results import load, source, sourced


def gpu_table(d: dict) -> list[str]:
    """One row per (section, case, dtype, method) of a ``gpu.py`` run. Memory: the absolute
    peak (all live tensors, the case's other methods' too), what the step added above the
    level before it (its inputs and their gradients excluded), and the step's own footprint
    where the run recorded it."""

    def mib(row: dict, key: str) -> str:
        return num(row[key]) if row.get(key) is not None else "–"

    body = []
    for r in d["rows"]:
        base = next((k for k in r if k.startswith("ratio_to_")), None)
        if r["status"] == "ok":
            times = spread([t / 1e3 for t in r.get("times_ms", [])])
            memory = [mib(r, "peak_mib"), mib(r, "peak_above_mib"), mib(r, "footprint_mib")]
            rel = f"{ratio(r[base])} ({base.removeprefix('ratio_to_')})" if base else "–"
        else:
            times, memory, rel = f"{r['status']}: {r.get('reason', '')}", ["–"] * 3, "–"
        body.append([r["section"], r["case"], r["dtype"], r["method"], times, *memory, rel])
    return table(["section", "case", "dtype", "method", "forward+backward", "peak MiB",
                  "step's rise MiB", "own footprint MiB", "time ÷ the case's first method"],
                 body)  # fmt: skip


def gpu_profiles(d: dict) -> list[str]:
    """The profiled rows of a ``gpu.py`` run: per step, the kernels (operators on a CPU)
    launched, their summed time, the wall time and the three that took longest."""
    body = [
        [r["case"], r["dtype"], r["method"], f"{num(p['per_step'])} {p['unit']}",
         f"{p['busy_ms']:.3g} ms", f"{p['wall_ms']:.3g} ms",
         "; ".join(f"{code(t['name'][:60])} ×{t['calls']:g} {t['ms']:.3g} ms"
                   for t in p["top"][:3])]
        for r in d["rows"] if (p := r.get("profile"))
    ]  # fmt: skip
    if not body:
        return []
    return [
        "Where the time goes (`torch.profiler`, three steps, per step): the kernels launched "
        "(operators on a CPU), their summed time, the step's wall time, and the three that "
        "took longest.",
        "",
        *table(
            ["case", "dtype", "method", "launched", "their time", "wall", "longest three"], body
        ),  # fmt: skip
    ]


def gpu_run(d: dict) -> list[str]:
    """The device, the command, the CUDA tests' counts and sections that did not finish."""
    meta, tests = d["meta"], d.get("tests", {})
    out = [
        f"Device: {meta.get('device_name', meta.get('device'))}; torch {meta.get('torch')}, "
        f"CUDA {meta.get('cuda')}; command {code(str(meta.get('command', '')))}; sources "
        f"{code(str(meta.get('source_sha1', '?')))}. Methods of a case ran in interleaved "
        "rounds; cells are median [min–max] over the rounds. Memory: *peak* counts every "
        "live tensor, the case's other methods' too; *the step's rise* is what one step "
        "allocated above the level before it (its own inputs and their gradients not "
        "included); *own footprint*, where recorded, is the step alone (its rise plus its "
        "inputs and gradients).",
        "",
    ]
    if counts := pytest_counts(tests):
        out += [f"`pytest -m cuda`: {counts}.", ""]
    compiled = d["sections"].get("compiled", {})
    if counts := pytest_counts(compiled):
        out += [f"Compiled by inductor vs eager (`{compiled['command']}`): {counts}.", ""]
    unfinished = [name for name, sec in d["sections"].items() if sec.get("status") == "running"]
    if unfinished:
        out += [f"Sections the process ended in before finishing: {', '.join(unfinished)} "
                "(rows after the last one shown were not measured).", ""]  # fmt: skip
    return out


def pytest_counts(run: dict) -> str:
    """``passed N, failed N, …`` of a pytest run recorded by ``benchmarks/gpu.py``."""
    keys = ("passed", "failed", "errors", "skipped")
    return ", ".join(f"{k} {run[k]}" for k in keys if k in run)


def gpu_targets_table(runs: list[tuple[dict, str]]) -> list[str]:
    """The targets of ``benchmarks/gpu_targets.py`` on each ``(run, twin)``: eager steps
    (``twin = ""``) and the CUDA-graph twins (``"+graph"``), one column each."""
    results = [targets.evaluate(d, twin) for d, twin in runs]
    cells = {}  # (target, dtype) -> one cell per run
    for i, rows in enumerate(results):
        for t in rows:
            cell = cells.setdefault((t["target"], t["dtype"], t["need"]), ["–"] * len(runs))
            if t["met"] is None:
                cell[i] = "not measured"
            else:
                value = f"{num(t['value'])}{t['unit']}" if t["unit"] else num(t["value"])
                note = f", {t['why']}" if t.get("why") else ""
                cell[i] = f"{'met' if t['met'] else '**not met**'}: {value}{note}"
    header = ["target", "dtype", "needs", *(("eager", "CUDA graph")[: len(runs)])]
    body = [[target, dtype, need, *cell] for (target, dtype, need), cell in cells.items()]
    return [
        "Targets (`benchmarks/gpu_targets.py`), from the runs below: each method against its "
        "peer in the same case; *CUDA graph*: the steps replayed as captured graphs (a peer "
        "without a twin counts with its eager step, as named).",
        "",
        *table(header, body),
    ]


def gpu() -> list[str]:
    d = load("gpu/gpu.json")
    if d is None:
        return ["No GPU run is recorded (`results/gpu/gpu.json` is absent). "
                "`python benchmarks/gpu.py --out benchmarks/results/gpu` on a CUDA machine "
                "writes it; this section then shows its tables.", ""]  # fmt: skip
    graphs = load("gpu/graphs/gpu.json")
    runs = [(d, "")] + ([] if graphs is None else [(graphs, "+graph")])
    out = gpu_targets_table(runs) + gpu_run(d) + gpu_table(d) + [""] + gpu_profiles(d)
    out += sourced("gpu/gpu.json", "GPU")
    if graphs is not None:
        out += ["", "### CUDA-graph twins", "",
                "The same cases with `--graphs`: `name+graph` replays the method's whole step "
                "(forward and backward) captured as one CUDA graph.", ""]  # fmt: skip
        out += gpu_run(graphs) + crashed(d["sections"].get("graphs", {}))
        out += gpu_table(graphs) + [source("gpu/graphs/gpu.json"), ""]
    return out


def crashed(section: dict) -> list[str]:
    """Why a section's subprocess exited with an error: its last exception line and the
    first device-side assertion in its log, if any."""
    if section.get("status") != "error":
        return []
    lines = str(section.get("reason", "")).splitlines()
    error = next((x for x in reversed(lines) if re.match(r"[\w.]+(Error|Exception)\b", x)), "")
    asserted = next((x for x in lines if "Assertion" in x), "")
    why = "; ".join(code(x.strip()) for x in (error, asserted.split(": ", 1)[-1]) if x)
    return [f"The process exited with code {section.get('returncode')}: {why or 'no message'}.", ""]
