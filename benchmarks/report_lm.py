"""The report's sections on language models: the hierarchical KV cache, prefilling it
with a prompt and the byte-level language model."""

from __future__ import annotations

from report_format import allocator, code, num, ratio, spread, table, threads
from report_results import load, plot, present, source, sourced


def kv_cache() -> list[str] | None:
    d = load("kv_cache.json")
    if d is None:
        return None
    meta = d["meta"]
    methods = list(dict.fromkeys(r["method"] for r in d["rows"]))
    alone = [m for m in methods if m.endswith("_alone")]
    evicted = [m for m in methods if m.endswith("_evicted")]
    interleaved = [m for m in methods if m not in alone + evicted]
    out = [
        f"Decode step of one attention layer ({meta['heads']} heads × {meta['head_dim']}, "
        f"{meta['dtype']}, {threads(meta['threads'])}, {allocator(meta)}), tree "
        f"{code(meta['tree'])}; at each "
        f"context length the next {meta['timed_tokens_per_context']} tokens are timed one by "
        "one, the caches interleaved token by token"
        + (
            f" ({', '.join(interleaved)}), then "
            f"{meta.get('alone_tokens_per_context', '?')} more tokens with each cache in a "
            f"block of its own ({', '.join(alone)})"
            if alone
            else ""
        )
        + (
            f", then {meta['evicted_tokens_per_context']} more with a read of "
            f"{meta['evict_bytes'] >> 20} MiB (the same at every context) before each "
            f"step, from cold CPU caches ({', '.join(evicted)})"
            if evicted
            else ""
        )
        + (
            ". `torch_op` is no cache: one in-place addition on 4 values, timed as a step, the"
            " least any step that calls PyTorch costs in each protocol"
            if "torch_op" in methods
            else ""
        )
        + f". Only the mean and the median per token are stored. Command: "
        f"{code(meta['command'])}.",
        "",
    ]
    body = []
    for r in sorted(d["rows"], key=lambda r: (r["context"], methods.index(r["method"]))):
        body.append([
            f"{r['context']:,}", r["method"],
            f"{num(r['cpu_median_us'])} / {num(r['cpu_mean_us'])}",
            f"{num(r['median_us'])} / {num(r['mean_us'])}", f"{num(r['bytes'] / 1024)} KiB",
        ])  # fmt: skip
    out += table(
        ["context", "cache", "CPU µs/token, median / mean", "wall µs/token, median / mean",
         "cache size"],
        body,
    )  # fmt: skip
    spans = sorted({k.rsplit("growth_", 1)[1] for k in d["summary"]})
    for span in spans:
        out += [f"Growth from context {span.replace('_to_', ' to ')}:", ""]
        out += table(
            ["quantity", *methods],
            [[q.replace("_", " "),
              *(ratio(d["summary"].get(f"{m}_{q}_growth_{span}")) for m in methods)]
             for q in ("cpu_median_us", "cpu_mean_us", "median_us", "mean_us", "bytes")],
        )  # fmt: skip
    return out + sourced("kv_cache.json", "KV cache")


def kv_prefill() -> list[str] | None:
    data = load("kv_prefill.json")
    if data is None:
        return None
    meta = data["meta"]
    out = [
        f"One attention layer ({meta['heads']} heads × {meta['head_dim']}, {meta['dtype']}, "
        f"{threads(meta['threads'])}, {allocator(meta)}) starts from an empty cache with a "
        f"prompt of T tokens ({meta['tree']}) and returns the prompt's outputs. `prefill`: "
        "`HierarchicalKVCache.prefill` (one full causal pass, in the compiled causal kernel); "
        "`prefill_torch`: the same pass on PyTorch operations (its edge lists: no C++ "
        "compiler, accelerators); `append`: "
        "T calls of `append`, each step in the compiled CPU kernel; `append_torch`: the same "
        "loop on PyTorch operations (no C++ compiler, accelerators); `flat`: causal SDPA over "
        "the prompt and `FlatKVCache.extend`. Cells: median [min–max] over the interleaved "
        f"rounds. Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for row in data["rows"]:
        length = f"{row['length']:,}"
        for method, samples in row["samples_s"].items():
            per_token, over = row["per_token_us"][method], row["over_prefill"][method]
            body.append(
                [length, method, row["rounds"], spread(samples), num(per_token), ratio(over)]
            )
            length = ""
    out += table(["T", "method", "rounds", "wall", "µs per token", "method ÷ prefill"], body)
    out += [
        f"Largest output difference between a prefilled and an appended cache over the prompt "
        f"and the next {meta['checked_tokens']} decoded tokens, per row: "
        + ", ".join(num(r["max_abs_diff"], 2) for r in data["rows"])
        + ".",
        "",
    ]
    return out + sourced("kv_prefill.json", "KV cache prefill")


#: The byte-level LM's result files: the run the guide describes, two more seeds and the
#: same command on another machine.
LM_RUNS = (
    "hierarchical_lm.json",
    "hierarchical_lm_seed1.json",
    "hierarchical_lm_seed2.json",
    "hierarchical_lm_avx2.json",
)


def hierarchical_lm() -> list[str] | None:
    found = list(present(LM_RUNS))
    if not found:
        return None
    out = []
    for name, d in found:
        meta = d["meta"]
        flags = " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in meta["args"].items()
            if k not in ("tar", "out")
        )
        out += [
            f"**{code(name)}**: {meta['data']}; {meta['budget']}; CPU capability "
            f"{meta.get('cpu_capability', 'not recorded')}; torch {meta['torch']}. Command: "
            f"{code(meta['command'].strip())} with {code(flags)}.",
            "",
        ]
        body = [
            [model, f"{r['parameters']:,}", r["train_steps"], num(r["train_cpu_seconds"]),
             num(r["test_bits_per_byte"]), num(r["test_perplexity_per_byte"]),
             num(r["decode_ms_per_token_median"]),
             num(r["cache_vs_full_pass_max_logit_diff"], 2)]
            for model, r in d["results"].items()
        ]  # fmt: skip
        out += table(["model", "parameters", "training steps", "training CPU s",
                      "test bits/byte", "perplexity/byte", "decode ms/token (median)",
                      "cache vs full pass, max logit diff"], body)  # fmt: skip
    return out + [source(*(name for name, _ in found)), ""] + plot("hierarchical_lm.png", "LM")
