"""libmha.torch against torch's own SDPA and libmha in transformers against "sdpa", side
by side in one process on one set of threads (torch and libmha share its OpenMP runtime).

  1. attention: libmha.torch.scaled_dot_product_attention and
     torch.nn.functional.scaled_dot_product_attention on mha-bench's attention shapes
     (--shapes-json, from `mha-bench --shapes-json`), f32 and bf16, q, k, v and out as
     [B, H, S, D] views of [B, S, H, D] storage (as transformers hands them), and libmha
     on dense [B, H, S, D] tensors: ratios torch / libmha and strided / dense.
  2. overhead: one query row against 16 keys (H 32, Hkv 8, dh 128), microseconds per
     call of libmha.torch, of torch's SDPA and of libmha.attention over numpy.
  3. model: a Llama-like transformers model (hidden 1024, 16 heads, 4 kv heads, 4 layers,
     seq 512, batch 1) prefill forward (logits of the last row) on attn_implementation
     "libmha" and "sdpa": the time of the whole forward and of its attention calls.

The contenders of a case take turns call by call, in rotating order, for about --rounds x
--min-time seconds each, and each keeps the median of its calls: a shared host's speed
drifts by more than the few percent strided and dense differ between blocks taken one
after another, while interleaved calls see the same machine. The model case times blocks
of --min-time seconds per implementation, --rounds times, keeping the best.
torch's chosen SDPA backend is named by its dispatcher. Prints a table and writes --json."""
import argparse
import copy
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

import libmha
import libmha.torch as lt


def block(fn, min_time):
    """Mean seconds per call of fn over a block of at least min_time."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= min_time:
            return t / n


def race(fns, min_time, rounds):
    """{name: median seconds per call} of the fns called in turn (the first of each turn
    rotating) for about rounds * min_time seconds each, and at least 5 turns."""
    names = list(fns)
    times = {name: [] for name in names}
    for fn in fns.values():
        fn()
    end = time.perf_counter() + rounds * min_time * len(names)
    turn = 0
    while turn < 5 or time.perf_counter() < end:
        first = turn % len(names)
        for name in names[first:] + names[:first]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
        turn += 1
    return {name: statistics.median(t) for name, t in times.items()}


def torch_kernel(q, k, v, **kw):
    """The SDPA backend torch picks for these inputs (its dispatcher's own choice)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, **kw)).name.lower()
    except (AttributeError, ImportError, RuntimeError, TypeError, ValueError):
        return "?"


def views(B, S, H, D, dtype):
    """A [B, H, S, D] view of [B, S, H, D] storage, random in [-1, 1]."""
    return (torch.rand(B, S, H, D) * 2 - 1).to(dtype).transpose(1, 2)


def attention_cases(shapes, dtypes, max_gflop, min_time, rounds):
    rows = []
    for s in shapes:
        if "attention" not in s["families"] or s["dtype"] != "f32":
            continue
        B, S, H, Hkv, D = s["batch"], s["seq"], s["heads"], s["kv_heads"], s["head_dim"]
        gflop = s["work"]["attention"] / 1e9
        if gflop > max_gflop:
            continue
        for dtype in dtypes:
            q, k, v = views(B, S, H, D, dtype), views(B, S, Hkv, D, dtype), views(B, S, Hkv, D, dtype)
            out = torch.empty(B, S, H, D, dtype=dtype).transpose(1, 2)
            dq, dk, dv = q.contiguous(), k.contiguous(), v.contiguous()
            dout = torch.empty(B, H, S, D, dtype=dtype)
            kw = dict(is_causal=s["causal"], enable_gqa=H != Hkv)
            fns = {
                "libmha": lambda: lt.scaled_dot_product_attention(q, k, v, out=out, **kw),
                "libmha_dense": lambda: lt.scaled_dot_product_attention(dq, dk, dv, out=dout,
                                                                        **kw),
                "torch": lambda: F.scaled_dot_product_attention(q, k, v, **kw),
            }
            with torch.inference_mode():
                kernel = torch_kernel(q, k, v, **kw)
                t = race(fns, min_time, rounds)
            rows.append({"case": s["name"], "dtype": str(dtype).removeprefix("torch."),
                         "gflop": gflop, "torch_kernel": kernel, **{n + "_ms": t[n] * 1e3 for n in t},
                         "libmha_gflops": gflop / t["libmha"],
                         "vs_torch": t["torch"] / t["libmha"],
                         "strided_vs_dense": t["libmha_dense"] / t["libmha"]})
            print(f"{s['name']:18} {rows[-1]['dtype']:8} libmha {t['libmha'] * 1e3:8.3f} ms "
                  f"({gflop / t['libmha']:5.1f} GFLOP/s)  dense {t['libmha_dense'] * 1e3:8.3f}  "
                  f"torch {t['torch'] * 1e3:8.3f} ({kernel})  torch/libmha "
                  f"{rows[-1]['vs_torch']:.2f}x  dense/strided {rows[-1]['strided_vs_dense']:.2f}x",
                  flush=True)
    return rows


def overhead(min_time, rounds):
    B, H, Hkv, S, D = 1, 32, 8, 16, 128
    q, k, v = torch.rand(B, H, 1, D), torch.rand(B, Hkv, S, D), torch.rand(B, Hkv, S, D)
    out = torch.empty(B, H, 1, D)
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    fns = {
        "libmha.torch": lambda: lt.scaled_dot_product_attention(q, k, v, enable_gqa=True, out=out),
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "libmha.attention": lambda: libmha.attention(qn, kn, vn),
    }
    with torch.inference_mode():
        t = race(fns, min_time, rounds)
    row = {n + "_us": t[n] * 1e6 for n in t}
    print("one-row decode call (H 32, Hkv 8, dh 128, 16 keys): "
          + ", ".join(f"{n} {t[n] * 1e6:.1f} us" for n in t), flush=True)
    return row


def model_case(min_time, rounds):
    import transformers

    import libmha.hf

    libmha.hf.register()
    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=4, num_attention_heads=16,
                                      num_key_value_heads=4, vocab_size=32000,
                                      max_position_embeddings=1024)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    spent = {"sdpa": 0.0, "libmha": 0.0}
    for name in spent:
        inner = ALL_ATTENTION_FUNCTIONS[name]

        def timed(*args, _inner=inner, _name=name, **kw):
            t0 = time.perf_counter()
            r = _inner(*args, **kw)
            spent[_name] += time.perf_counter() - t0
            return r

        ALL_ATTENTION_FUNCTIONS[name] = timed
    torch.manual_seed(0)
    models = {impl: transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation=impl).eval() for impl in spent}
    assert {m.config._attn_implementation for m in models.values()} == set(spent)
    models["libmha"].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(0, 32000, (1, 512))
    calls = {impl: 0 for impl in spent}

    def forward(impl):
        def run():
            models[impl](input_ids=ids, logits_to_keep=1)  # a prefill: the last row's logits
            calls[impl] += 1
        return run

    with torch.inference_mode():
        want = models["sdpa"](input_ids=ids).logits
        got = models["libmha"](input_ids=ids).logits
        err = float(((got - want).abs().max() / want.abs().max()))
        best = {impl: math.inf for impl in spent}
        attn = dict(best)
        for _ in range(rounds):
            for impl in spent:
                spent[impl], calls[impl] = 0.0, 0
                t = block(forward(impl), min_time)
                best[impl] = min(best[impl], t)
                # the attention calls of the block's forwards (its first, untimed, included)
                attn[impl] = min(attn[impl], spent[impl] / (calls[impl]))
    row = {"forward_ms": {i: best[i] * 1e3 for i in best},
           "attention_ms": {i: attn[i] * 1e3 for i in attn}, "max_rel_logit_diff": err}
    print(f"Llama-like forward (hidden 1024, 16/4 heads, 4 layers, seq 512, batch 1): "
          f"libmha {best['libmha'] * 1e3:.1f} ms (attention {attn['libmha'] * 1e3:.1f} ms), "
          f"sdpa {best['sdpa'] * 1e3:.1f} ms (attention {attn['sdpa'] * 1e3:.1f} ms), "
          f"forward sdpa/libmha {best['sdpa'] / best['libmha']:.2f}x, attention "
          f"{attn['sdpa'] / attn['libmha']:.2f}x; logits max rel. diff {err:.1e}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes-json", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-gflop", type=float, default=20.0,
                    help="skip attention shapes of more work (GFLOP)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    libmha.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, libmha ISA {libmha.isa_active()}, {a.threads} threads",
          flush=True)
    shapes = json.load(open(a.shapes_json))
    res = {"torch": torch.__version__, "isa": libmha.isa_active(), "threads": a.threads,
           "attention": attention_cases(shapes, (torch.float32, torch.bfloat16), a.max_gflop,
                                        a.min_time, a.rounds),
           "overhead": overhead(a.min_time, a.rounds),
           "model": model_case(max(a.min_time, 2.0), a.rounds)}
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
