"""The GPU check's targets, evaluated on the rows of one ``benchmarks/gpu.py`` run.

    python benchmarks/gpu_targets.py benchmarks/results/gpu/gpu.json   # print them

Each target compares a method with its peer in the same case, as the run timed them side by
side (medians of interleaved rounds), or a step's own memory footprint with a budget:

* every CUDA test passes (``pytest -m cuda``, whose checks include no host synchronisation in
  any op's forward or backward);
* HSA, forward+backward in bf16: at least 50× faster than flash SDPA at 256K leaves, at most
  2× the per-level bound at every size, and not slower than flash SDPA at 32 × 512; the
  last two also for the opt-in Triton kernels (``hsa-triton``) up to 16K leaves, which
  decide whether they become the default;
* the 1M-leaf HSA step and the 1M-node ``GraphHSANet`` step fit in 40 GiB;
* H-matrix attention at 64K tokens at least 10× faster than SDPA; one VCC layer at 128K at
  least 10× faster than the full layer; ``MaskedAttentionConv`` at least 5× faster than
  ``TransformerConv`` on the window mask at 64K nodes (each in every dtype); the first also
  in bf16 with float32 matrix products on TF32 tensor cores (``hmatrix-tf32``), which
  decides whether bf16 inputs should be computed that way inside.

With ``twin="+graph"`` the timed targets are read from the CUDA-graph twins of a ``--graphs``
run (every step captured once and replayed: no launch cost); a method that has no twin there
(a peer that is not launch-bound: SDPA at 64K, ``TransformerConv``) counts with its eager
step, and the target says so.

A target a run did not measure (a run off CUDA, a smaller ``--quick`` size, a skipped
method, a section cut by its time cap, CUDA tests other than ``pytest -m cuda``) is reported
as such, never as met. Standard library only: the benchmarks report imports it too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1024.0  # MiB
DTYPES = ("fp32", "bf16")
#: the per-level bound applies to every HSA case of equal trees (the batches, single trees)
HSA_SIZES = ("64x128", "32x512", "8x2048", "1x16384", "1x262144", "1x1048576")


def evaluate(run: dict, twin: str = "") -> list[dict]:
    """The targets of ``run`` (a ``gpu.json``), one dict each: ``target`` (in words),
    ``dtype``, ``value`` (the measured ratio, or GiB), ``need`` (``"≥ x"`` or ``"≤ x"``),
    and ``met``: ``True``, ``False``, or ``None`` where the run did not measure it (``why``
    says what is missing)."""
    on_cuda = str(run.get("meta", {}).get("device", "")).startswith("cuda")
    rows = {(r["section"], r["case"], r["dtype"], r["method"]): r for r in run.get("rows", [])}
    out = [] if twin else [_tests(run.get("tests", {}))]

    def timed(section, case, dtype, method) -> tuple[dict, str]:
        """The row of ``method`` (its twin where the run has one) and the name used."""
        for name in (method + twin, method) if twin else (method,):
            if rows.get((section, case, dtype, name), {}).get("median_ms"):
                return rows[(section, case, dtype, name)], name
        return {}, method + twin

    def compare(target, section, case, dtype, ours, peer, sign, bound):
        """``peer / ours`` (``>=``: how many times faster ours is) or ``ours / peer``
        (``<=``: how many times slower) against ``bound``."""
        (mine, name), (theirs, peer_name) = (timed(section, case, dtype, m) for m in (ours, peer))
        value = _quotient(theirs, mine) if sign == ">=" else _quotient(mine, theirs)
        row = _check(target, dtype, value, sign, bound, (name, peer_name))
        both_twins = name.endswith(twin) and peer_name.endswith(twin)
        if twin and value is not None and not both_twins:
            row["why"] = f"{name} vs {peer_name}"
        out.append(row)

    def faster(target, section, case, dtype, ours, peer, at_least):
        compare(target, section, case, dtype, ours, peer, ">=", at_least)

    def slower(target, section, case, dtype, ours, peer, at_most):
        compare(target, section, case, dtype, ours, peer, "<=", at_most)

    faster("HSA ≥ 50× flash SDPA, 256K leaves", "hsa", "1x262144", "bf16", "hsa",
           "sdpa-flash", 50)  # fmt: skip
    for case in HSA_SIZES:
        slower(f"HSA ≤ 2× the per-level bound, {case}", "hsa", case, "bf16", "hsa",
               "level-bound", 2)  # fmt: skip
    slower("HSA not slower than flash SDPA, 32x512", "hsa", "32x512", "bf16", "hsa",
           "sdpa-flash", 1)  # fmt: skip
    for case in HSA_SIZES[:4]:  # the opt-in Triton kernels (gpu.py's "triton" section)
        slower(f"HSA, Triton kernels, ≤ 2× the per-level bound, {case}", "triton", case,
               "bf16", "hsa-triton", "level-bound", 2)  # fmt: skip
    slower("HSA, Triton kernels, not slower than flash SDPA, 32x512", "triton", "32x512",
           "bf16", "hsa-triton", "sdpa-flash", 1)  # fmt: skip
    faster("H-matrix, TF32 matmuls, ≥ 10× SDPA, 64K tokens", "hmatrix", "L=65536", "bf16",
           "hmatrix-tf32", "sdpa", 10)  # fmt: skip
    for dtype in DTYPES:
        if not twin:  # a replayed graph's memory is its private pool: no footprint
            for target, key in (
                ("1M-leaf HSA fits in 40 GiB", ("hsa", "1x1048576", dtype, "hsa")),
                ("1M-node GraphHSANet fits in 40 GiB",
                 ("graph_hsa", "n=1000000", dtype, "graph_hsa_net")),
            ):  # fmt: skip
                footprint = rows.get(key, {}).get("footprint_mib")
                gib = None if footprint is None else footprint / GIB
                out.append(_check(target, dtype, gib, "<=", 40, (key[3],), " GiB"))
        faster("H-matrix ≥ 10× SDPA, 64K tokens", "hmatrix", "L=65536", dtype, "hmatrix",
               "sdpa", 10)  # fmt: skip
        faster("VCC layer ≥ 10× the full layer, 128K tokens", "vcc", "n=131072", dtype,
               "vcc-layer", "full-layer", 10)  # fmt: skip
        faster("MaskedAttentionConv ≥ 5× TransformerConv, window mask, 64K nodes", "masked",
               "window n=65536", dtype, "ours", "transformer_conv", 5)  # fmt: skip
    if not on_cuda:  # the targets are a GPU's
        out = [t | {"value": None, "met": None, "why": "not a CUDA run"} for t in out]
    return out


def _tests(tests: dict) -> dict:
    row = {"target": "every CUDA test passes", "dtype": "–", "need": "0 failed", "unit": ""}
    complete = tests.get("status") == "done" and tests.get("passed")
    if not complete or "-m cuda" not in tests.get("command", ""):
        return row | {"value": None, "met": None, "why": "no completed `pytest -m cuda` run"}
    bad = tests.get("failed", 0) + tests.get("errors", 0)
    return row | {"value": bad, "met": bad == 0, "why": f"{tests['passed']} passed"}


def _quotient(a: dict, b: dict) -> float | None:
    """``a``'s median time over ``b``'s, where both were measured."""
    if a.get("median_ms") and b.get("median_ms"):
        return a["median_ms"] / b["median_ms"]
    return None


def _check(target, dtype, value, sign, bound, methods, unit="×") -> dict:
    row = {"target": target, "dtype": dtype, "value": value}
    row["need"] = f"{'≥' if sign == '>=' else '≤'} {bound:g}"
    row["unit"] = unit
    if value is None:
        return row | {"met": None, "why": f"{' or '.join(methods)} not measured in this run"}
    return row | {"met": value >= bound if sign == ">=" else value <= bound, "why": ""}


def lines(targets: list[dict]) -> list[str]:
    """``targets`` as text lines, one a target: met / NOT MET / not measured."""
    out = []
    for t in targets:
        state = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        value = "–" if t["value"] is None else f"{t['value']:.3g}{t['unit']}"
        note = f" ({t['why']})" if t.get("why") else ""
        out.append(f"{state:<13} {t['target']:<62} {t['dtype']:<4} {value:>9} {t['need']}{note}")
    return out


if __name__ == "__main__":
    report = json.loads(Path(sys.argv[1]).read_text())
    print("\n".join(lines(evaluate(report))))
