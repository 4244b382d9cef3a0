"""libmha.torch.scaled_dot_product_attention against float64 (and against torch's own
SDPA where torch has it): every mask kind the mapping knows and the bias fallback,
is_causal top-left with L != S, GQA, strided views read in place, f16 and bf16, out=
and lse, the errors; torch.compile through the custom op where torch.library has it."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import libmha  # noqa: E402
import libmha.torch as lt  # noqa: E402

B, H, HKV, L, S, E = 2, 4, 2, 7, 13, 16


def sdpa64(q, k, v, mask=None, is_causal=False, scale=None):
    """torch's SDPA definition in float64 (numpy), with zeros for rows that see no key
    (libmha's rule; torch gives NaN there)."""
    q, k, v = (np.asarray(t.to(torch.float64)) for t in (q, k, v))
    Hq, Hk = q.shape[1], k.shape[1]
    k, v = np.repeat(k, Hq // Hk, axis=1), np.repeat(v, Hq // Hk, axis=1)
    s = (1 / math.sqrt(q.shape[-1]) if scale is None else scale) * q @ k.swapaxes(-1, -2)
    Lq, Sk = s.shape[-2:]
    if is_causal:
        s = np.where(np.tril(np.ones((Lq, Sk), bool)), s, -np.inf)
    if mask is not None:
        m = np.asarray(mask.to(torch.float64) if mask.dtype != torch.bool else mask)
        s = np.where(m, s, -np.inf) if m.dtype == bool else s + m
    mx = s.max(-1, keepdims=True)
    seen = np.isfinite(mx)
    e = np.exp(s - np.where(seen, mx, 0))
    return np.where(seen, (e @ v) / np.where(seen, e.sum(-1, keepdims=True), 1), 0)


def rand(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(hash(shape) % 2**31)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def check(got, want, dtype=torch.float32, scale=1.0):
    tol = {torch.float32: 3e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    got = np.asarray(got.to(torch.float64))
    assert np.isfinite(got).all()
    err = np.abs(got - want) / (tol * (1 + np.abs(want)))
    assert err.max() <= scale, f"{err.max():.3g} x tolerance"


def lens_mask(lens, starts=None):
    j = torch.arange(S)
    m = j[None, :] < torch.tensor(lens)[:, None]
    if starts is not None:
        m &= j[None, :] >= torch.tensor(starts)[:, None]
    return m[:, None, None, :]  # [B, 1, 1, S]


def band(offsets, window=0, lens=None):
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    out = []
    for b, off in enumerate(offsets):
        m = j <= i + off
        if window:
            m &= j > i + off - window
        if lens is not None:
            m &= j < lens[b]
        out.append(m)
    return torch.stack(out)[:, None]  # [B, 1, L, S]


MASKS = {
    "none": lambda: None,
    "key_padding": lambda: lens_mask([S, 9]),
    "left_padding": lambda: lens_mask([S, S], starts=[0, 4]),
    "both_ends": lambda: lens_mask([11, S], starts=[2, 5]),
    "causal_bottom_right": lambda: band([S - L, S - L]),
    "causal_per_sequence": lambda: band([S - L, 2], lens=[S, 10]),
    "sliding_window": lambda: band([S - L, S - L], window=4),
    "rows_without_keys": lambda: band([-3, S - L]),
    "float_zero_inf": lambda: torch.zeros(B, 1, L, S).masked_fill_(~band([S - L, 3]), -math.inf),
    "random_bool": lambda: rand(B, H, L, S) > -0.6,
    "float_bias": lambda: rand(1, H, L, S),
    "2d_bool": lambda: band([S - L, S - L])[0, 0],
}
FIELDS = {"key_padding", "left_padding", "both_ends", "causal_bottom_right",
          "causal_per_sequence", "sliding_window", "rows_without_keys", "float_zero_inf",
          "2d_bool"}


@pytest.mark.parametrize("name", list(MASKS))
def test_masks(name):
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    mask = MASKS[name]()
    with torch.no_grad():
        check(lt.scaled_dot_product_attention(q, k, v, attn_mask=mask), sdpa64(q, k, v, mask))
    if mask is not None and mask.dtype == torch.bool and mask.dim() == 4:
        found = lt.mask_fields(np.asarray(mask.expand(B, H, L, S)[:, 0]))
        assert (found is not None) == (name in FIELDS)


@pytest.mark.skipif(not hasattr(torch.nn.functional, "scaled_dot_product_attention"),
                    reason="torch < 2.0 has no SDPA")
@pytest.mark.parametrize("name", [n for n in MASKS if n != "rows_without_keys"])
def test_against_torch_sdpa(name):
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    mask = MASKS[name]()
    if mask is not None and mask.is_floating_point():
        mask64 = mask.double()  # torch misreads a float32 mask on float64 operands
    else:
        mask64 = mask
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=mask64)
    check(lt.scaled_dot_product_attention(q, k, v, attn_mask=mask), want.numpy())


def test_mask_cache_follows_the_tensor():
    """The fields found for one mask are not reused for another at the same address
    (two tensors over one numpy buffer) or for the same tensor changed in place."""
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    storage = np.empty((B, 1, L, S), bool)
    for window in (0, 4, 2):
        storage[...] = band([S - L, S - L], window=window).numpy()
        mask = torch.from_numpy(storage)
        check(lt.scaled_dot_product_attention(q, k, v, attn_mask=mask), sdpa64(q, k, v, mask))
        del mask
    mask = lens_mask([S, S])
    check(lt.scaled_dot_product_attention(q, k, v, attn_mask=mask), sdpa64(q, k, v, mask))
    mask[1, ..., 9:] = False
    check(lt.scaled_dot_product_attention(q, k, v, attn_mask=mask), sdpa64(q, k, v, mask))


@pytest.mark.parametrize("Lq", [L, S, 1, 20])
def test_is_causal_top_left(Lq):
    q, k, v = rand(B, H, Lq, E), rand(B, H, S, E), rand(B, H, S, E)
    check(lt.scaled_dot_product_attention(q, k, v, is_causal=True), sdpa64(q, k, v, is_causal=True))


def test_gqa_and_scale():
    q, k, v = rand(B, H, L, E), rand(B, HKV, S, E), rand(B, HKV, S, 24)
    got = lt.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=0.3)
    check(got, sdpa64(q, k, v, scale=0.3))
    with pytest.raises(ValueError, match="enable_gqa"):
        lt.scaled_dot_product_attention(q, k, v)


def test_views_are_read_in_place():
    """[B, S, H, D] storage viewed as [B, H, S, D], and one fused QKV buffer: no copy."""
    qkv = rand(B, S, 3 * H, E)
    q, k, v = (qkv[:, :, i * H:(i + 1) * H].transpose(1, 2) for i in range(3))
    for t in (q, k, v):
        assert lt._tensor(t, "t") is t
    out = torch.empty(B, S, H, E).transpose(1, 2)
    got = lt.scaled_dot_product_attention(q, k, v, is_causal=True, out=out)
    assert got is out
    check(out, sdpa64(q, k, v, is_causal=True))
    dense = lt.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                            is_causal=True)
    assert torch.equal(out, dense)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit(dtype):
    q, k, v = rand(B, H, L, E, dtype=dtype), rand(B, H, S, E, dtype=dtype), rand(B, H, S, E, dtype=dtype)
    mask = band([S - L, 3])
    got = lt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.dtype == dtype
    check(got, sdpa64(q, k, v, mask), dtype)


def test_lse_and_modifiers():
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    out, lse = lt.scaled_dot_product_attention(q, k, v, attn_mask=lens_mask([S, 5]),
                                               return_lse=True)
    s = np.asarray(q.double() @ k.double().transpose(-1, -2)) / math.sqrt(E)
    s[1, ..., 5:] = -np.inf
    want = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert np.allclose(lse.numpy(), want, rtol=3e-5, atol=3e-5)
    # window, softcap, sinks and slopes as libmha.attention takes them
    sinks = torch.nn.Parameter(rand(H))
    kw = dict(window=5, softcap=3.0, alibi_slopes=-rand(H).abs())
    with torch.no_grad():
        got = lt.scaled_dot_product_attention(q, k, v, sinks=sinks, **kw)
    want = libmha.attention(q.numpy(), k.numpy(), v.numpy(), sinks=sinks.detach().numpy(), **kw)
    assert np.array_equal(got.numpy(), want)
    with pytest.raises(RuntimeError, match="inference only"):
        lt.scaled_dot_product_attention(q, k, v, sinks=sinks)


def test_errors():
    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    f = lt.scaled_dot_product_attention
    with pytest.raises(ValueError, match="dropout"):
        f(q, k, v, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="inference only"):
        f(q.requires_grad_(), k, v)
    q = q.detach()
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        f(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="one dtype"):
        f(q, k.half(), v)
    with pytest.raises(ValueError, match="last dimension"):
        f(q, k[..., :8], v)
    with pytest.raises(ValueError, match="not both"):
        f(q, k, v, attn_mask=lens_mask([S, 3]), is_causal=True)
    with pytest.raises(ValueError, match="broadcast"):
        f(q, k, v, attn_mask=torch.ones(3, 1, 1, S, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask"):
        f(q, k, v, attn_mask=torch.ones(1, 1, 1, S, dtype=torch.int32))
    with pytest.raises(ValueError, match="out must be"):
        f(q, k, v, out=torch.empty(B, H, L, E, dtype=torch.float16))
    with pytest.raises(libmha.MaskError):
        f(q, k, v, softcap=-1.0)


def test_three_dimensional_inputs():
    q, k, v = rand(H, L, E), rand(H, S, E), rand(H, S, E)
    got = lt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got.shape == (H, L, E)
    check(got, sdpa64(q[None], k[None], v[None], is_causal=True)[0])


def test_threads():
    n = libmha.get_num_threads()
    libmha.set_num_threads(1)
    assert libmha.get_num_threads() == 1
    q, k, v = rand(1, 8, 1, 64), rand(1, 2, 3000, 64), rand(1, 2, 3000, 64)
    one = lt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    libmha.set_num_threads(2)
    assert torch.equal(one, lt.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    libmha.set_num_threads(n)
    with pytest.raises(ValueError):
        libmha.set_num_threads(0)


@pytest.mark.skipif(lt._sdpa_op is None, reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_traces_the_op():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return lt.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2

    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    mask = lens_mask([S, 9])
    compiled = torch.compile(Attn(), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(q, k, v, mask), Attn()(q, k, v, mask))
    torch.library.opcheck(torch.ops.libmha.sdpa.default,
                          (q, k, v, mask, False, None, 0, 0.0, None, None))
