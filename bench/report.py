#!/usr/bin/python3
"""Merges mha-bench's Google Benchmark JSON and peers.py's JSON into a report.

Writes to --out-dir:
  results.json    every measurement: family, shape, implementation, seconds per
                  call, GFLOP/s (GB/s for the transpose), % of the measured peak
  table.md        one section per kernel family, one row per (shape, libmha ISA
                  of this CPU, peer): GFLOP/s, % of peak, and on libmha's rows
                  its ratio to each peer, to the best peer and to scalar; for
                  decode, prefill and the score modifiers also libmha's
                  reference (<isa>-ref: mha_attention, the full causal
                  attention, the call without the modifier) and the stated
                  target of libmha over it; decode in GB/s and % of a plain
                  read of the same K and V bytes; the cost of a call (a
                  cached call on 64 keys) in µs per call, against its target
  headline.md     the short table for README (tools/publish_bench.sh puts it
                  there): a row per family or case group (one or two of its
                  shapes, HEADLINE), libmha's fastest ISA, its % of peak (of
                  memcpy, of decode's roofline), the fastest peer, libmha over
                  its reference
  attention.png   attention GFLOP/s against sequence length (B=1, 12 heads, dh 64),
                  every ISA and peer
  layer_seq.png   the whole layer, same shapes
  layer.png       bar chart of the BERT-base layer (B = 1, 8, 32; S = 128)
  decode.png      decode time per step against Skv per cache type, libmha and the
                  peers, with each type's roofline

GFLOP/s come from seconds per call and the work of a call that `mha-bench
--shapes-json` writes into shapes.json (bench/main.cc counts it, nothing here):
  GEMM 2*M*N*K; attention 4*B*H*Sq*Skv*dh, halved when causal; the layer is the
  QKV projection + attention + output projection. The transpose moves 2 * tensor
  bytes per call (read once, written once), as memcpy's bandwidth is counted.
  Decode counts the K and V bytes read, 2*B*Hkv*Skv*dh*4; prefill and the
  modifiers 4*dh FLOP per (b, h, query row, key the mask leaves visible).
The peak is the machine's FMA peak with its widest FMA: the best FMA loop of
every ISA the harness measured (bench/peak_<isa>.c). With several rounds
(--bench and --peers repeated), each entry keeps its best (shortest) time.
"""
import argparse
import datetime
import json
import os
import platform

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Peers per family: impl (peers.py's, or the harness's openblas) -> (column, plot label).
PEERS = {
    "qkv": {"openblas": ("OpenBLAS", "OpenBLAS cblas_sgemm")},
    "attention": {
        "ort": ("ORT", "ONNX Runtime (faster of Attention, MultiHeadAttention)"),
        "torch_sdpa": ("torch SDPA", "torch scaled_dot_product_attention"),
        "openvino": ("OpenVINO", "OpenVINO ScaledDotProductAttention"),
    },
    "transpose": {},
    "layer": {
        "ort": ("ORT", "ONNX Runtime MatMul + attention op"),
        "torch_mha": ("torch MHA", "torch.nn.MultiheadAttention (fast path)"),
        "openvino": ("OpenVINO", "OpenVINO MatMul + SDPA"),
    },
}
CACHED = ("decode", "prefill", "modifier", "step", "call")  # the families of bench/main.cc's kCases
PEERS["step"] = {}  # a whole layer's decode step: against its own reference only
PEERS["call"] = {}  # a call bound by its fixed costs: against its time target only
for _family in ("decode", "prefill", "modifier"):
    PEERS[_family] = {
        "ort_gqa": ("ORT GQA", "ONNX Runtime com.microsoft GroupQueryAttention"),
        "torch_sdpa": ("torch SDPA", "torch scaled_dot_product_attention"),
    }
PEERS["decode"]["ggml"] = ("ggml", "ggml flash_attn_ext (ggml-python)")
FRAMEWORKS = ["onnxruntime", "torch", "openvino", "ggml"]  # peers.py --peer
ORT_OPS = {"Attention": "Attention op", "MultiHeadAttention": "com.microsoft MHA"}
FAMILY_TITLES = {
    "qkv": "fused QKV projection",
    "attention": "attention",
    "transpose": "head transpose",
    "layer": "whole layer",
    "decode": "decode (one query row per sequence on a KV cache)",
    "prefill": "chunked prefill",
    "modifier": "score modifiers",
    "step": "whole-layer decode step",
    "call": "cost of a call (decode's call on a cache of a few keys)",
}
# What libmha's <isa>-ref runs, per the case's "reference" (bench/main.cc).
REFERENCES = {
    "attention": "mha_attention, Sq=1 over the same K, V",
    "full": "mha_attention, causal over all S rows",
    "plain": "the same call without it",
    "dense": "ALiBi as a dense bias [1,H,S,S]",
    "f32": "the same call on an f32 cache",
    "contiguous": "the same cache with contiguous rows",
}


def work(family, s, impl=""):
    """FLOP per call (bytes per call for the transpose and decode): what mha-bench
    --shapes-json wrote; a case's -ref rows do the work of its reference."""
    if family in CACHED:
        return s["ref_work"] if impl.endswith("-ref") else s["work"]
    return s["work"][family]


def load_bench(paths):
    """(family, shape, impl) -> seconds per call, best over the files; errors; the
    context; the peaks: the best of every measurement (before the benchmarks, and
    the peak/fma/<isa>, peak/memcpy/64MiB benchmarks at their start and end), as
    {"fma": {isa: GFLOP/s}, "memcpy": GB/s}; and the counters of the run with the
    best time: for the transpose, the seconds of a memcpy of the same bytes
    interleaved with it (memcpy_s), for decode the plain read's GB/s and %read and
    the output's error against float64."""
    times, errors, context, counters = {}, {}, {}, {}
    peaks = {"fma": {}, "memcpy": 0.0}

    def better_fma(isa, g):
        peaks["fma"][isa] = max(g, peaks["fma"].get(isa, 0.0))

    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        context = doc.get("context", {})
        for key, value in context.items():
            if key.startswith("peak_gflops_"):
                better_fma(key[len("peak_gflops_"):], float(value))
        peaks["memcpy"] = max(peaks["memcpy"], float(context.get("memcpy_gbps", 0)))
        for b in doc.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration":
                continue
            family, shape, impl = b["name"].split("/")[:3]
            key = (family, shape, impl)
            if family == "peak" and not b.get("error_occurred"):
                if shape == "fma":
                    better_fma(impl, b["GFLOP/s"])
                else:
                    peaks["memcpy"] = max(peaks["memcpy"], b["GB/s"])
                continue
            if b.get("error_occurred"):
                errors[key] = b.get("error_message", "error")
                continue
            scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
            t = b["real_time"] * scale
            if t <= times.get(key, t):
                times[key] = t
                counters[key] = {k: b[k] for k in ("memcpy_s", "read_GB/s", "%read", "%roofline",
                                                   "roofline_ms", "error") if k in b}
    return times, errors, context, peaks, counters


def load_peers(paths):
    """(family, shape, impl) -> seconds, best over the files; -> reason skipped
    (where no file has a time); -> the best record's extra fields (ONNX Runtime's
    variant and variants, the output's error against float64); the contexts
    merged (one file per framework)."""
    times, skipped, extra, context = {}, {}, {}, {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        context.update(doc.get("context", {}))
        for r in doc["results"]:
            key = (r["family"], r["shape"], r["impl"])
            if "seconds" in r:
                if r["seconds"] <= times.get(key, r["seconds"]):
                    times[key] = r["seconds"]
                    extra[key] = {k: r[k] for k in ("variant", "variants", "error") if k in r}
            else:
                skipped[key] = r["skipped"]
    skipped = {k: why for k, why in skipped.items() if k not in times}
    return times, skipped, extra, context


def cpu_model():
    """The CPU's name, with its x86 family and model numbers: under a hypervisor
    the name can be as vague as "AMD EPYC" for several generations."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or fields.get("Model")
    if not name:
        return platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def fmt(x):
    if x is None:
        return "—"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def openblas_core(bctx, detected):
    """The core OpenBLAS ran with, and how it was chosen."""
    core = bctx.get("openblas_core")
    if core is None:
        return "not built"
    if "openblas_coretype" in bctx:
        return f"{core} (OPENBLAS_CORETYPE set; detected {detected or '?'})"
    return f"{core} (detected)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="what `mha-bench --shapes-json` printed")
    ap.add_argument("--bench", action="append", required=True, help="mha-bench JSON (repeatable)")
    ap.add_argument("--peers", action="append", default=[], help="peers.py JSON (repeatable)")
    ap.add_argument("--openblas-detected", default="",
                    help="the core OpenBLAS detects without OPENBLAS_CORETYPE (bench.sh)")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    with open(args.shapes) as f:
        shapes = json.load(f)
    btimes, berrors, bctx, peaks, counters = load_bench(args.bench)
    ptimes, pskipped, pextra, pctx = load_peers(args.peers)
    times = {**btimes, **ptimes}

    isa_peak = peaks["fma"]
    peak_isa = max(isa_peak, key=isa_peak.get)
    isas = bctx["isas"].split(",")  # those of this build and CPU, in mha_isa order
    info = {
        # When mha-bench ran (its last round), which a report rewritten later keeps.
        "date": bctx.get("date")
        or datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "threads": bctx.get("omp_threads", "?"),
        "mode": bctx.get("mode", "?"),
        "isas": isas,
        "peak_gflops": isa_peak[peak_isa],
        "peak_isa": peak_isa,
        "peak_gflops_per_isa": {i: isa_peak[i] for i in isas if i in isa_peak},
        "memcpy_gbps": peaks["memcpy"],
        "libmha": bctx.get("mha_version", "?"),
        "openblas": bctx.get("openblas", "not built"),
        "openblas_core": openblas_core(bctx, args.openblas_detected),
        "scalar_cap_gflop": bctx.get("scalar_cap_gflop", "?"),
        "read_isa": bctx.get("read_isa", "?"),
        "l3_bytes": int(bctx.get("l3_bytes", 0)),
        "pages": bctx.get("pages", "4 KiB"),
        # A framework missing from every peers file was not run (--quick: ONNX Runtime only).
        "peers": {p: pctx.get(p, "not run") for p in FRAMEWORKS},
    }

    def rate(family, s, impl):
        """GFLOP/s (GB/s for the transpose), or None when not measured."""
        t = times.get((family, s["name"], impl))
        return None if t is None else work(family, s, impl) / t / 1e9

    results = []
    for (family, shape, impl), t in sorted(times.items()):
        s = next((x for x in shapes if x["name"] == shape), None)
        if s is None:
            continue
        r = rate(family, s, impl)
        rec = {"family": family, "shape": shape, "impl": impl, "seconds": t}
        extra = counters.get((family, shape, impl), {})
        if family == "transpose":
            copy = extra.get("memcpy_s")
            rec.update(gbps=r, pct_memcpy=100 * copy / t if copy else 100 * r / info["memcpy_gbps"])
        elif family == "decode":
            # A peer's % of read is over the best plain read of these bytes in mha-bench.
            read = extra.get("read_GB/s") or max(
                (c["read_GB/s"] for (f, sh, _), c in counters.items()
                 if (f, sh) == (family, shape) and "read_GB/s" in c), default=None)
            # The roofline of these bytes and FLOP, as mha-bench measured it for libmha's call.
            roof = extra.get("roofline_ms") or min(
                (c["roofline_ms"] for (f, sh, i), c in counters.items()
                 if (f, sh) == (family, shape) and not i.endswith("-ref") and "roofline_ms" in c),
                default=None)
            rec.update(gbps=r, read_gbps=read,
                       pct_read=extra.get("%read", 100 * r / read if read else None),
                       pct_roofline=extra.get("%roofline", 100 * roof / 1e3 / t if roof else None))
            if "error" in extra:
                rec["error"] = extra["error"]
        else:
            rec.update(gflops=r, pct_peak=100 * r / info["peak_gflops"])
            if impl in isa_peak:
                rec["pct_isa_peak"] = 100 * r / isa_peak[impl]
        rec.update(pextra.get((family, shape, impl), {}))
        results.append(rec)
    skipped = [
        {"family": f, "shape": s, "impl": i, "reason": why}
        for (f, s, i), why in sorted({**berrors, **pskipped}.items())
    ]
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"context": info, "results": results, "skipped": skipped}, f, indent=1)
        f.write("\n")

    by_key = {(r["family"], r["shape"], r["impl"]): r for r in results}
    write_table(args.out_dir, shapes, rate, info, skipped, by_key)
    write_headline(args.out_dir, shapes, rate, info, by_key)
    plot_vs_seq(args.out_dir, shapes, rate, info, "attention")
    plot_vs_seq(args.out_dir, shapes, rate, info, "layer")
    plot_layer_bars(args.out_dir, shapes, rate, info)
    plot_decode(args.out_dir, shapes, info, by_key)


def shape_text(s):
    text = f"B={s['batch']} S={s['seq']} H={s['heads']}"
    if s["kv_heads"] != s["heads"]:
        text += f" Hkv={s['kv_heads']}"
    text += f" dh={s['head_dim']}"
    return text + (" causal" if s["causal"] else "")


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "—"


def mib(nbytes):
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def case_text(family, s, info):
    b, h, hkv, dh = s["batch"], s["heads"], s["kv_heads"], s["head_dim"]
    n, sq = s["seq"], s["seq_q"]
    heads = f"H={h}" + (f" Hkv={hkv}" if hkv != h else "") + f" dh={dh}"
    kind = f"{s.get('kv_type', 'f32')} cache" + (f" paged, blocks of {s['block_size']}"
                                                  if s.get("block_size") else "")
    if family == "decode":
        kv, l3 = work(family, s), info["l3_bytes"]
        where = "" if not l3 else ", fits in L3" if kv <= l3 else ", beyond L3"
        return f"B={b} Skv={n} {heads}, {kind}, K+V {mib(kv)}{where}"
    if family == "prefill":
        return f"B={b} {sq} rows onto {n - sq} cached, {heads} causal, {kind}"
    if family == "step":
        e, ekv = h * dh, hkv * dh
        return (f"B={b} {sq} row onto {n - sq} cached, d_model {e}, {heads}, {kind}, "
                f"weights {mib(4.0 * (2 * e * e + 2 * e * ekv))}")
    if family == "call":
        return f"B={b} {sq} row over {n} cached keys, {heads}, {kind}"
    mod = {"window": f"window {s['value']:g}", "softcap": f"softcap {s['value']:g}",
           "alibi": "ALiBi slopes", "sinks": "sinks"}[s["modifier"]]
    return f"B={b} S={n} {heads} causal, {mod}"


def target_cell(family, s, speedup):
    """libmha over its reference (prefill: GFLOP/s ratio; else time ratio), against
    the case's stated target."""
    t = s["target"]
    if speedup is None:
        return "—"
    if not t:
        return f"{speedup:.2f}x"
    goal = f"≥ {t:g}x"
    if t < 1:
        goal += (f": GFLOP/s within {100 * (1 - t):.0f}%" if family == "prefill"
                 else f": ≤ {1 / t:.3g}x the time")
    return f"{speedup:.2f}x ({goal}, {'met' if speedup >= t else 'missed'})"


def microseconds(family, s, impl, by_key):
    """The time of a call of impl on s, in µs."""
    return by_key[(family, s["name"], impl)]["seconds"] * 1e6


def goal_cell(family, s, isa, rate, by_key):
    """libmha's isa against the case's stated goal: a call's time against its most
    µs (call), else its speed over its reference (target_cell); "" with neither."""
    if family == "call":
        t, goal = microseconds(family, s, isa, by_key), s["target"]
        return f"{fmt(t)} µs (≤ {goal:g} µs, {'met' if t <= goal else 'missed'})"
    if family not in CACHED or not REFERENCES.get(s["reference"]):
        return ""
    return target_cell(family, s, over_reference(family, s, isa, rate, by_key))


def over_reference(family, s, isa, rate, by_key):
    """libmha's isa over its reference (<isa>-ref), None where either has no time:
    prefill the GFLOP/s ratio, else the time ratio (a window and the full causal
    reference differ in work from the call)."""
    r, r_ref = rate(family, s, isa), rate(family, s, isa + "-ref")
    if not r or not r_ref:
        return None
    if family == "prefill":
        return r / r_ref
    t, t_ref = (by_key[(family, s["name"], i)]["seconds"] for i in (isa, isa + "-ref"))
    return t_ref / t


def case_tables(shapes, rate, info, by_key):
    """The sections of table.md of kCases' families: per case, each libmha ISA with
    its reference (if any) right below, then the peers."""
    isas, lines = info["isas"], []
    for family in CACHED:
        cases = [s for s in shapes if family in s["families"]]
        fam_peers = {impl: v for impl, v in PEERS[family].items()
                     if any(rate(family, s, impl) for s in cases)}
        scalar = any(rate(family, s, "scalar") for s in cases)
        unit, pct_col = ("GB/s", "% of read") if family == "decode" else ("GFLOP/s", "% of peak")
        call = family == "call"  # timed in µs, against a time target
        head = ["case", "implementation", "µs" if call else "ms", unit, pct_col]
        head += ["% of roofline"] if family == "decode" else []
        head += ["per call (target)" if call else "vs reference (target)"]
        fixed = len(head) - 1
        head += [f"vs {col}" for col, _ in fam_peers.values()]
        head += ["vs best peer"] if len(fam_peers) > 1 else []
        head += ["vs scalar"] if scalar else []
        rows, notes = [], []

        def row(cell, name, s, impl, rest):
            rec = by_key[(family, s["name"], impl)]
            pcts = [rec["pct_read"], rec["pct_roofline"]] if family == "decode" else [rec["pct_peak"]]
            return ([cell, name, fmt(rec["seconds"] * (1e6 if call else 1e3)),
                     fmt(rate(family, s, impl))]
                    + ["—" if p is None else f"{p:.0f}%" for p in pcts] + rest)

        for s in cases:
            theirs = {impl: rate(family, s, impl) for impl in fam_peers}
            best_peer = max((p for p in theirs if theirs[p]), key=theirs.get, default=None)
            cell = f"{s['name']} ({case_text(family, s, info)})"
            ref_name = REFERENCES.get(s["reference"])
            for isa in reversed(isas):
                r, r_ref = rate(family, s, isa), rate(family, s, isa + "-ref")
                if r:
                    rest = [goal_cell(family, s, isa, rate, by_key)]
                    rest += [ratio(r, theirs[p]) for p in fam_peers]
                    if len(fam_peers) > 1:
                        rest += [f"{ratio(r, theirs[best_peer])} {fam_peers[best_peer][0]}"
                                 if best_peer else "—"]
                    if scalar:
                        rest += [ratio(r, rate(family, s, "scalar")) if isa != "scalar" else ""]
                    rows.append(row(cell, f"libmha {isa}", s, isa, rest))
                    cell = ""
                if r_ref:
                    rows.append(row(cell, f"libmha {isa}: {ref_name}", s, isa + "-ref",
                                    [""] * (len(head) - fixed)))
                    cell = ""
            for impl, (col, _) in fam_peers.items():
                if theirs[impl]:
                    rows.append(row(cell, col, s, impl, [""] * (len(head) - fixed)))
                    cell = ""
            if s["modifier"] == "alibi":
                h, n = s["heads"], s["seq"]
                notes.append(f"{s['name']}: the slopes are {h} floats ({4 * h} B); the dense "
                             f"bias [1,{h},{n},{n}] of the reference and of ORT GQA (which has "
                             f"no slopes) is {mib(4.0 * h * n * n)}, O(S^2).")
        if rows:
            lines += ["", f"## {FAMILY_TITLES[family]}", "", CASE_TEXT[family].format(**info), "",
                      "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            lines += [""] * bool(notes) + notes
    return lines


# The paragraph above each case table (formatted with the report's info).
CASE_TEXT = {
    "decode": "GB/s: the K and V bytes a step reads (2*B*Hkv*Skv*dh values, 4 bytes each for "
    "f32, 2 for f16 and bf16, 34 per 32 for q8_0) per second; the cache is "
    "[B][Hkv][cap = Skv][dh] (paged: a pool of blocks [Hkv][block][dh] in shuffled order), "
    "read by mha_attention_cached (causal, one row at the last position). % of roofline: the "
    "roofline time, max(the plain read of the same bytes, 4*B*H*Skv*dh FLOP at the measured "
    "FMA peak), over the call's time. % of read: over a plain read of the same bytes ({read_isa} loads "
    "summed, the same threads, split the same way by (b, kv head) slab; a paged cache's "
    "read goes block by block in the order of its block tables, asking for the next block's "
    "lines as it reads, as the attention does), timed right before "
    "each call on the same buffers, which each side finds as the other left them; \"fits in "
    "L3\" when K+V is at most the L3 that CPU 0 shares (sysfs). A peer's % of read is over the best "
    "plain read of those bytes in mha-bench. The reference is the same attention through "
    "mha_attention (Sq = 1 over contiguous K, V), which now takes the same decode path (GQA "
    "blocks, split keys), so no target is set against it; a typed cache's reference is the same "
    "call on the f32 cache, a paged cache's the same cache contiguous. ggml flash_attn_ext "
    "reads a cache of the same type (its q converted to that type). ORT GQA also writes the step's one new K, V "
    "row into the shared cache.",
    "prefill": "A chunk of new query rows onto the cached ones through mha_attention_cached "
    "(lens = the rows after the chunk, causal), against mha_attention causal over all those "
    "rows. GFLOP/s count only what causality leaves: 4*dh per (b, h, row, visible key), the "
    "row at position p seeing p + 1 keys; \"vs reference\" is the GFLOP/s ratio. ORT GQA "
    "writes the chunk's K, V rows into the shared cache in the same call.",
    "modifier": "mha_attention (B=1, H=12, dh=64, causal) with a score modifier, against its "
    "reference: the same call without the modifier (ALiBi: the same biases as a dense "
    "[1,H,S,S] bias). GFLOP/s count the keys the mask leaves (a window of w: at most w per "
    "row); \"vs reference\" is the time ratio. ORT GQA takes local_window_size, softcap, "
    "head_sink and, for ALiBi, the dense bias as attention_bias; torch SDPA gets the window "
    "as a boolean mask and ALiBi as an additive mask, and has no softcap or sinks.",
    "step": "mha_layer_step on a Llama-3-8B-like layer: the Q, K, V projections of one "
    "token per sequence, its K, V row appended to the cache, attention over all the rows, "
    "the output projection. The reference is the same step on the same cache with "
    "contiguous rows; \"vs reference\" is the time ratio. GFLOP/s count the three "
    "projections' GEMM FLOP plus 4*dh per (b, h, key); the f32 weights and the cache "
    "are read once per step.",
    "call": "mha_attention_cached called as for decode (one causal row per sequence at the "
    "last position, f32 cache [B][Hkv][cap = Skv][dh]) on a cache of a few keys: K+V fit in "
    "L1 or L2 and the FLOP take a fraction of a microsecond, so the call's fixed costs "
    "(checks, dispatch, the OpenMP team) set its time, given in µs per call against the "
    "case's target (the most µs a call may take). GFLOP/s count 4*dh per (b, h, key). No "
    "reference and no peer: the decode table times the peers on the same call at larger Skv.",
}


def output_errors(by_key):
    """The section of the outputs' errors against float64: libmha's decode calls
    (mha-bench) and the peers' calls where peers.py measured them."""
    rows = [f"| {f}/{sh} | {'' if i in PEERS.get(f, {}) else 'libmha '}{i}"
            f"{' (' + r['variant'] + ')' if 'variant' in r else ''} | {r['error']:.1e} |"
            for (f, sh, i), r in sorted(by_key.items(),
                                        key=lambda kr: (*kr[0][:2], kr[0][2] in PEERS.get(kr[0][0], {}),
                                                        kr[0][2]))
            if "error" in r]
    if not rows:
        return []
    return ["", "## Errors against float64", "",
            "max |out - ref| / max |ref|, ref the same attention in float64 of the inputs as "
            "the implementation holds them (rounded to its 16-bit or q8_0 type): what its "
            "arithmetic adds. libmha: decode calls, against tools/ref64.c over its cache; its "
            "other kernels' errors are `mha-validate --report`'s (tools/main.sh). Peers: dense "
            "attention and cached attention without a modifier, against peers.py's "
            "attention64. A 16-bit output adds its own rounding: at most 4.9e-4 (f16) or "
            "3.9e-3 (bf16).", "",
            "| case | implementation | error |", "|---|---|---|"] + rows


def write_table(out_dir, shapes, rate, info, skipped, by_key):
    """by_key: (family, shape, impl) -> its record in results.json."""
    isas = info["isas"]
    peaks = ", ".join(f"{i} {v:.1f}" for i, v in info["peak_gflops_per_isa"].items())
    peers = ", ".join(f"{p} {v.split(':')[0]}" for p, v in info["peers"].items())
    lines = [
        f"# libmha benchmark ({info['mode']} run)",
        "",
        f"**{info['cpu']}, {info['threads']} threads** (OpenMP, OpenBLAS and every peer alike), "
        f"{info['date']}. libmha {info['libmha']}, ISAs on this CPU: {', '.join(isas)}.",
        "",
        f"Peak: {info['peak_gflops']:.1f} GFLOP/s, the FMA-throughput loop of the widest FMA "
        f"({info['peak_isa']}); per ISA {peaks} GFLOP/s. memcpy {info['memcpy_gbps']:.1f} GB/s "
        "(2 x bytes copied, 64 MiB).",
        "",
        f"OpenBLAS core: {info['openblas_core']}; {info['openblas']}. mha-bench's buffers "
        f"on {info['pages']} pages.",
        "",
        f"Peers, each timed in its own process: {peers}.",
        "",
        "Cells are GFLOP/s (head transpose: GB/s, 2 x tensor bytes per call). "
        "FLOP: GEMM 2*M*N*K; attention 4*B*H*Sq*Skv*dh, halved when causal; "
        "layer = QKV + attention + output projection. \"% of peak\" is over the widest "
        "FMA's peak (transpose: % of memcpy; for 64 MiB, a memcpy of the same bytes timed "
        "alongside each call). \"vs X\" is that libmha ISA's speed over X's. ORT is the "
        "faster of ONNX Runtime's Attention op (opset 23) and com.microsoft "
        "MultiHeadAttention, named in its row (for the layer, with MatMul + Add around it); "
        "torch SDPA is torch.nn.functional.scaled_dot_product_attention, torch MHA "
        "torch.nn.MultiheadAttention (fast path); OpenVINO runs ScaledDotProductAttention "
        "(with MatMul + Add around it for the layer) in f32.",
    ]
    for family in ["qkv", "attention", "transpose", "layer"]:
        # Peers measured on some shape (the notes say why the others were not).
        fam_peers = {impl: v for impl, v in PEERS[family].items()
                     if any(rate(family, s, impl) for s in shapes if family in s["families"])}
        unit = "GB/s" if family == "transpose" else "GFLOP/s"
        head = ["shape", "implementation", unit,
                "% of memcpy" if family == "transpose" else "% of peak"]
        head += [f"vs {col}" for col, _ in fam_peers.values()]
        head += ["vs best peer"] if len(fam_peers) > 1 else []
        head += ["vs scalar"]
        rows = []
        for s in shapes:
            if family not in s["families"]:
                continue
            mine = {i: rate(family, s, i) for i in isas}
            theirs = {impl: rate(family, s, impl) for impl in fam_peers}
            if not any(mine.values()) and not any(theirs.values()):
                continue
            best_peer = max((p for p in theirs if theirs[p]), key=theirs.get, default=None)
            shape_cell = f"{s['name']} ({shape_text(s)})"

            def pct(impl, r):
                if r is None:
                    return "—"
                rec = by_key[(family, s["name"], impl)]
                return f"{rec['pct_memcpy' if family == 'transpose' else 'pct_peak']:.0f}%"

            # libmha widest ISA first; scalar only where it ran (--scalar-cap).
            for isa in reversed(isas):
                r = mine[isa]
                if r is None and isa == "scalar":
                    continue
                row = [shape_cell, f"libmha {isa}", fmt(r), pct(isa, r)]
                row += [ratio(r, theirs[p]) for p in fam_peers]
                if len(fam_peers) > 1:
                    row += [f"{ratio(r, theirs[best_peer])} {fam_peers[best_peer][0]}"
                            if best_peer and r else "—"]
                row += [ratio(r, mine["scalar"]) if isa != "scalar" else ""]
                rows.append(row)
                shape_cell = ""
            for impl, (col, _) in fam_peers.items():
                r = theirs[impl]
                if r is None:
                    continue
                variant = by_key[(family, s["name"], impl)].get("variant")
                name = f"{col} ({ORT_OPS.get(variant, variant)})" if variant else col
                rows.append([shape_cell, name, fmt(r), pct(impl, r)]
                            + [""] * (len(head) - 4))
                shape_cell = ""
        if rows:
            lines += ["", f"## {FAMILY_TITLES[family]}", "",
                      "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += case_tables(shapes, rate, info, by_key)
    lines += output_errors(by_key)
    notes = [
        f"- libmha scalar runs only where a call is at most {info['scalar_cap_gflop']} "
        "GFLOP (`--scalar-cap`); above, it has no row."
    ]
    for peer, state in info["peers"].items():
        if state == "not run":
            notes.append(f"- {peer}: not run"
                         + (" (--quick times ONNX Runtime only)" if info["mode"] == "quick" else ""))
        elif state.startswith("not available"):
            notes.append(f"- {peer}: {state}")
    # One line per reason, naming every benchmark it covers.
    by_reason = {}
    for sk in skipped:
        by_reason.setdefault(sk["reason"], []).append(f"{sk['family']}/{sk['shape']}/{sk['impl']}")
    peered = [f for f in CACHED if PEERS[f]]
    if any(any(f in s["families"] for f in peered) for s in shapes):
        notes.append(f"- {', '.join(peered)}: OpenVINO is not run (peers.py times ONNX Runtime "
                     "GroupQueryAttention and torch SDPA there)")
    for why, keys in by_reason.items():
        if not any(why.startswith(f"{p} not available") for p in FRAMEWORKS):  # said above
            notes.append(f"- {', '.join(keys)}: {why}")
    lines += ["", "Not measured:", ""] + notes + [""]
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(lines))


def contiguous(kv_type):
    """Which cases: those on a contiguous cache of this type."""
    return lambda s: s["kv_type"] == kv_type and not s["block_size"]


# headline.md's rows: (family, label, which of the family's cases, pick): "ends" takes
# the smallest and the largest call by work (the first of equals), "largest" the
# largest, "each" every case.
HEADLINE = [
    ("qkv", "fused QKV projection", lambda s: True, "ends"),
    ("attention", "attention, f32", lambda s: s["dtype"] == "f32", "ends"),
    ("attention", "attention, f16", lambda s: s["dtype"] == "f16", "largest"),
    ("attention", "attention, bf16", lambda s: s["dtype"] == "bf16", "largest"),
    ("transpose", "head transpose", lambda s: True, "largest"),
    ("layer", "whole layer", lambda s: True, "ends"),
    ("decode", "decode, f32 cache", contiguous("f32"), "ends"),
    ("decode", "decode, f16 cache", contiguous("f16"), "largest"),
    ("decode", "decode, bf16 cache", contiguous("bf16"), "largest"),
    ("decode", "decode, q8_0 cache", contiguous("q8_0"), "largest"),
    ("decode", "paged decode", lambda s: s["block_size"], "largest"),
    ("prefill", "chunked prefill", contiguous("f32"), "largest"),
    ("modifier", "score modifier", lambda s: True, "each"),
    ("step", "layer step, paged", lambda s: True, "each"),
    ("call", "cached attention call", lambda s: True, "each"),
]


def headline_row(label, family, s, rate, info, by_key):
    """One case's cells: libmha's fastest ISA, its % of the bound (the FMA peak; the
    transpose's memcpy; decode's roofline), the fastest peer, and libmha over its
    reference where the case has one; and that ISA's record. None when libmha has no
    time."""
    mine = {i: rate(family, s, i) for i in info["isas"] if rate(family, s, i)}
    if not mine:
        return None
    isa = max(mine, key=mine.get)
    key, bound = {"transpose": ("pct_memcpy", "memcpy"),
                  "decode": ("pct_roofline", "roofline")}.get(family, ("pct_peak", "peak"))
    rec = by_key[(family, s["name"], isa)]
    pct = rec.get(key)
    unit = "GB/s" if family in ("transpose", "decode") else "GFLOP/s"
    theirs = {impl: rate(family, s, impl) for impl in PEERS[family]}
    best = max((p for p in theirs if theirs[p]), key=theirs.get, default=None)
    speed = (f"{fmt(microseconds(family, s, isa, by_key))} µs per call" if family == "call"
             else f"{fmt(mine[isa])} {unit}")
    text = case_text(family, s, info) if family in CACHED else shape_text(s)
    peer = f"{PEERS[family][best][0]} {fmt(theirs[best])}" if best else "—"
    err = by_key.get((family, s["name"], best), {}).get("error") if best else None
    if err is not None and err > LOW_PRECISION * OUT_ROUNDING[out_type(family, s)]:
        peer += f" (error {err:.1e})"
    return [label, f"{s['name']} ({text})", f"{isa} {speed}",
            "—" if pct is None else f"{pct:.0f}% of {bound}", peer,
            ratio(mine[isa], theirs.get(best)), goal_cell(family, s, isa, rate, by_key)], rec


# What rounding the output to its type costs against float64 (f32: its tolerance), and
# the factor above it from which a peer's error says that it computes at a lower
# precision than its inputs and output have: the headline then shows that error.
OUT_ROUNDING = {"f32": 1e-5, "f16": 4.9e-4, "bf16": 3.9e-3}
LOW_PRECISION = 2


def out_type(family, s):
    """The output's element type: the dense families' dtype; cached calls return f32."""
    return s.get("dtype", "f32") if family not in CACHED else "f32"


def write_headline(out_dir, shapes, rate, info, by_key):
    """headline.md: a row per HEADLINE pick, from the figures of table.md; no heading,
    so that it fits inside README's benchmark section."""
    rows, refs, reads = [], {}, []
    for family, label, which, pick in HEADLINE:
        cases = [s for s in shapes if family in s["families"] and which(s)]
        if not cases:
            continue
        small, large = (f(cases, key=lambda s: work(family, s)) for f in (min, max))
        picks = {"ends": [small] + [large] * (large is not small), "largest": [large],
                 "each": cases}[pick]
        for s in picks:
            picked = headline_row(label, family, s, rate, info, by_key)
            if picked is None:
                continue
            row, rec = picked
            rows.append(row)
            if row[-1] and REFERENCES.get(s["reference"]):  # against its reference
                refs.setdefault(REFERENCES[s["reference"]], []).append(s["name"])
            if rec.get("read_gbps"):
                reads.append(rec["read_gbps"])
    read = (f", plain reads of the decode rows' K and V {min(reads):.1f}–{max(reads):.1f} GB/s"
            if reads else "")
    lines = [
        f"**{info['cpu']}, {info['threads']} threads**, {info['date'][:10]} ({info['mode']} "
        f"run), libmha {info['libmha']}. Peak {info['peak_gflops']:.1f} GFLOP/s (the "
        f"{info['peak_isa']} FMA loop), memcpy {info['memcpy_gbps']:.1f} GB/s{read}.",
        "",
        "libmha: its fastest ISA on this CPU. % of peak: GFLOP/s over the FMA peak; head "
        "transpose: GB/s over a memcpy of the same bytes; decode: the roofline time, "
        "max(a plain read of the K and V bytes, the FLOP at the FMA peak), over the call's. "
        "Best peer: the fastest peer with a time for the case (—: none has one); \"vs best "
        "peer\" is libmha's speed over it. \"vs reference\" is libmha over its own reference "
        "call (prefill: GFLOP/s ratio, else time ratio) against the case's target; for the "
        "cost of a call, libmha's time per call against its target. A peer's error against "
        "float64 follows its figure where it exceeds twice what rounding the output to its "
        "type costs (f16 4.9e-4, bf16 3.9e-3; f32: its tolerance, 1e-5): that peer computes "
        "at a lower precision than libmha.",
        "",
        "| family | case | libmha | % of peak or roofline | best peer | vs best peer "
        "| vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if refs:
        lines += ["", "References: " + "; ".join(f"{', '.join(names)}: {ref}"
                                                for ref, names in refs.items()) + "."]
    with open(os.path.join(out_dir, "headline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def subtitle(info):
    return f"{info['cpu']}, {info['threads']} threads, {info['date'][:10]}"


def peak_line(ax, info):
    ax.axhline(info["peak_gflops"], color="grey", ls=":",
               label=f"measured FMA peak, {info['peak_isa']} ({info['peak_gflops']:.0f} GFLOP/s)")


def plot_vs_seq(out_dir, shapes, rate, info, family):
    """GFLOP/s against S for B=1, 12 heads, dh 64, no mask: BERT's S=128 and the long ones."""
    series = sorted(
        (s for s in shapes
         if family in s["families"] and s["batch"] == 1 and s["heads"] == 12
         and s["kv_heads"] == 12 and s["head_dim"] == 64 and not s["causal"]),
        key=lambda s: s["seq"],
    )
    if not series:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for impl, label, style in [(i, f"libmha {i}", "o-") for i in info["isas"]] + [
        (p, label, "s--") for p, (_, label) in PEERS[family].items()
    ]:
        pts = [(s["seq"], rate(family, s, impl)) for s in series]
        pts = [(x, y) for x, y in pts if y]
        if pts:
            ax.plot(*zip(*pts), style, label=label)
    peak_line(ax, info)
    ax.set_xscale("log", base=2)
    ax.set_xticks([s["seq"] for s in series], [str(s["seq"]) for s in series])
    ax.set_xlabel("sequence length S (B=1, 12 heads, head dim 64)")
    ax.set_ylabel("GFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{FAMILY_TITLES[family]}: GFLOP/s vs sequence length\n{subtitle(info)}",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"{family}{'_seq' if family == 'layer' else ''}.png"),
                dpi=120)
    plt.close(fig)


def plot_decode(out_dir, shapes, info, by_key):
    """Decode time per call against Skv (B=1 and B=8, GQA 32/8, dh 128), one line per
    cache type for libmha's best ISA and for each peer, the roofline of each type dashed."""
    cases = [s for s in shapes if "decode" in s["families"] and not s.get("block_size")
             and s["heads"] == 32 and s["kv_heads"] == 8]
    if not cases:
        return
    isa = info["isas"][-1]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"f32": "C0", "f16": "C1", "bf16": "C2", "q8_0": "C3"}
    for ax, b in zip(axes, (1, 8)):
        for t, color in colors.items():
            mine = sorted((s["seq"], s["name"]) for s in cases
                          if s["batch"] == b and s.get("kv_type", "f32") == t)
            for impl, label, style in [(isa, f"libmha {isa}", "o-"), ("ggml", "ggml", "s--"),
                                       ("ort_gqa", "ORT GQA", "^:"), ("torch_sdpa", "torch SDPA", "v:")]:
                pts = [(n, by_key[("decode", name, impl)]["seconds"] * 1e3) for n, name in mine
                       if ("decode", name, impl) in by_key]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{label}, {t} cache")
            # % of roofline = 100 * roofline time / call time.
            roof = [(n, by_key[("decode", name, isa)]["seconds"] * 1e3
                     * by_key[("decode", name, isa)]["pct_roofline"] / 100) for n, name in mine
                    if ("decode", name, isa) in by_key and by_key[("decode", name, isa)].get("pct_roofline")]
            if roof:
                ax.plot(*zip(*roof), "--", color=color, alpha=0.5, lw=1, label=f"roofline, {t} cache")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"cached keys Skv (B={b}, 32 heads on 8 kv heads, dh 128)")
        ax.set_ylabel("ms per decode step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"decode: time per step by cache type, against the roofline\n{subtitle(info)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "decode.png"), dpi=120)
    plt.close(fig)


def plot_layer_bars(out_dir, shapes, rate, info):
    """The BERT-base layer (d_model 768, 12 heads, S=128) for each batch size."""
    bert = [s for s in shapes if s["group"] == "bert" and "layer" in s["families"]]
    if not bert:
        return
    impls = [(i, f"libmha {i}") for i in info["isas"]] + [
        (p, label) for p, (_, label) in PEERS["layer"].items()
    ]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(impls)
    for k, (impl, label) in enumerate(impls):
        xs = [j + (k - (len(impls) - 1) / 2) * width for j in range(len(bert))]
        ys = [rate("layer", s, impl) or 0 for s in bert]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, [fmt(y) if y else "n/a" for y in ys], fontsize=7)
    ax.set_xticks(range(len(bert)), [f"B={s['batch']}" for s in bert])
    ax.set_xlabel("batch size (BERT-base: d_model 768, 12 heads, S=128)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"BERT-base self-attention layer\n{subtitle(info)}", fontsize=10)
    peak_line(ax, info)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "layer.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
