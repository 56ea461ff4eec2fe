"""The report's section on zero-shot HSA in a pretrained encoder (its tables' cells are
shared with ``benchmarks/zeroshot.py``)."""

from __future__ import annotations

import math

from report_format import allocator, num, secs, table, threads
from report_results import load, merged, present, source


def _mcnemar(a: str, b: str) -> tuple[int, int, float]:
    """Exact McNemar test of two per-document bit strings: (only a, only b, two-sided p)."""
    only_a = sum(x == "1" and y == "0" for x, y in zip(a, b, strict=True))
    only_b = sum(x == "0" and y == "1" for x, y in zip(a, b, strict=True))
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return only_a, only_b, 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return only_a, only_b, min(1.0, 2 * tail)


ZS_METHODS = ("hsa", "block", "hsa_no_size_bias")
ZS_LAYERS = ("last1", "last2", "last3", "all")


def zs_tree_label(branching, hubs) -> str:
    """``16,8`` or ``16,8 +4 hubs``: a zero-shot row's window branching and hubs."""
    return ",".join(map(str, branching)) + (f" +{hubs} hubs" if hubs else "")


def _zs_configs(res: dict) -> dict:
    by = {}
    for r in res["runs"]:
        by[(r["layers"], tuple(r["branching"]), r.get("hubs", 0), r["method"])] = r
    keys = sorted({k[:3] for k in by}, key=lambda k: (ZS_LAYERS.index(k[0]), k[1:]))
    return {k: [by.get((*k, m)) for m in ZS_METHODS] for k in keys}


def zs_cells(runs, metric) -> str:
    """``a / b / c``: ``metric`` of the three methods, the best (ties included) in bold."""
    vals = [r.get(metric) for r in runs]
    if None in vals:
        return "–"
    text = [f"{v:.3f}" for v in vals]
    best = max(text)
    return " / ".join(f"**{t}**" if t == best else t for t in text)


def zeroshot() -> list[str] | None:
    files = [  # the documents' count comes from each file
        ("zeroshot_bbc.json", "BBC News, all articles"),
        ("zeroshot_imdb.json", "IMDB, a fixed class-balanced subset, half training, half test"),
        ("zeroshot_bbc_n200.json", "BBC News, a seeded sample"),
        ("zeroshot_imdb_n400.json", "IMDB, a seeded sample"),
        ("zeroshot_bbc_n48.json", "BBC News, a seeded sample (timing runs)"),
    ]
    out = [
        "all-MiniLM-L6-v2 with the attention of some layers replaced, no training. Each cell: "
        "**HSA / same-FLOPs block attention / HSA without log n(B)**, the best in bold. "
        "Cosine: sentence embedding vs the original; token cosine: last hidden states; probe: "
        "logistic regression retrained on each method's embeddings; frozen probe: trained on "
        "the original embeddings. FLOPs: attention FLOPs per replaced layer at the maximum "
        "length.",
        "",
    ]
    found = False
    for (name, label), res in present(files):
        found = True
        configs = _zs_configs(res)
        out += [
            f"**{label}** ({res['documents']:,} documents, {num(res['mean_tokens'])} tokens on "
            f"average, at most {res['max_tokens']}; original probe "
            f"{res['original']['probe']:.4f}; {threads(res['threads'])}):",
            "",
        ]
        body = []
        for (layers, branching, hubs), runs in configs.items():
            if None in runs:
                continue
            f = runs[0]["flops_per_layer_at_max_tokens"]
            body.append([
                layers, zs_tree_label(branching, hubs),
                *(zs_cells(runs, m) for m in ("cosine", "token_cosine", "self_retrieval",
                                              "probe", "frozen_probe")),
                f"{num(f['flat'] / f['method'])}× (block {runs[1]['block']})",
            ])  # fmt: skip
        out += table(
            ["layers", "branching", "cosine", "token cosine", "self-retrieval", "probe",
             "frozen probe", "fewer FLOPs than softmax"],
            body,
        )  # fmt: skip
        original = res["original"].get("probe_correct")
        tests = []
        for (layers, branching, hubs), runs in configs.items():
            if original is None or None in runs or any("probe_correct" not in r for r in runs):
                continue
            for probe in ("probe", "frozen_probe"):
                bits = [r[probe + "_correct"] for r in runs]
                cells = []
                for other in (*bits[1:], original):
                    a, b, p = _mcnemar(bits[0], other)
                    cells.append(f"{a}:{b}, p = {p:.2g}")
                tests.append([layers, zs_tree_label(branching, hubs), probe, *cells])
        if tests:
            out += ["Paired exact McNemar tests (documents only HSA gets right : documents only "
                    "the other gets right, two-sided p):", ""]  # fmt: skip
            out += table(["layers", "branching", "probe", "HSA vs block", "HSA vs no log n(B)",
                          "HSA vs original"], tests)  # fmt: skip
        timing = {k: v for k, v in res.get("timing", {}).items() if "flat_sdpa" in v}
        if timing:
            out += ["Attention op alone, last layer, one batch (trees and hub choice included); "
                    "medians of interleaved repetitions (rows without a count: 5, from before "
                    "the count was stored). HSA: the trees built for the batch and run by "
                    "`padded_hsa`; on the padded batch: what the injected layers run, "
                    "`padded_window_hsa` (`padded_hub_window_hsa` with hubs), the same "
                    "result:", ""]  # fmt: skip

            def maybe(t, key):
                return secs(t[key]) if key in t else "–"

            out += table(
                ["tree", "batch", "repeats", "flat SDPA", "HSA", "HSA on the padded batch",
                 "same, compiled (compile)", "HSA without log n(B)", "block", "allocator"],
                [[k, " × ".join(map(str, t["batch"])), t.get("repeats", "–"),
                  secs(t["flat_sdpa"]), secs(t["hsa"]),
                  maybe(t, "hsa_padded_windows"),
                  f"{maybe(t, 'hsa_padded_windows_compiled')} ({maybe(t, 'compile_s')})",
                  secs(t["hsa_no_size_bias"]), secs(t["block"]), allocator(t)]
                 for k, t in timing.items()],
            )  # fmt: skip
            phased = {k: t["hub_phases"] for k, t in timing.items() if "hub_phases" in t}
            if phased:
                phases = list(dict.fromkeys(name for ph in phased.values() for name in ph))
                out += ["Where the time of HSA on the padded batch goes with hubs (median CPU "
                        "time per call of each phase, timed in the same run; tree rows: the "
                        "rows of every tree's tokens and hubs; kernel: the compiled kernel "
                        "running the whole trees, where it applies; else root family, window "
                        "forest and gathers: the windows' tokens and the hubs taken from the "
                        "batch; rest: the tokens' order and, without the kernel, the outputs "
                        "written back; rows without tree rows or kernel: from before the "
                        "kernel):", ""]  # fmt: skip
                out += table(
                    ["tree", *phases, "sum"],
                    [[k, *(secs(ph[name]) if name in ph else "–" for name in phases),
                      secs(sum(ph.values()))]
                     for k, ph in phased.items()],
                )  # fmt: skip
        out += [f"{len(res['commands'])} command(s), stored in the file.", "", source(name), ""]
    fid = [(n, load(n)) for n in ("zeroshot_fidelity.json", "zeroshot_fidelity_hubs96.json")]
    fid = [(n, d) for n, d in fid if d is not None]
    if fid:
        found = True
        body = []
        for _, d in fid:
            tree = f"windows ({', '.join(map(str, d['branching']))})" + (
                f" + {d['hubs']} hubs" if d["hubs"] else "")  # fmt: skip
            body.append([tree, *(" / ".join(num(d[m][k], 2) for m in ZS_METHODS) for k in
                                 ("row_kl", "token_rel_error", "pooled_rel_error", "hub_mass")),
                         num(d["softmax_hub_mass"], 2)])  # fmt: skip
        d0 = fid[0][1]
        out += [f"**Attention-level fidelity**, last layer, {d0['documents']} documents of "
                f"{d0['tokens']} tokens (HSA / block / HSA without log n(B)):", ""]  # fmt: skip
        out += table(["tree", "row KL to softmax", "output error per token",
                      "error of the token mean", "mass on softmax's top-5% keys",
                      "softmax's own mass there"], body)  # fmt: skip
        out += [source(*(n for n, _ in fid)), ""]
    if not found:
        return None
    return out + merged("zeroshot.json", "zeroshot.png", "zero-shot")
