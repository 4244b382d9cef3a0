"""float64 numpy references for the tests, following mha.h's definitions."""
import numpy as np

# mha.h: the scalar reference within 2e-5 + 2e-5|r| of float64; an optimized ISA adds
# its 1e-5 + 1e-5|r| against the scalar reference.
TOL = 3e-5


def assert_close(got, want, tol=TOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want) / (tol + tol * np.abs(want))
    assert np.all(np.isfinite(got)) and err.max(initial=0) <= 1, \
        f"max error {err.max():.3g} x tolerance {tol} + {tol}|r|"


def rand(rng, *shape, scale=1.0):
    """U(-scale, scale) as float32, the scale of mha.h's accuracy contract."""
    return (scale * rng.uniform(-1, 1, shape)).astype(np.float32)


def attention64(q, k, v, scale=None, *, key_lens=None, query_key_lens=None, bias=None,
                causal=False, window=0, softcap=0.0, alibi_slopes=None, sinks=None, pos=None,
                key_starts=None, q_offsets=None):
    """(out [B, H, Sq, dv], lse [B, H, Sq]) of mha_attention's definition: row i at
    position pos[b, i] (default q_offsets[b] + i, else i + Skv - Sq), softcap, then bias
    and ALiBi, masks (keys before key_starts[b] too), sinks in the denominator only;
    zeros and lse -inf for a row that sees no key."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, H, Sq, dh = q.shape
    Hkv, Skv = k.shape[1:3]
    k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
    s = (1 / np.sqrt(dh) if scale is None else scale) * np.einsum("bhid,bhjd->bhij", q, k)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.broadcast_to(np.asarray(bias, np.float64), s.shape)
    if pos is None and q_offsets is not None:
        pos = np.asarray(q_offsets, np.int64)[:, None] + np.arange(Sq)
    if pos is None:
        pos = np.broadcast_to(np.arange(Sq) + Skv - Sq, (B, Sq))
    p, j = np.asarray(pos)[:, None, :, None], np.arange(Skv)
    if alibi_slopes is not None:
        s = s + np.asarray(alibi_slopes, np.float64)[None, :, None, None] * (j - p)
    visible = s != -np.inf
    if key_lens is not None:
        visible &= j < np.asarray(key_lens)[:, None, None, None]
    if query_key_lens is not None:
        visible &= j < np.asarray(query_key_lens)[:, None, :, None]
    if key_starts is not None:
        visible &= j >= np.asarray(key_starts)[:, None, None, None]
    if causal:
        visible &= j <= p
    if window:
        visible &= j > p - window
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0)
    e = np.where(visible, np.exp(s - m), 0)
    denom = e.sum(-1, keepdims=True)
    total = denom
    if sinks is not None:
        total = denom + np.exp(np.asarray(sinks, np.float64)[None, :, None, None] - m)
    seen = visible.any(-1, keepdims=True)
    out = np.where(seen, (e @ v) / np.where(seen, total, 1), 0)
    lse = np.where(seen, np.log(np.where(seen, denom, 1)) + m, -np.inf)[..., 0]
    return out, lse


def layer64(x_q, x_k, x_v, heads, w, b, *, kv_heads=None, causal=False, key_lens=None):
    """The layer of mha.h in float64: w and b hold q, k, v, o weights and biases
    (nn.Linear layout; a bias or w_o may be None), inputs [B, S, E]."""
    def lin(x, wt, bias):
        y = np.asarray(x, np.float64) @ np.asarray(wt, np.float64).T
        return y if bias is None else y + bias

    kv_heads = kv_heads or heads
    Q, K, V = lin(x_q, w[0], b[0]), lin(x_k, w[1], b[1]), lin(x_v, w[2], b[2])
    B, Sq, Skv = Q.shape[0], Q.shape[1], K.shape[1]
    dh, dv = Q.shape[2] // heads, V.shape[2] // kv_heads
    Q = Q.reshape(B, Sq, heads, dh).transpose(0, 2, 1, 3)
    K = K.reshape(B, Skv, kv_heads, dh).transpose(0, 2, 1, 3)
    V = V.reshape(B, Skv, kv_heads, dv).transpose(0, 2, 1, 3)
    O = attention64(Q, K, V, causal=causal, key_lens=key_lens)[0]
    O = O.transpose(0, 2, 1, 3).reshape(B, Sq, heads * dv)
    return O if w[3] is None else lin(O, w[3], b[3])


def weights(rng, E, heads, kv_heads, dh, dv, *, k_in=None, v_in=None, out_dim=None, bias=True):
    """Layer weights [w_q, w_k, w_v, w_o] and biases of PyTorch's scale (out_dim 0: no w_o)."""
    k_in, v_in = k_in or E, v_in or E
    s = 1 / np.sqrt(E)
    w = [rand(rng, heads * dh, E, scale=s), rand(rng, kv_heads * dh, k_in, scale=s),
         rand(rng, kv_heads * dv, v_in, scale=s),
         None if out_dim == 0 else rand(rng, out_dim or E, heads * dv, scale=s)]
    b = [rand(rng, len(wt), scale=0.5) if bias and wt is not None else None for wt in w]
    return w, b
