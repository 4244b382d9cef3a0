"""libmha against float64 PyTorch: torch.nn.MultiheadAttention (self and cross,
key padding mask, causal), the seed's BERT SelfAttention and d2l's
MultiHeadAttention with valid_lens. Usage: interop_torch.py path/to/libmha.so

The scalar reference must match within 2e-5 + 2e-5*|r| (mha.h); an optimized
ISA adds its 1e-5 + 1e-5*|r| allowance against the scalar reference."""
import ctypes as C
import math
import os
import sys

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)

# The package's own bindings of mha.h, over the library under test.
os.environ["LIBMHA_LIBRARY"] = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from libmha._capi import F32P, I32P, AttnDims, KvCache, LayerDesc, Mask, lib  # noqa: E402

isa = lib.mha_isa_name(lib.mha_isa_active()).decode()
if os.environ.get("MHA_ISA", isa) != isa:
    print(f"MHA_ISA={os.environ['MHA_ISA']} is not available on this CPU: skipped")
    sys.exit(77)  # meson's "skipped"
TOL = 2e-5 if isa == "scalar" else 3e-5
keep = []  # arrays whose memory ctypes pointers refer to


def f32(t):
    """A float32 C-contiguous copy of a tensor (or None) and its pointer."""
    if t is None:
        return None
    a = np.ascontiguousarray(t.detach().numpy(), dtype=np.float32)
    keep.append(a)
    return a.ctypes.data_as(F32P)


def i32(values):
    a = np.ascontiguousarray(np.asarray(values, dtype=np.int32))
    keep.append(a)
    return a.ctypes.data_as(I32P)


def libmha(heads, head_dim, w, b, query, key, value, mask=None, kv_heads=0):
    """Runs one libmha layer; w and b hold q, k, v, o weights and biases (o may be None)."""
    B, Sq, q_in = query.shape
    Skv, k_in, v_in = key.shape[1], key.shape[2], value.shape[2]
    out_dim = 0 if w[3] is None else w[3].shape[0]
    desc = LayerDesc(heads, kv_heads, head_dim, q_in, k_in, v_in, out_dim,
                     *[f32(t) for t in w[:3]], *[f32(t) for t in b[:3]], f32(w[3]), f32(b[3]))
    layer = C.c_void_p()
    assert lib.mha_layer_create(C.byref(desc), C.byref(layer)) == 0
    out = np.full((B, Sq, out_dim or heads * head_dim), np.nan, dtype=np.float32)
    xq = f32(query)
    xk = xq if key is query else f32(key)
    xv = xk if value is key else f32(value)
    st = lib.mha_layer_forward(layer, xq, xk, xv, B, Sq, Skv, C.byref(mask) if mask else None,
                               out.ctypes.data_as(F32P), None, 0)
    lib.mha_layer_destroy(layer)
    assert st == 0, st
    return out


results = []


def check(name, got, want):
    want = want.detach().numpy()
    ratio = np.max(np.abs(got - want) / (TOL + TOL * np.abs(want)))
    ok = bool(np.isfinite(ratio) and ratio <= 1.0)
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max abs err {np.max(np.abs(got - want)):.3g}, "
          f"{ratio:.3f} x tolerance {TOL:g} + {TOL:g}|r|")


def torch_mha(E, heads, B, Sq, Skv, kdim=None, vdim=None):
    m = nn.MultiheadAttention(E, heads, batch_first=True, kdim=kdim, vdim=vdim).eval()
    with torch.no_grad():
        m.in_proj_bias.uniform_(-0.5, 0.5)
        m.out_proj.bias.uniform_(-0.5, 0.5)
    x = torch.rand(B, Sq, E) * 2 - 1
    if kdim is None:
        return m, x, x, x
    return m, x, torch.rand(B, Skv, kdim) * 2 - 1, torch.rand(B, Skv, vdim) * 2 - 1


def mha_weights(m):
    E = m.embed_dim
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.split(E)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = m.in_proj_bias.split(E)
    return [wq, wk, wv, m.out_proj.weight], [bq, bk, bv, m.out_proj.bias]


with torch.no_grad():
    # nn.MultiheadAttention, self-attention: plain, key padding mask, causal.
    m, x, _, _ = torch_mha(64, 4, 2, 7, 7)
    w, b = mha_weights(m)
    check("nn.MultiheadAttention self", libmha(4, 16, w, b, x, x, x),
          m(x, x, x, need_weights=False)[0])
    pad = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    check("nn.MultiheadAttention key_padding_mask",
          libmha(4, 16, w, b, x, x, x, Mask(key_lens=i32([7, 4]))),
          m(x, x, x, key_padding_mask=pad, need_weights=False)[0])
    causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)
    check("nn.MultiheadAttention causal", libmha(4, 16, w, b, x, x, x, Mask(causal=1)),
          m(x, x, x, attn_mask=causal, need_weights=False)[0])

    # Cross-attention with kdim/vdim and a key padding mask.
    m, x, y, z = torch_mha(48, 3, 2, 5, 9, kdim=32, vdim=20)
    w, b = mha_weights(m)
    pad = torch.tensor([[False] * 6 + [True] * 3, [False] * 9])
    check("nn.MultiheadAttention cross kdim/vdim + key_padding_mask",
          libmha(3, 16, w, b, x, y, z, Mask(key_lens=i32([6, 9]))),
          m(x, y, z, key_padding_mask=pad, need_weights=False)[0])

    # BERT SelfAttention of the seed: hidden 768, 12 heads, additive mask [B,1,1,S].
    class SelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.num_attention_heads = heads
            self.attention_head_size = int(hidden / heads)
            self.all_head_size = heads * self.attention_head_size
            self.query = nn.Linear(hidden, self.all_head_size)
            self.key = nn.Linear(hidden, self.all_head_size)
            self.value = nn.Linear(hidden, self.all_head_size)
            self.dropout = nn.Dropout(0.1)

        def transpose_for_scores(self, x):
            x = x.view(*x.size()[:-1], self.num_attention_heads, self.attention_head_size)
            return x.permute(0, 2, 1, 3)

        def forward(self, hidden_states, attention_mask):
            q = self.transpose_for_scores(self.query(hidden_states))
            k = self.transpose_for_scores(self.key(hidden_states))
            v = self.transpose_for_scores(self.value(hidden_states))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
            probs = self.dropout(nn.Softmax(dim=-1)(scores + attention_mask))
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(*ctx.size()[:-2], self.all_head_size)

    bert = SelfAttention(768, 12).eval()
    B, S = 2, 16
    h = torch.rand(B, S, 768) * 2 - 1
    valid = torch.tensor([[1.0] * S, [1.0] * 11 + [0.0] * 5])
    add_mask = ((1.0 - valid) * -10000.0)[:, None, None, :]
    check("BERT SelfAttention (768, 12 heads, [B,1,1,S] mask)",
          libmha(12, 64, [bert.query.weight, bert.key.weight, bert.value.weight, None],
                 [bert.query.bias, bert.key.bias, bert.value.bias, None], h, h, h,
                 Mask(bias=f32(add_mask), bias_stride_b=S)),
          bert(h, add_mask))

    # d2l MultiHeadAttention (no bias, masked_softmax with -1e6, valid_lens).
    def sequence_mask(X, valid_len, value=0):
        mask = torch.arange(X.size(1))[None, :] < valid_len[:, None]
        X[~mask] = value
        return X

    def masked_softmax(X, valid_lens):
        if valid_lens is None:
            return nn.functional.softmax(X, dim=-1)
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)

    def transpose_qkv(X, num_heads):
        X = X.reshape(X.shape[0], X.shape[1], num_heads, -1).permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(X, num_heads):
        X = X.reshape(-1, num_heads, X.shape[1], X.shape[2]).permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)

    class MultiHeadAttention(nn.Module):
        def __init__(self, key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                     bias=False):
            super().__init__()
            self.num_heads = num_heads
            self.dropout = nn.Dropout(dropout)
            self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
            self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
            self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
            self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

        def forward(self, queries, keys, values, valid_lens):
            queries = transpose_qkv(self.W_q(queries), self.num_heads)
            keys = transpose_qkv(self.W_k(keys), self.num_heads)
            values = transpose_qkv(self.W_v(values), self.num_heads)
            if valid_lens is not None:
                valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
            d = queries.shape[-1]
            scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
            weights = masked_softmax(scores, valid_lens)
            output = torch.bmm(self.dropout(weights), values)
            return self.W_o(transpose_output(output, self.num_heads))

    d2l = MultiHeadAttention(100, 100, 100, 100, 5, 0.5).eval()
    w = [d2l.W_q.weight, d2l.W_k.weight, d2l.W_v.weight, d2l.W_o.weight]
    nob = [None] * 4
    X, Y = torch.ones(2, 4, 100), torch.ones(2, 6, 100)
    got = libmha(5, 20, w, nob, X, Y, Y, Mask(key_lens=i32([3, 2])))
    assert got.shape == (2, 4, 100), got.shape
    check("d2l MultiHeadAttention seed example, valid_lens (B,)", got,
          d2l(X, Y, Y, torch.tensor([3, 2])))
    X, Y = torch.rand(2, 4, 100) * 2 - 1, torch.rand(2, 6, 100) * 2 - 1
    vl = torch.tensor([[1, 2, 3, 4], [6, 5, 4, 3]])
    check("d2l MultiHeadAttention, valid_lens (B, Sq)",
          libmha(5, 20, w, nob, X, Y, Y, Mask(query_key_lens=i32(vl))), d2l(X, Y, Y, vl))


def modified_attention(q, k, v, causal=False, window=0, softcap=0.0, slopes=None, sinks=None,
                       lens=None):
    """float64 attention with the score modifiers, straight from mha.h: q [B,H,Sq,dk], k [B,Hkv,S,dk],
    v [B,Hkv,S,dv]; row i of sequence b at p(i) = lens[b] - Sq + i (lens None: S); keys j < lens[b]."""
    B, H, Sq, dk = q.shape
    S = k.shape[2]
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(dk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    lens = torch.full((B,), S) if lens is None else torch.tensor(lens)
    p = lens.view(B, 1, 1, 1) - Sq + torch.arange(Sq).view(1, 1, Sq, 1)
    j = torch.arange(S).view(1, 1, 1, S)
    if slopes is not None:
        s = s + slopes.view(1, H, 1, 1) * (j - p)
    hidden = j >= lens.view(B, 1, 1, 1)
    if causal:
        hidden = hidden | (j > p)
    if window > 0:
        hidden = hidden | (j <= p - window)
    s = s.masked_fill(hidden, -math.inf)
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.view(1, H, 1, 1))
    m = m.masked_fill(torch.isinf(m), 0.0)
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    if sinks is not None:
        den = den + torch.exp(sinks.view(1, H, 1, 1) - m)
    out = (e @ v) / den
    return out.masked_fill(hidden.all(-1, keepdim=True), 0.0)  # no visible key: zeros


def attention(q, k, v, mask):
    B, H, Sq, dk = q.shape
    dims = AttnDims(B, H, k.shape[1], Sq, k.shape[2], dk, v.shape[3])
    out = np.full((B, H, Sq, v.shape[3]), np.nan, dtype=np.float32)
    st = lib.mha_attention(C.byref(dims), f32(q), f32(k), f32(v), 1 / math.sqrt(dk), C.byref(mask),
                           out.ctypes.data_as(F32P), 0)
    assert st == 0, st
    return out


def attention_cached(q, k, v, lens, mask):
    """The same through a [B][cap][Hkv][d] cache (cap > lens), chunked prefill positions."""
    B, H, Sq, dk = q.shape
    Hkv, S, dv = k.shape[1], k.shape[2], v.shape[3]
    cap = S + 5
    kc = np.zeros((B, cap, Hkv, dk), np.float32)
    vc = np.zeros((B, cap, Hkv, dv), np.float32)
    kc[:, :S] = k.permute(0, 2, 1, 3).numpy()
    vc[:, :S] = v.permute(0, 2, 1, 3).numpy()
    keep.extend([kc, vc])
    cache = KvCache(kc.ctypes.data, vc.ctypes.data, B, Hkv, dk, cap,
                    cap * Hkv * dk, dk, Hkv * dk, dv, cap * Hkv * dv, dv, Hkv * dv)
    out = np.full((B, H, Sq, dv), np.nan, dtype=np.float32)
    st = lib.mha_attention_cached(C.byref(cache), i32(lens), f32(q), H, Sq, 1 / math.sqrt(dk),
                                  C.byref(mask), out.ctypes.data_as(F32P), 0, None)
    assert st == 0, st
    return out


with torch.no_grad():
    # The score modifiers of current decoders, each model family's formula in float64,
    # GQA 8/2, dk 64, dv 48, 300 keys (windows end inside kernel tiles).
    B, H, Hkv, S = 2, 8, 2, 300
    q, k = torch.rand(B, H, S, 64) * 2 - 1, torch.rand(B, Hkv, S, 64) * 2 - 1
    v = torch.rand(B, Hkv, S, 48) * 2 - 1
    families = [
        ("Mistral: sliding window 100 + causal", dict(causal=True, window=100)),
        ("Gemma 2: softcap 50, window 4096, causal", dict(causal=True, window=4096, softcap=50.0)),
        ("Gemma 2: softcap 5, scores up to ~10 (q x 10), causal",
         dict(causal=True, softcap=5.0, qscale=10.0)),
        ("BLOOM: ALiBi slopes 2^(-8h/H), causal",
         dict(causal=True, slopes=2.0 ** (-8.0 * torch.arange(1, H + 1) / H))),
        ("gpt-oss: sinks, window 128, causal",
         dict(causal=True, window=128, sinks=torch.rand(H) * 4 - 2)),
    ]
    for name, kw in families:
        qs = q * kw.pop("qscale", 1.0)
        mask = Mask(causal=int(kw.get("causal", False)), window=kw.get("window", 0),
                    softcap=kw.get("softcap", 0.0), alibi_slopes=f32(kw.get("slopes")),
                    sinks=f32(kw.get("sinks")))
        check(name, attention(qs, k, v, mask), modified_attention(qs, k, v, **kw))
        # Chunked prefill through the cache: the last 60 rows at lens 300 and 240.
        lens = [300, 240]
        want = modified_attention(qs[:, :, -60:], k, v, lens=lens, **kw)
        check(name + " (cache, chunked prefill)",
              attention_cached(qs[:, :, -60:], k, v, lens, mask), want)

passed = sum(results)
print(f"isa {isa}: {passed} passed, {len(results) - passed} failed")
sys.exit(0 if all(results) else 1)
