#!/usr/bin/env python3
"""libmha's q8_0 cache against ggml's: the same bytes, and the same attention.

Needs the libmha package (pip install .) and ggml-python (pip install
ggml-python==0.0.45, which builds ggml from source). Neither is a dependency of the
test suites: the plain-C port of ggml's reference quantizer in tests/test_dtypes.c is
their oracle; this is the cross-check against ggml itself.

  1. Rows of random values and the quantizer's edge cases (all zero, one huge
     value, values at x/d = k + 1/2, a scale rounded or subnormal in f16, a scale
     that overflows f16) quantized by libmha (KVCache.append into a q8_0 cache) and
     by ggml_quantize_chunk: every finite block byte for byte.
  2. Decode (B=1, 32 heads on 8 kv heads, dh 128, 4096 keys) over ggml's q8_0 cache:
     ggml_flash_attn_ext against libmha reading the very same bytes, both against
     float64 over the values the cache holds.
Exits 1 when a byte differs or libmha leaves the f32 tolerance.
"""
import ctypes as ct
import math
import sys

import numpy as np

import ggml
import libmha

GGML_Q8_0 = ggml.GGML_TYPE_Q8_0


def ggml_quantize(x):
    """ggml_quantize_chunk of rows x [n, d] to q8_0 bytes [n, d // 32 * 34]."""
    n, d = x.shape
    out = np.zeros((n, d // 32 * 34), np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    ggml.ggml_quantize_chunk(GGML_Q8_0, x.ctypes.data_as(ct.POINTER(ct.c_float)), out.ctypes.data,
                             0, n, d, None)
    return out


def libmha_quantize(x):
    """The bytes libmha's q8_0 cache holds after appending rows x [n, d]."""
    n, d = x.shape
    c = libmha.KVCache(1, 1, n, d, dtype="q8_0")
    c.append(x[None, None], x[None, None])
    return c.k[0, 0].copy()


def edge_rows(rng, d=64):
    rows = [rng.uniform(-1, 1, d) * m for m in (1, 1e-3, 1e-6, 300, 1e-30)]
    rows.append(np.zeros(d))
    r = rng.uniform(-1, 1, d)
    r[5] = 1e4
    rows.append(r)
    r = (np.arange(d) % 20 - 9.5).astype(np.float64)
    r[0] = 127.0
    rows.append(r)  # x / d exactly a half
    r = rng.uniform(-1, 1, d)
    r[1] = 0.0076
    rows.append(r)
    rows.append(rng.uniform(-1, 1, d) * 65000 * 127)  # d beyond f16
    return np.array(rows, np.float32)


def compare_bytes(rng):
    x = np.concatenate([rng.uniform(-2, 2, (500, 128)).astype(np.float32),
                        np.pad(edge_rows(rng), ((0, 0), (0, 64)))])
    ours, theirs = libmha_quantize(x), ggml_quantize(x)
    ob, tb = ours.reshape(-1, 34), theirs.reshape(-1, 34)
    finite = np.isfinite(x.reshape(-1, 32)).all(1)
    same = (ob == tb).all(1)
    bad = np.flatnonzero(finite & ~same)
    print(f"q8_0 bytes: {same[finite].sum()} of {finite.sum()} finite blocks identical to "
          f"ggml_quantize_chunk")
    for i in bad[:5]:
        print(f"  block {i}: libmha {ob[i][:6]}..., ggml {tb[i][:6]}...")
    return len(bad) == 0


def attention64(q, k, v, scale):
    """float64 decode: q [H, dh] against k, v [Hkv, n, dh]."""
    g = q.shape[0] // k.shape[0]
    kk, vv = np.repeat(k, g, 0), np.repeat(v, g, 0)
    s = scale * np.einsum("hd,hjd->hj", q, kk)
    p = np.exp(s - s.max(1, keepdims=True))
    return np.einsum("hj,hjd->hd", p / p.sum(1, keepdims=True), vv)


def compare_attention(rng, H=32, G=8, n=4096, dh=128, threads=2):
    kx, vx = (rng.uniform(-1, 1, (G * n, dh)).astype(np.float32) for _ in range(2))
    q = rng.uniform(-1, 1, (H, dh)).astype(np.float32)
    kq, vq = ggml_quantize(kx), ggml_quantize(vx)
    scale = 1.0 / math.sqrt(dh)
    # ggml: q f32 [dh, 1, H, 1], k and v q8_0 [dh, n, G, 1]
    mem = 2 * kq.nbytes + q.nbytes * 2 + (64 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
    tq = ggml.ggml_new_tensor_4d(ctx, 0, dh, 1, H, 1)
    tk = ggml.ggml_new_tensor_4d(ctx, GGML_Q8_0, dh, n, G, 1)
    tv = ggml.ggml_new_tensor_4d(ctx, GGML_Q8_0, dh, n, G, 1)
    for t, a in ((tq, q), (tk, kq), (tv, vq)):
        ct.memmove(ggml.ggml_get_data(t), a.ctypes.data, a.nbytes)
    out = ggml.ggml_flash_attn_ext(ctx, tq, tk, tv, None, scale, 0.0, 0.0)
    ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, out)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)
    theirs = np.ctypeslib.as_array(ct.cast(ggml.ggml_get_data(out), ct.POINTER(ct.c_float)),
                                   (H, dh)).copy()  # res [dh, H, 1, 1]
    ggml.ggml_free(ctx)
    # libmha over the same bytes: a q8_0 cache [1][G][n][dh] holding ggml's blocks.
    c = libmha.KVCache(1, G, n, dh, dtype="q8_0")
    c.k[0] = kq.reshape(G, n, -1)
    c.v[0] = vq.reshape(G, n, -1)
    c.lens[:] = n
    ours = c.attention(q[None, :, None, :])[0, :, 0]
    ref = attention64(q.astype(np.float64), libmha.q8_0_values(kq).reshape(G, n, dh),
                      libmha.q8_0_values(vq).reshape(G, n, dh), scale)

    def rel(a):
        return np.abs(a - ref).max() / np.abs(ref).max()

    tol = np.abs(ours - ref) / (3e-5 + 3e-5 * np.abs(ref))
    print(f"decode over ggml's q8_0 cache (H={H}, Hkv={G}, dh={dh}, {n} keys), max relative "
          f"error against float64 over the held values: libmha {rel(ours):.2e} "
          f"({tol.max():.3f} x the f32 tolerance), ggml flash_attn_ext {rel(theirs):.2e}")
    return tol.max() <= 1


def main():
    rng = np.random.default_rng(7)
    ok = compare_bytes(rng) & compare_attention(rng)
    print("ggml check: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
