#!/usr/bin/python3
"""Merges mha-bench's Google Benchmark JSON and peers.py's JSON into a report.

Writes to --out-dir:
  results.json    every measurement: family, shape, implementation, seconds per
                  call, GFLOP/s (GB/s for the transpose), % of the measured peak
  table.md        one row per (kernel family, shape): libmha per ISA, each peer,
                  libmha's best ISA over the best peer, the SIMD gain, % of peak
  attention.png   attention GFLOP/s against sequence length (B=1, 12 heads, dh 64)
  layer_seq.png   the whole layer, same shapes
  layer.png       bar chart of the BERT-base layer (B = 1, 8, 32; S = 128)

GFLOP/s come from seconds per call and the FLOP counts of bench/main.cc:
  GEMM 2*M*N*K; attention 4*B*H*Sq*Skv*dh, halved when causal; the layer is the
  QKV projection + attention + output projection. The transpose moves 2 * tensor
  bytes per call (read once, written once), as memcpy's bandwidth is counted.
With several rounds (--bench and --peers repeated), each entry keeps its best
(shortest) time.
"""
import argparse
import datetime
import json
import os
import platform

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ISAS = ["scalar", "avx2", "neon"]
# Peer implementations: (column of the table, legend label, family).
PEERS = {
    "openblas": ("OpenBLAS", "OpenBLAS cblas_sgemm", "qkv"),
    "torch_unfused": ("PyTorch", "PyTorch matmul-softmax-matmul", "attention"),
    "torch_mha": ("PyTorch", "torch.nn.MultiheadAttention (fast path)", "layer"),
    "ort_mha": ("ONNX Runtime", "ONNX Runtime MultiHeadAttention", "attention"),
    "ort_layer": ("ONNX Runtime", "ONNX Runtime MatMul+MultiHeadAttention", "layer"),
}
PEER_COLUMNS = ["OpenBLAS", "PyTorch", "ONNX Runtime"]
FAMILY_TITLES = {
    "qkv": "fused QKV projection",
    "attention": "attention",
    "transpose": "head transpose",
    "layer": "whole layer",
}


def work(family, s):
    """FLOP per call (bytes per call for the transpose), as in bench/main.cc."""
    b, n, h, hkv, dh = s["batch"], s["seq"], s["heads"], s["kv_heads"], s["head_dim"]
    e, m = h * dh, b * n
    qkv = 2.0 * m * (h + 2 * hkv) * dh * e
    attention = 4.0 * b * h * n * n * dh / (2 if s["causal"] else 1)
    return {
        "qkv": qkv,
        "attention": attention,
        "layer": qkv + attention + 2.0 * m * e * e,
        "transpose": 2.0 * m * e * 4,
    }[family]


def load_bench(paths):
    """(family, shape, impl) -> seconds per call, best over the files; the context;
    the peaks: the best of every measurement (before the benchmarks, and the
    peak/fma/<isa>, peak/memcpy/64MiB benchmarks at their start and end), as
    {"fma": {isa: GFLOP/s}, "memcpy": GB/s}; and for the transpose, the seconds of
    a memcpy of the same bytes interleaved with it (from the same run as the best
    time)."""
    times, errors, context, copy_times = {}, {}, {}, {}
    peaks = {"fma": {}, "memcpy": 0.0}

    def better_fma(isa, g):
        peaks["fma"][isa] = max(g, peaks["fma"].get(isa, 0.0))

    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        context = doc.get("context", {})
        for isa in ISAS:
            if f"peak_gflops_{isa}" in context:
                better_fma(isa, float(context[f"peak_gflops_{isa}"]))
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
                if "memcpy_s" in b:
                    copy_times[key] = b["memcpy_s"]
    return times, errors, context, peaks, copy_times


def load_peers(paths):
    times, skipped, context = {}, {}, {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        context = doc.get("context", {})
        for r in doc["results"]:
            key = (r["family"], r["shape"], r["impl"])
            if "seconds" in r:
                times[key] = min(r["seconds"], times.get(key, r["seconds"]))
            else:
                skipped[key] = r["skipped"]
    return times, skipped, context


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fmt(x):
    if x is None:
        return "—"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="what `mha-bench --shapes-json` printed")
    ap.add_argument("--bench", action="append", required=True, help="mha-bench JSON (repeatable)")
    ap.add_argument("--peers", action="append", default=[], help="peers.py JSON (repeatable)")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    with open(args.shapes) as f:
        shapes = json.load(f)
    btimes, berrors, bctx, peaks, copy_times = load_bench(args.bench)
    ptimes, pskipped, pctx = load_peers(args.peers)
    times = {**btimes, **ptimes}

    isa_peak = peaks["fma"]
    peak = max(isa_peak.values())
    memcpy = peaks["memcpy"]
    isas = [i for i in ISAS if i in isa_peak]
    threads = bctx.get("omp_threads", "?")
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "threads": threads,
        "mode": bctx.get("mode", "?"),
        "peak_gflops": peak,
        "peak_gflops_per_isa": isa_peak,
        "memcpy_gbps": memcpy,
        "libmha": bctx.get("mha_version", "?"),
        "openblas": bctx.get("openblas", "not built"),
        "torch": pctx.get("torch", "not run"),
        "onnxruntime": pctx.get("onnxruntime", "not run"),
        "scalar_cap_gflop": bctx.get("scalar_cap_gflop", "?"),
    }

    def rate(family, s, impl):
        """GFLOP/s (GB/s for the transpose), or None when not measured."""
        t = times.get((family, s["name"], impl))
        return None if t is None else work(family, s) / t / 1e9

    results = []
    for (family, shape, impl), t in sorted(times.items()):
        s = next((x for x in shapes if x["name"] == shape), None)
        if s is None:
            continue
        r = rate(family, s, impl)
        rec = {"family": family, "shape": shape, "impl": impl, "seconds": t}
        if family == "transpose":
            copy = copy_times.get((family, shape, impl))
            rec.update(gbps=r, pct_memcpy=100 * copy / t if copy else 100 * r / memcpy)
        else:
            rec.update(gflops=r, pct_peak=100 * r / peak)
            if impl in isa_peak:
                rec["pct_isa_peak"] = 100 * r / isa_peak[impl]
        results.append(rec)
    skipped = [
        {"family": f, "shape": s, "impl": i, "reason": why}
        for (f, s, i), why in sorted({**berrors, **pskipped}.items())
    ]
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"context": info, "results": results, "skipped": skipped}, f, indent=1)
        f.write("\n")

    memcpy_pct = {(r["shape"], r["impl"]): r["pct_memcpy"] for r in results
                  if r["family"] == "transpose"}
    write_table(args.out_dir, shapes, isas, rate, info, skipped, memcpy_pct)
    plot_vs_seq(args.out_dir, shapes, isas, rate, info, "attention", ["torch_unfused", "ort_mha"])
    plot_vs_seq(args.out_dir, shapes, isas, rate, info, "layer", ["torch_mha", "ort_layer"])
    plot_layer_bars(args.out_dir, shapes, isas, rate, info)


def shape_text(s):
    text = f"B={s['batch']} S={s['seq']} H={s['heads']}"
    if s["kv_heads"] != s["heads"]:
        text += f" Hkv={s['kv_heads']}"
    text += f" dh={s['head_dim']}"
    return text + (" causal" if s["causal"] else "")


def write_table(out_dir, shapes, isas, rate, info, skipped, memcpy_pct):
    """memcpy_pct: (shape, isa) -> the transpose's speed as % of memcpy's."""
    lines = [
        f"# libmha benchmark ({info['mode']} run)",
        "",
        f"{info['date']}, {info['cpu']}, {info['threads']} threads (OpenMP, OpenBLAS, "
        f"PyTorch and ONNX Runtime alike).",
        "",
        "Measured peak: FMA-throughput loop "
        + ", ".join(f"{i} {v:.1f} GFLOP/s" for i, v in info["peak_gflops_per_isa"].items())
        + f"; memcpy {info['memcpy_gbps']:.1f} GB/s (2 x bytes copied, 64 MiB).",
        "",
        f"Versions: libmha {info['libmha']}, torch {info['torch']}, onnxruntime "
        f"{info['onnxruntime']}, {info['openblas']}.",
        "",
        "Cells are GFLOP/s (head transpose: GB/s, 2 x tensor bytes per call). "
        "FLOP: GEMM 2*M*N*K; attention 4*B*H*Sq*Skv*dh, halved when causal; "
        "layer = QKV + attention + output projection. PyTorch is matmul-softmax-matmul "
        "for attention and torch.nn.MultiheadAttention (fast path) for the layer; "
        "ONNX Runtime is com.microsoft MultiHeadAttention (with MatMuls around it for "
        "the layer). \"vs peers\" is libmha's best ISA over each peer, "
        "\"SIMD gain\" its best SIMD ISA over scalar, \"% of peak\" libmha's best ISA "
        "over the best FMA peak (transpose: over memcpy; for 64 MiB, a memcpy of the same bytes timed alongside each call).",
        "",
    ]
    head = ["kernel", "shape"] + [f"libmha {i}" for i in isas] + PEER_COLUMNS
    head += ["vs peers", "SIMD gain", "% of peak"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family in ["qkv", "attention", "transpose", "layer"]:
        for s in shapes:
            if family not in s["families"]:
                continue
            mine = {i: rate(family, s, i) for i in isas}
            peers = {}
            for impl, (col, _, fam) in PEERS.items():
                if fam == family:
                    peers[col] = (impl, rate(family, s, impl))
            if not any(mine.values()) and not any(r for _, r in peers.values()):
                continue
            best_isa = max((i for i in isas if mine[i]), key=lambda i: mine[i], default=None)
            best = mine[best_isa] if best_isa else None
            ratio = ", ".join(
                f"{best / r:.2f}x {'ORT' if col == 'ONNX Runtime' else col}"
                for col, (_, r) in peers.items() if best and r
            ) or "—"
            simd = [mine[i] for i in isas if i != "scalar" and mine[i]]
            gain = f"{max(simd) / mine['scalar']:.1f}x" if simd and mine.get("scalar") else "—"
            if best is None:
                pct = "—"
            elif family == "transpose":
                pct = f"{memcpy_pct[(s['name'], best_isa)]:.0f}% memcpy"
            else:
                pct = f"{100 * best / info['peak_gflops']:.0f}%"
            row = [FAMILY_TITLES[family], f"{s['name']} ({shape_text(s)})"]
            row += [fmt(mine[i]) for i in isas]
            row += [fmt(peers[c][1]) if c in peers else "" for c in PEER_COLUMNS]
            row += [ratio, gain, pct]
            lines.append("| " + " | ".join(row) + " |")
    notes = [
        f"- libmha scalar runs only where a call is at most {info['scalar_cap_gflop']} "
        "GFLOP (`--scalar-cap`); above, the cell is empty."
    ]
    for sk in skipped:
        notes.append(f"- {sk['family']}/{sk['shape']}/{sk['impl']}: {sk['reason']}")
    lines += ["", "Not measured:", ""] + notes + [""]
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(lines))


def subtitle(info):
    return f"{info['cpu']}, {info['threads']} threads, {info['date'][:10]}"


def plot_vs_seq(out_dir, shapes, isas, rate, info, family, peer_impls):
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
    for impl, label, style in [(i, f"libmha {i}", "o-") for i in isas] + [
        (p, PEERS[p][1], "s--") for p in peer_impls
    ]:
        pts = [(s["seq"], rate(family, s, impl)) for s in series]
        pts = [(x, y) for x, y in pts if y]
        if pts:
            ax.plot(*zip(*pts), style, label=label)
    ax.axhline(info["peak_gflops"], color="grey", ls=":", label=f"measured FMA peak ({info['peak_gflops']:.0f} GFLOP/s)")
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


def plot_layer_bars(out_dir, shapes, isas, rate, info):
    """The BERT-base layer (d_model 768, 12 heads, S=128) for each batch size."""
    bert = [s for s in shapes if s["group"] == "bert" and "layer" in s["families"]]
    if not bert:
        return
    impls = [(i, f"libmha {i}") for i in isas] + [
        (p, PEERS[p][1]) for p in ("torch_mha", "ort_layer")
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
    ax.axhline(info["peak_gflops"], color="grey", ls=":", label=f"measured FMA peak ({info['peak_gflops']:.0f} GFLOP/s)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "layer.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
