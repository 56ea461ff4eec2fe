"""The measured numbers of the README's table "Which method, when" and of the table of
docs/findings.md's "Summary" are the result files'.

Each claim is a passage of one of those tables that quotes measured numbers, and a function that
rewrites the passage from the JSON file under ``benchmarks/results/`` the benchmark wrote,
rounded as the page rounds it. A number typed by hand, or left behind when a benchmark is
rerun, fails its claim.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from functools import cache, partial
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # report.py's modules, as it imports them
from report_zeroshot import _mcnemar  # noqa: E402

#: page: its file and the heading of the section whose table quotes measured numbers
PAGES = {"readme": ("README.md", "Which method, when"), "findings": ("docs/findings.md", "Summary")}
SECTIONS = {
    page: (REPO / path).read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    for page, (path, heading) in PAGES.items()
}

#: Coneheads, Table 1: the paper's Cora accuracies (cited, not measured here)
PAPER_CORA = {"umbral[r=1]": 0.836, "penumbral": 0.835}

CLAIMS = []


def claim(quoted: str, source: str, page: str = "readme"):
    """Registers a claim: the passage of ``page``'s table, the file and field it comes from, and
    (the decorated function) the passage rewritten from that file."""

    def register(expected):
        CLAIMS.append(pytest.param(page, quoted, source, expected, id=expected.__name__))
        return expected

    return register


@cache
def result(name: str):
    return json.loads((REPO / "benchmarks" / "results" / name).read_text())


def sig(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant digits, whole digits kept: 0.78, 4.4, 51, 3,267."""
    return f"{x:,.{max(digits - 1 - math.floor(math.log10(abs(x))), 0)}f}"


def times(x: float, digits: int = 2) -> str:
    return f"{sig(x, digits)}×"


def acc(x: float) -> str:
    return f"{x:.3f}"


def pct(x: float, digits: int = 2) -> str:
    return f"{sig(100 * x, digits)}%"


def span(values, fmt=sig) -> str:
    return f"{fmt(min(values))}–{fmt(max(values))}"


def where(rows: list, **fields) -> list:
    """The ``rows`` whose ``fields`` have the given values (a missing field is ``None``)."""
    return [r for r in rows if all(r.get(k) == v for k, v in fields.items())]


def short(name: str, length: int, field: str = "flat_over") -> dict:
    """``field`` of the row of ``length``-token trees of an ``hsa_short`` result."""
    (row,) = where(result(name)["rows"], length=length)
    return row[field]


def runs_acc(name: str, label: str) -> float:
    return statistics.fmean(r["test_acc"] for r in result(name)["runs"] if r["label"] == label)


def model_acc(name: str, model: str) -> float:
    return result(name)["models"][model]["summary"]["test_acc"]["mean"]


def seeds(name: str) -> str:
    return span(result(name)["config"]["seeds"], str)


def kv(context: int, method: str) -> dict:
    (row,) = where(result("kv_cache.json")["rows"], context=context, method=method)
    return row


def cora(row: str) -> dict:
    return result("cone_cora_accuracy_p300.json")["rows"][row]


def cora_mean_std(row: str) -> str:
    return f"{acc(cora(row)['mean'])} ± {acc(cora(row)['std'])}"


def cone_short_by() -> list[float]:
    """How far umbral's and penumbral's mean Cora accuracies fall short of the paper's."""
    return [PAPER_CORA[name] - cora(name)["mean"] for name in PAPER_CORA]


def zeroshot_runs(**fields) -> list:
    return where(result("zeroshot_bbc.json")["runs"], **fields)


def hub_run(name: str = "zeroshot_bbc.json") -> dict:
    """The run of HSA in the last two layers over windows (2, 4, 8, 16) with 96 hubs."""
    (run,) = where(
        result(name)["runs"], method="hsa", layers="last2", branching=[2, 4, 8, 16], hubs=96
    )
    return run


def fewer_flops(run: dict) -> float:
    flops = run["flops_per_layer_at_max_tokens"]
    return flops["flat"] / flops["method"]


# HSA / HTE


@claim(
    "4.4× / 15× / 51× faster than flat SDPA",
    "hsa_short_2t.json: rows[128|512|2048].flat_over.hsa",
)
def hsa_short_avx512():
    ratios = " / ".join(times(short("hsa_short_2t.json", n)["hsa"]) for n in (128, 512, 2048))
    return f"{ratios} faster than flat SDPA"


@claim(
    "(AVX-512; AVX2: 2.5× / 6.9× / 17×, heads-first inputs 4.0× / 11× / 43×)",
    "hsa_short_2t_avx2.json: rows[length].flat_over.hsa, .hsa-heads-first",
)
def hsa_short_avx2():
    def ratios(method):
        return " / ".join(
            times(short("hsa_short_2t_avx2.json", n)[method]) for n in (128, 512, 2048)
        )

    return f"(AVX-512; AVX2: {ratios('hsa')}, heads-first inputs {ratios('hsa-heads-first')})"


def hsa_16k() -> str:
    """Flat SDPA's time over HSA's at 16K leaves (forward+backward)."""
    return times(result("hsa_scaling.json")["summary"]["16384"]["flat_over_hsa"])


def hsa_peak_mb(n: int) -> float:
    """HSA's peak memory (MiB) on ``n`` leaves."""
    (row,) = where(result("hsa_scaling.json")["rows"], n=n, method="hsa-window")
    return row["peak_mb"]


@claim("322× at 16K leaves", "hsa_scaling.json: summary[16384].flat_over_hsa")
def hsa_long():
    return f"{hsa_16k()} at 16K leaves"


@claim("256K leaves in 1.8 GiB", "hsa_scaling.json: rows[n=262144, hsa-window].peak_mb (MiB)")
def hsa_long_memory():
    return f"256K leaves in {sig(hsa_peak_mb(262144) / 1024)} GiB"


@claim(
    "0.401 vs flat 0.367 accuracy (Open Clip Art, seeds 0–4; 0.393 vs 0.377 on seeds 5–9)",
    "multimodal_hubs.json, multimodal.json, multimodal_hubs_seeds5-9.json: "
    "models[hsa|fsa].summary.test_acc.mean",
)
def multimodal():
    later = "multimodal_hubs_seeds5-9.json"
    return (
        f"{acc(model_acc('multimodal_hubs.json', 'hsa'))} vs flat "
        f"{acc(model_acc('multimodal.json', 'fsa'))} accuracy (Open Clip Art, seeds "
        f"{seeds('multimodal_hubs.json')}; {acc(model_acc(later, 'hsa'))} vs "
        f"{acc(model_acc(later, 'fsa'))} on seeds {seeds(later)})"
    )


@claim(
    "7.7× its time at 512",
    "gpu/gpu.json: rows[hsa, 32x512, bf16].ratio_to_hsa of sdpa-flash",
)
def gpu_short():
    (flash,) = where(
        result("gpu/gpu.json")["rows"],
        section="hsa", case="32x512", dtype="bf16", method="sdpa-flash",
    )  # fmt: skip
    return f"{times(1 / flash['ratio_to_hsa'])} its time at 512"


@claim(
    "only 2.4–2.6× faster than flat SDPA at 128 tokens (the compiled kernel: 4.4×)",
    "hsa_short_2t.json: rows[128].flat_over.hsa-torch, .hsa-compiled, .hsa",
)
def hsa_short_torch():
    row = short("hsa_short_2t.json", 128)
    return (
        f"only {span([row['hsa-torch'], row['hsa-compiled']])}× faster than flat SDPA at 128 "
        f"tokens (the compiled kernel: {times(row['hsa'])})"
    )


@claim(
    "IMDB 0.848 vs flat 0.854, 20 Newsgroups 0.696 (with 32 hub leaves) vs 0.718",
    "documents-select-imdb-e3.json, documents-select-imdb-e3-fsa.json, "
    "documents-select-20ng-e3.json: mean runs[label].test_acc",
)
def documents():
    ng = "documents-select-20ng-e3.json"
    return (
        f"IMDB {acc(runs_acc('documents-select-imdb-e3.json', 'HSA'))} vs flat "
        f"{acc(runs_acc('documents-select-imdb-e3-fsa.json', 'FSA-512'))}, "
        f"20 Newsgroups {acc(runs_acc(ng, 'HSA+hubs32'))} (with 32 hub leaves) vs "
        f"{acc(runs_acc(ng, 'FSA-512'))}"
    )


# causal HSA and the KV cache


@claim(
    "decode step 20 vs 71 µs for the flat cache at 1K context, 83 vs 3,267 µs at 64K",
    "kv_cache.json: rows[context, hierarchical|flat].cpu_mean_us",
)
def decode_step():
    def step(context):
        h, f = (kv(context, m)["cpu_mean_us"] for m in ("hierarchical", "flat"))
        return f"{sig(h)} vs {sig(f)} µs"

    return f"decode step {step(1024)} for the flat cache at 1K context, {step(65536)} at 64K"


@claim("cache 69 KiB vs 64 MiB at 64K", "kv_cache.json: rows[65536, hierarchical|flat].bytes")
def cache_size():
    h, f = (kv(65536, m)["bytes"] for m in ("hierarchical", "flat"))
    return f"cache {sig(h / 2**10)} KiB vs {sig(f / 2**20)} MiB at 64K"


def causal_speedup(length: int) -> str:
    median = short("hsa_short_2t.json", length, "median_s")
    return times(median["flat-causal"] / median["hsa-causal"])


@claim(
    "training 7.7× faster than flat causal SDPA at 2,048 tokens",
    "hsa_short_2t.json: rows[2048].median_s.flat-causal / .hsa-causal",
)
def causal_training_long():
    return f"training {causal_speedup(2048)} faster than flat causal SDPA at 2,048 tokens"


@claim(
    "training at 128 tokens only 1.4× faster than flat causal SDPA",
    "hsa_short_2t.json: rows[128].median_s.flat-causal / .hsa-causal",
)
def causal_training_short():
    return f"training at 128 tokens only {causal_speedup(128)} faster than flat causal SDPA"


@claim(
    "3.34–3.41 vs 3.69–3.70 bits/byte",
    "hierarchical_lm.json, hierarchical_lm_seed1.json, hierarchical_lm_seed2.json: "
    "results[hsa|flat].test_bits_per_byte",
)
def byte_lm():
    names = ("hierarchical_lm.json", "hierarchical_lm_seed1.json", "hierarchical_lm_seed2.json")

    def bits(model):
        return span(
            [result(n)["results"][model]["test_bits_per_byte"] for n in names],
            partial(sig, digits=3),
        )

    return f"{bits('hsa')} vs {bits('flat')} bits/byte"


@claim(
    "4.04 vs flat 3.86 bits/byte",
    "hierarchical_lm_avx2.json: results[hsa|flat].test_bits_per_byte",
)
def byte_lm_slower_cpu():
    bits = {
        m: r["test_bits_per_byte"]
        for m, r in result("hierarchical_lm_avx2.json")["results"].items()
    }
    return f"{sig(bits['hsa'], 3)} vs flat {sig(bits['flat'], 3)} bits/byte"


# H-matrix


def hmatrix_16k(baseline: str) -> list[str]:
    """``baseline``'s time over H-matrix attention's at 16K: bidirectional, causal."""
    ratios = result("hmatrix.json")["ratios"]
    return [times(ratios[f"L=16384,causal={c}"][baseline]) for c in ("False", "True")]


@claim(
    "31× (bidirectional) / 35× (causal) faster than flat SDPA at 16K",
    "hmatrix.json: ratios[L=16384,causal=False|True].sdpa",
)
def hmatrix_vs_sdpa():
    bi, causal = hmatrix_16k("sdpa")
    return f"{bi} (bidirectional) / {causal} (causal) faster than flat SDPA at 16K"


@claim(
    "1.4× / 2.8× faster than `h-transformer-1d`",
    "hmatrix.json: ratios[L=16384,causal=False|True].h-transformer-1d",
)
def hmatrix_vs_package():
    return f"{' / '.join(hmatrix_16k('h-transformer-1d'))} faster than `h-transformer-1d`"


@claim("a 90-second ListOps run", "hmatrix_listops.json: args.budget_seconds")
def listops_budget():
    return f"a {result('hmatrix_listops.json')['args']['budget_seconds']:g}-second ListOps run"


# cone attention


@claim(
    "umbral 0.834 ± 0.006, penumbral 0.831 ± 0.006 vs the paper's 0.836 / 0.835, 0.002–0.004 "
    "short (1–2 standard errors)",
    "cone_cora_accuracy_p300.json: rows[umbral[r=1]|penumbral].mean, .std",
)
def cone_cora():
    short_by = cone_short_by()
    errors = [
        s / (cora(name)["std"] / math.sqrt(len(cora(name)["test_accuracy"])))
        for s, name in zip(short_by, PAPER_CORA, strict=True)
    ]
    return (
        f"umbral {cora_mean_std('umbral[r=1]')}, penumbral {cora_mean_std('penumbral')} vs "
        f"the paper's {' / '.join(map(acc, PAPER_CORA.values()))}, {span(short_by, acc)} short "
        f"({span(errors, partial(sig, digits=1))} standard errors)"
    )


@claim("epoch 1.31–1.39× GATConv's", "cone.json: results.epoch[penumbral|umbral].ratio_to_gat")
def cone_epoch():
    epoch = result("cone.json")["results"]["epoch"]
    ratios = [epoch[m]["ratio_to_gat"] for m in ("penumbral", "umbral")]
    return f"epoch {span(ratios, partial(sig, digits=3))}× GATConv's"


@claim(
    "not distinguishable from GAT (0.832) or dot-product scores (0.831)",
    "cone_cora_accuracy_p300.json: rows[gat|dot].mean",
)
def cone_cora_baselines():
    return (
        f"not distinguishable from GAT ({acc(cora('gat')['mean'])}) or dot-product scores "
        f"({acc(cora('dot')['mean'])})"
    )


# relational masks


@claim(
    "window mask at 16K: 97× faster than `TransformerConv`, 21× less memory than dense masked "
    "SDPA; random masks 32× faster",
    "masked_attention_16k.json: cases[window|random].ratios",
)
def masks_16k():
    window, random = (
        where(result("masked_attention_16k.json")["cases"], mask=m)[0]["ratios"]
        for m in ("window", "random")
    )
    return (
        f"window mask at 16K: {times(window['transformer_conv_time_over_ours'])} faster than "
        f"`TransformerConv`, {times(window['dense_sdpa_peak_over_ours'])} less memory than "
        f"dense masked SDPA; random masks {times(random['transformer_conv_time_over_ours'])} "
        "faster"
    )


@claim(
    "(17–19 vs 24–30 MiB) and, for a random mask, about as much time (1.1× ours)",
    "masked_attention.json: cases[1024].methods[dense_sdpa|ours].peak_mib, "
    "cases[random, 1024].ratios.dense_sdpa_time_over_ours",
)
def masks_1k():
    cases = where(result("masked_attention.json")["cases"], num_nodes=1024)

    def peak(method):
        return span([c["methods"][method]["peak_mib"] for c in cases])

    (random,) = (c["ratios"] for c in where(cases, mask="random"))
    return (
        f"({peak('dense_sdpa')} vs {peak('ours')} MiB) and, for a random mask, about as much "
        f"time ({times(random['dense_sdpa_time_over_ours'])} ours)"
    )


# VCC


def vcc_row(n: int) -> dict:
    (row,) = where(result("vcc.json")["rows"], n=n, method="vcc")
    return row


def vcc_speedup() -> str:
    """Full attention's time over the VCC layer's at 16K tokens."""
    return times(result("vcc.json")["speedup_full_over_vcc"]["16384"])


def vip_error(inputs: str) -> str:
    return pct(vcc_row(16384)["errors"][inputs]["vip_update_rel_error"])


def vcc_peak_128k() -> str:
    return f"{sig(vcc_row(131072)['peak_mib'])} MiB"


@claim(
    "27× faster than full attention, VIP update error 1.4% (on synthetic "
    "trained-like inputs; 5.5% on random ones); 128K tokens in 640 MiB",
    "vcc.json: speedup_full_over_vcc[16384], rows[vcc, 16384].errors, rows[vcc, 131072].peak_mib",
)
def vcc_layer():
    return (
        f"{vcc_speedup()} faster than full attention, VIP update error "
        f"{vip_error('trained_like')} (on synthetic trained-like inputs; {vip_error('iid')} on "
        f"random ones); 128K tokens in {vcc_peak_128k()}"
    )


@claim(
    "10% vs full attention's 86% at 16K tokens (chance 12.5%)",
    "vcc_long_qa.json: results[vcc|full].accuracy, .chance",
)
def vcc_long_qa():
    vcc, full = result("vcc_long_qa.json")["results"]
    return (
        f"{pct(vcc['accuracy'])} vs full attention's {pct(full['accuracy'])} at 16K tokens "
        f"(chance {pct(vcc['chance'], 3)})"
    )


# graph HSA


@claim(
    "1M nodes in about 8 GiB; 49× faster than full-attention GPS at 100K nodes",
    "graph_hsa.json: rows[1000000].methods.hsa_hybrid[].process_peak_mib; "
    "graph_hsa_full_attention_100k.json: rows[0].speedup_vs_gps_full",
)
def graph_hsa_scale():
    (million,) = where(result("graph_hsa.json")["rows"], n=1_000_000)
    peak = max(run["process_peak_mib"] for run in million["methods"]["hsa_hybrid"])
    speedup = result("graph_hsa_full_attention_100k.json")["rows"][0]["speedup_vs_gps_full"]
    return (
        f"1M nodes in about {sig(peak / 1024, 1)} GiB; {times(speedup)} faster than "
        "full-attention GPS at 100K nodes"
    )


@claim(
    "Cora accuracy: 0.826 vs GAT's 0.832 (patience 300, 10 seeds)",
    "node_classification_p300.json: [cora/hsa_hybrid[gat,hsa-dropout=0.6]|cora/gat].mean",
)
def graph_hsa_cora():
    rows = result("node_classification_p300.json")
    hybrid, gat = rows["cora/hsa_hybrid[gat,hsa-dropout=0.6]"], rows["cora/gat"]
    return (
        f"Cora accuracy: {acc(hybrid['mean'])} vs GAT's {acc(gat['mean'])} (patience 300, "
        f"{hybrid['num_seeds']} seeds)"
    )


# zero-shot HSA


@claim(
    "5.1–30× fewer attention FLOPs",
    "zeroshot_bbc.json: runs[method=hsa].flops_per_layer_at_max_tokens",
)
def zeroshot_flops():
    return f"{span([fewer_flops(r) for r in zeroshot_runs(method='hsa')])}× fewer attention FLOPs"


@claim(
    "cosine 0.984 to the original embedding, probe 0.973 vs 0.972, 5.7× fewer FLOPs; 0.78× "
    "SDPA's time at 256 tokens",
    "zeroshot_bbc.json: runs[hsa, last2, 2,4,8,16, 96 hubs], original.probe; "
    "zeroshot_bbc_n48.json: timing[2,4,8,16 +96 hubs]",
)
def zeroshot_hubs():
    bbc = result("zeroshot_bbc.json")
    run = hub_run()
    timing = result("zeroshot_bbc_n48.json")["timing"]["2,4,8,16 +96 hubs"]
    return (
        f"cosine {acc(run['cosine'])} to the original embedding, probe {acc(run['probe'])} vs "
        f"{acc(bbc['original']['probe'])}, {times(fewer_flops(run))} fewer FLOPs; "
        f"{times(timing['hsa_padded_windows'] / timing['flat_sdpa'])} SDPA's time at "
        f"{bbc['max_tokens']} tokens"
    )


@claim(
    "fixed windows alone: cosine 0.777",
    "zeroshot_bbc.json: runs[hsa, last2, 2,4,8,16, no hubs].cosine",
)
def zeroshot_windows():
    (run,) = zeroshot_runs(method="hsa", layers="last2", branching=[2, 4, 8, 16], hubs=None)
    return f"fixed windows alone: cosine {acc(run['cosine'])}"


@claim(
    "same-FLOPs block attention gives a better retrained probe (on all 3 trees; significantly "
    "on 2)",
    "zeroshot_bbc.json: runs[last3, 96 hubs, hsa|block].probe, .probe_correct (McNemar)",
)
def zeroshot_last3():
    pairs = [
        (hsa, block)
        for hsa in zeroshot_runs(method="hsa", layers="last3")
        for block in zeroshot_runs(method="block", layers="last3", branching=hsa["branching"])
    ]
    better = [(h, b) for h, b in pairs if b["probe"] > h["probe"]]
    significant = sum(_mcnemar(h["probe_correct"], b["probe_correct"])[2] < 0.05 for h, b in better)
    trees = f"all {len(pairs)}" if len(better) == len(pairs) else f"{len(better)} of {len(pairs)}"
    return (
        f"same-FLOPs block attention gives a better retrained probe (on {trees} trees; "
        f"significantly on {significant})"
    )


# docs/findings.md, Summary


@claim(
    "322× faster than flat SDPA at 16K leaves (forward+backward, 2 threads), memory ~2× per "
    "doubling",
    "hsa_scaling.json: summary[16384].flat_over_hsa, meta.threads, rows[n, hsa-window].peak_mb",
    page="findings",
)
def findings_hsa():
    scaling = result("hsa_scaling.json")
    first, *_, last = sorted(r["n"] for r in where(scaling["rows"], method="hsa-window"))
    per_doubling = (hsa_peak_mb(last) / hsa_peak_mb(first)) ** (1 / math.log2(last / first))
    return (
        f"{hsa_16k()} faster than flat SDPA at 16K leaves (forward+backward, "
        f"{scaling['meta']['threads']} threads), memory ~{times(per_doubling, 1)} per doubling"
    )


@claim(
    "FSA on 512 tokens beats HSA by 2.2 points (1 epoch) and 0.5 points (3 epochs)",
    "documents_imdb.json, documents-select-imdb-e3.json, documents-select-imdb-e3-fsa.json: "
    "mean runs[FSA-512].test_acc - mean runs[HSA].test_acc",
    page="findings",
)
def findings_imdb():
    def lead(hsa, fsa):
        return f"{100 * (runs_acc(fsa, 'FSA-512') - runs_acc(hsa, 'HSA')):.1f} points"

    one = lead("documents_imdb.json", "documents_imdb.json")
    three = lead("documents-select-imdb-e3.json", "documents-select-imdb-e3-fsa.json")
    return f"FSA on 512 tokens beats HSA by {one} (1 epoch) and {three} (3 epochs)"


@claim(
    "HSA ahead with 4 hub leaves",
    "multimodal_hubs.json: config.hubs, models[hsa]; multimodal.json: models[fsa]",
    page="findings",
)
def findings_multimodal():
    ahead = model_acc("multimodal_hubs.json", "hsa") > model_acc("multimodal.json", "fsa")
    hubs = result("multimodal_hubs.json")["config"]["hubs"]
    return f"HSA {'ahead' if ahead else 'behind'} with {hubs} hub leaves"


@claim(
    "2 late interleaved layers: probes within about half a point of the original with 5.7× "
    "fewer FLOPs when 96 hub tokens are added",
    "zeroshot_bbc.json, zeroshot_imdb.json: runs[hsa, last2, 2,4,8,16, 96 hubs].probe, "
    ".frozen_probe, original.probe; zeroshot_bbc.json: that run's FLOPs",
    page="findings",
)
def findings_zeroshot():
    points = 100 * max(
        abs(hub_run(name)[probe] - result(name)["original"]["probe"])
        for name in ("zeroshot_bbc.json", "zeroshot_imdb.json")
        for probe in ("probe", "frozen_probe")
    )
    run = hub_run()
    return (
        f"{len(run['layer_ids'])} late interleaved layers: probes within about "
        f"{'half a' if round(2 * points) == 1 else sig(points, 1)} point of the original with "
        f"{times(fewer_flops(run))} fewer FLOPs when {run['hubs']} hub tokens are added"
    )


@claim(
    "31× / 35× faster than flat SDPA at 16K, memory 1/48 of the $L^2$ matrix at 64K",
    "hmatrix.json: ratios[L=16384,causal=False|True].sdpa, "
    "ratios[L=65536,causal=False].memory_fraction_of_L^2_matrix",
    page="findings",
)
def findings_hmatrix():
    memory = result("hmatrix.json")["ratios"]["L=65536,causal=False"]
    return (
        f"{' / '.join(hmatrix_16k('sdpa'))} faster than flat SDPA at 16K, memory "
        f"1/{sig(1 / memory['memory_fraction_of_L^2_matrix'])} of the $L^2$ matrix at 64K"
    )


@claim(
    "0.831 ± 0.006 and 0.834 ± 0.006 (10 seeds), no better than GAT or dot | not reproduced "
    "(0.002–0.004 short)",
    "cone_cora_accuracy_p300.json: rows[penumbral|umbral[r=1]].mean, .std, .seeds",
    page="findings",
)
def findings_cone():
    return (
        f"{cora_mean_std('penumbral')} and {cora_mean_std('umbral[r=1]')} "
        f"({len(cora('umbral[r=1]')['seeds'])} seeds), no better than GAT or dot | not "
        f"reproduced ({span(cone_short_by(), acc)} short)"
    )


@claim(
    "27× faster than full at 16K (two machines), 128K in 640 MiB, VIP update error 1.4% "
    "(synthetic trained-like inputs)",
    "vcc.json: speedup_full_over_vcc[16384], rows[vcc, 131072].peak_mib, "
    "rows[vcc, 16384].errors.trained_like (the 21× of the other machine is not committed)",
    page="findings",
)
def findings_vcc():
    return (
        f"{vcc_speedup()} faster than full at 16K (two machines), 128K in {vcc_peak_128k()}, "
        f"VIP update error {vip_error('trained_like')} (synthetic trained-like inputs)"
    )


@pytest.mark.parametrize(("page", "quoted", "source", "expected"), CLAIMS)
def test_tables_quote_the_result_files(page, quoted, source, expected):
    text = expected()
    path, heading = PAGES[page]
    assert text in SECTIONS[page], (
        f"{path}, {heading!r} should say {text!r} (from {source}); "
        f"the claim was written for {quoted!r}"
    )
