"""The element types and paged caches of the Python package: float16 and bfloat16
(ml_dtypes) arrays in and out of attention without conversion, [B, S, H, d] views
passed through their strides, KVCache of every type (q8_0 bytes read back with
q8_0_values) and paged with a shuffled block table, against float64 numpy over the
values the cache holds; Layer.step over typed and paged caches."""
import numpy as np
import pytest

import libmha
from reference import assert_close, attention64, rand

ISAS = libmha.isa_available()
TYPES16 = [np.float16] + ([libmha.BFLOAT16] if libmha.BFLOAT16 is not None else [])


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def ulp_close(got, want, dtype):
    """Within one unit in the last place of dtype plus the f32 tolerance."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bits = 10 if np.dtype(dtype) == np.float16 else 7
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(want), 2.0**-14))) - bits)
    err = np.abs(got - want) / (ulp + 3e-5 * (1 + np.abs(want)))
    assert err.max(initial=0) <= 1, f"max error {err.max():.3g} x (1 ulp + tolerance)"


@pytest.mark.parametrize("dtype", TYPES16)
@pytest.mark.parametrize("isa", ISAS)
def test_attention_16bit(dtype, isa, rng):
    q, k, v = (rand(rng, *s).astype(dtype) for s in ((2, 4, 9, 32), (2, 2, 20, 32), (2, 2, 20, 32)))
    out = libmha.attention(q, k, v, causal=True, isa=isa)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 4, 9, 32)
    ulp_close(out, attention64(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                               causal=True)[0], dtype)
    given = np.empty((2, 9, 4, 32), dtype)  # out= in the type, written in place
    assert libmha.attention(q, k, v, causal=True, layout="bshd", out=given, isa=isa) is given
    assert np.array_equal(given.transpose(0, 2, 1, 3), out)
    with pytest.raises(TypeError, match="one element type"):
        libmha.attention(q, k.astype(np.float32), v, isa=isa)


def test_strided_views_are_not_copied(rng):
    """[B, S, H, d] storage viewed as [B, H, S, d]: the same result as the dense copy."""
    base = [rand(rng, 2, 13, h, 16) for h in (4, 2, 2)]
    q, k, v = (x.transpose(0, 2, 1, 3) for x in base)
    assert not q.flags.c_contiguous
    got = libmha.attention(q, k, v)
    want = libmha.attention(*(np.ascontiguousarray(x) for x in (q, k, v)))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("block_size", [0, 8])
def test_cache_types(dtype, layout, block_size, rng):
    if dtype == "bf16" and libmha.BFLOAT16 is None:
        pytest.skip("ml_dtypes is not installed")
    B, G, H, cap, dh = 2, 2, 4, 64, 32
    c = libmha.KVCache(B, G, cap, dh, layout=layout, dtype=dtype, block_size=block_size)
    if block_size:
        rng.shuffle(c.block_table.reshape(-1))  # the pool's blocks in any order
    kn, vn = rand(rng, B, G, 40, dh), rand(rng, B, G, 40, dh)
    c.append(kn, vn)
    # The values the cache holds, [B, G, cap, dh], read back from its arrays.
    def held(a):
        if dtype == "q8_0":
            a = libmha.q8_0_values(a)
        a = a.astype(np.float64)
        if layout == "bshd":
            a = a.transpose(0, 2, 1, 3)
        if block_size:  # pool [blocks, G, block, d] -> each sequence's [G, cap, d]
            a = np.stack([a[c.block_table[b]].transpose(1, 0, 2, 3).reshape(G, cap, dh)
                          for b in range(B)])
        return a
    hk, hv = held(c.k), held(c.v)
    assert np.allclose(hk[:, :, :40], kn, atol=2e-2, rtol=1e-2)  # the rows, rounded
    q = rand(rng, B, H, 3, dh)
    out, lse = c.attention(q, causal=True, lse=True)
    pos = c.lens[:, None] - 3 + np.arange(3)
    want, want_lse = attention64(q, hk, hv, key_lens=c.lens, pos=pos, causal=True)
    assert_close(out, want)
    assert_close(lse, want_lse)


def test_cache_io_16bit(rng):
    c = libmha.KVCache(1, 1, 16, 32, dtype="f16", io_dtype="f16")
    k = rand(rng, 1, 1, 16, 32).astype(np.float16)
    c.append(k, k)
    assert np.array_equal(c.k, k)  # f16 rows into an f16 cache: bits kept
    q = rand(rng, 1, 2, 1, 32).astype(np.float16)
    out = c.attention(q)
    assert out.dtype == np.float16
    with pytest.raises(TypeError, match="io_dtype"):
        c.attention(q.astype(libmha.BFLOAT16 or np.float64))


def test_layer_step_typed_and_paged(rng):
    """A decode over an f16 paged cache against the same steps on an f32 cache
    holding the f16-rounded rows: within the f32 tolerance of each other's inputs."""
    E, H, G = 64, 4, 2
    w = [rand(rng, n, E, scale=E ** -0.5) for n in (E, G * 16, G * 16)]
    layer = libmha.Layer(H, *w, kv_heads=G, w_o=rand(rng, E, E, scale=E ** -0.5))
    typed = libmha.KVCache(2, G, 32, 16, dtype="f16", block_size=4)
    rng.shuffle(typed.block_table.reshape(-1))
    x = rand(rng, 2, 5, E)
    y = layer.step(x, typed)
    assert y.shape == (2, 5, E) and list(typed.lens) == [5, 5]
    for _ in range(3):
        y = layer.step(y[:, -1:], typed)
    assert list(typed.lens) == [8, 8] and np.all(np.isfinite(y))


def test_q8_0_values():
    d = np.array([0.5], np.float16).view(np.uint8)
    block = np.concatenate([d, np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    assert np.array_equal(libmha.q8_0_values(block), 0.5 * np.arange(-16, 16, dtype=np.float32))
    with pytest.raises(ValueError, match="34-byte"):
        libmha.q8_0_values(np.zeros(33, np.uint8))


def padded_copy(a):
    """a's values in a larger array, seen through a strided view of the same shape."""
    big = np.zeros(a.shape[:-1] + (a.shape[-1] + 34,), dtype=a.dtype)
    view = big[..., 34:]
    view[...] = a
    return view


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("block_size", [0, 8])
def test_cache_wraps_callers_arrays(dtype, layout, block_size, rng):
    """KVCache.wrap over strided copies of an owning cache's arrays: the same results
    bit for bit, and appends land in the caller's memory."""
    if dtype == "bf16" and libmha.BFLOAT16 is None:
        pytest.skip("ml_dtypes is not installed")
    B, G, H, cap, dh = 2, 2, 4, 32, 32
    own = libmha.KVCache(B, G, cap, dh, layout=layout, dtype=dtype, block_size=block_size)
    if block_size:
        rng.shuffle(own.block_table.reshape(-1))
    own.append(rand(rng, B, G, 9, dh), rand(rng, B, G, 9, dh))
    k, v = padded_copy(own.k), padded_copy(own.v)
    lens, table = own.lens.copy(), None if not block_size else own.block_table.copy()
    c = libmha.KVCache.wrap(k, v, lens, layout=layout, dtype="q8_0" if dtype == "q8_0" else None,
                            block_table=table)
    assert (c.batch, c.kv_heads, c.capacity, c.head_dim, c.dtype) == (B, G, cap, dh, dtype)
    assert c.k is k and c.lens is lens and c._c.stride_s != own._c.stride_s
    q = rand(rng, B, H, 2, dh)
    assert np.array_equal(c.attention(q, causal=True), own.attention(q, causal=True))
    kn, vn = rand(rng, B, G, 3, dh), rand(rng, B, G, 3, dh)
    own.append(kn, vn)
    c.append(kn, vn)
    assert list(lens) == [12, 12]
    assert np.array_equal(k.view(np.uint8), own.k.view(np.uint8))
    assert np.array_equal(v.view(np.uint8), own.v.view(np.uint8))


def test_cache_wraps_torch_tensors(rng):
    """A transformers StaticCache-like layer, [B, Hkv, max_len, D] torch tensors in
    bf16 and f16, with rows written in place."""
    torch = pytest.importorskip("torch")
    B, G, H, cap, dh = 2, 2, 4, 16, 32
    for t in (torch.float16, torch.bfloat16):
        if t == torch.bfloat16 and libmha.BFLOAT16 is None:
            continue
        keys, values = torch.zeros(B, G, cap, dh, dtype=t), torch.zeros(B, G, cap, dh, dtype=t)
        lens = torch.zeros(B, dtype=torch.int32)
        c = libmha.KVCache.wrap(keys, values, lens)
        kn = rand(rng, B, G, 5, dh)
        c.append(kn, kn)
        assert lens.tolist() == [5, 5]
        held = keys.double().numpy()
        assert np.allclose(held[:, :, :5], kn, rtol=1e-2, atol=1e-2) and not held[:, :, 5:].any()
        q = rand(rng, B, H, 1, dh)
        want = attention64(q, held, values.double().numpy(), key_lens=lens.numpy(),
                           pos=np.full((B, 1), 4))[0]
        assert_close(c.attention(q), want)


def test_cache_wrap_errors(rng):
    k = np.zeros((2, 2, 8, 32), np.float32)
    with pytest.raises(ValueError, match="last axis"):
        libmha.KVCache.wrap(k[..., ::2], k[..., ::2])
    with pytest.raises(TypeError, match="must be float16"):
        libmha.KVCache.wrap(k.astype(np.float16), k)
    with pytest.raises(ValueError, match="differ"):
        libmha.KVCache.wrap(k, k[:, :, :4])
    with pytest.raises(TypeError, match="q8_0"):
        libmha.KVCache.wrap(k.view(np.uint8), k.view(np.uint8))
    with pytest.raises(ValueError, match="34-byte"):
        libmha.KVCache.wrap(np.zeros((2, 2, 8, 40), np.uint8), np.zeros((2, 2, 8, 40), np.uint8),
                            dtype="q8_0")
    with pytest.raises(TypeError, match="lens"):
        libmha.KVCache.wrap(k, k, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="lens must have shape"):
        libmha.KVCache.wrap(k, k, np.zeros(3, np.int32))
    with pytest.raises(TypeError, match="block_table"):
        libmha.KVCache.wrap(k, k, block_table=np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
        libmha.KVCache.wrap([[1.0]], k)
