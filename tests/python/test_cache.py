"""libmha.KVCache (mha_kv_append, mha_attention_cached) and Layer.step (mha_layer_step)
against float64 numpy: chunked prefill and decode steps in both cache layouts,
per-sequence lengths, lse, score modifiers, v_head_dim, and the error paths. Everything
that calls the library here needs the C implementation of the cached API."""
import numpy as np
import pytest

import libmha
from reference import assert_close, attention64, layer64, rand, weights

ISAS = libmha.isa_available()


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def cache_kv(cache):
    """The cache's K and V as [B, Hkv, capacity, d], whatever its layout."""
    if cache.layout == "bshd":
        return cache.k.transpose(0, 2, 1, 3), cache.v.transpose(0, 2, 1, 3)
    return cache.k, cache.v


def cached64(cache, q, **fields):
    """attention64 over the whole cache with key_lens = lens, row i at lens[b] - Sq + i."""
    k, v = cache_kv(cache)
    pos = cache.lens[:, None] - q.shape[2] + np.arange(q.shape[2])
    return attention64(q, k, v, key_lens=cache.lens, pos=pos, **fields)


def test_arrays_and_strides():
    c = libmha.KVCache(2, 3, 10, 8, v_head_dim=4, layout="bshd")
    assert c.k.shape == (2, 10, 3, 8) and c.v.shape == (2, 10, 3, 4)
    assert c.lens.dtype == np.int32 and list(c.lens) == [0, 0]
    assert (c._c.stride_b, c._c.stride_h, c._c.stride_s) == (240, 8, 24)
    assert (c._c.v_stride_b, c._c.v_stride_h, c._c.v_stride_s) == (120, 4, 12)
    c = libmha.KVCache(2, 3, 10, 8)
    assert c.k.shape == c.v.shape == (2, 3, 10, 8)
    assert (c._c.stride_b, c._c.stride_h, c._c.stride_s) == (240, 80, 8)


def test_arrays_start_on_cache_lines(rng):
    """The cache's arrays and the outputs the package allocates start on 64-byte lines
    (NumPy's own start 16 bytes off one, which row loads pay for)."""
    for dtype, block_size in (("f32", 0), ("f16", 16), ("q8_0", 0)):
        c = libmha.KVCache(2, 3, 1024, 64, dtype=dtype, block_size=block_size)
        assert c.k.ctypes.data % 64 == 0 and c.v.ctypes.data % 64 == 0
        assert not c.k.any() and not c.v.any()
    q = rand(rng, 1, 2, 300, 64)
    assert libmha.attention(q, q, q).ctypes.data % 64 == 0


def thp_mode():
    """Linux's transparent huge page mode (always, madvise, never), None without it."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def huge_kib(address):
    """AnonHugePages (KiB) of the mapping of this process that holds address."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="no transparent huge pages")
def test_large_caches_on_huge_pages():
    """A cache of 2 MiB or more starts on a 2 MiB boundary and, once written, sits on huge
    pages: a shuffled pool of small blocks would otherwise pay a page walk per block."""
    c = libmha.KVCache(1, 8, 4096, 128, dtype="f16", block_size=16)  # 8 MiB each
    for a in (c.k, c.v):
        assert a.ctypes.data % (2 << 20) == 0 and not a.any()
        a[...] = 1
        assert huge_kib(a.ctypes.data) >= 2048


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_chunked_prefill_then_decode(isa, layout, rng):
    B, H, Hkv, cap, dh = 2, 4, 2, 16, 8
    cache = libmha.KVCache(B, Hkv, cap, dh, layout=layout)
    K, V, Q = rand(rng, B, Hkv, 12, dh), rand(rng, B, Hkv, 12, dh), rand(rng, B, H, 12, dh)
    start = 0
    for n in (5, 4, 1, 1, 1):
        cache.append(K[:, :, start:start + n], V[:, :, start:start + n])
        assert list(cache.lens) == [start + n] * B
        q = Q[:, :, start:start + n]
        out, lse = cache.attention(q, causal=True, lse=True, isa=isa)
        want, want_lse = attention64(q, K[:, :, :start + n], V[:, :, :start + n], causal=True)
        assert_close(out, want)
        assert_close(lse, want_lse)
        start += n
    k, v = cache_kv(cache)
    np.testing.assert_array_equal(k[:, :, :12], K)
    np.testing.assert_array_equal(v[:, :, :12], V)
    assert not k[:, :, 12:].any() and not v[:, :, 12:].any()


@pytest.mark.parametrize("isa", ISAS)
def test_sequences_of_different_lengths(isa, rng):
    cache = libmha.KVCache(3, 1, 12, 16)
    cache.append(rand(rng, 3, 1, 6, 16), rand(rng, 3, 1, 6, 16))
    cache.lens[:] = [6, 2, 0]  # roll sequence 1 back, empty sequence 2
    cache.append(rand(rng, 3, 1, 3, 16), rand(rng, 3, 1, 3, 16))
    assert list(cache.lens) == [9, 5, 3]
    q = rand(rng, 3, 2, 4, 16)  # 4 rows: sequence 2's first row sits at position -1
    out, lse = cache.attention(q, causal=True, lse=True, layout="bshd", isa=isa)
    want, want_lse = cached64(cache, q, causal=True)
    assert_close(out.transpose(0, 2, 1, 3), want)
    assert np.all(out[2, 0] == 0) and np.all(lse[2, :, 0] == -np.inf)
    assert_close(lse[:, :, 1:], want_lse[:, :, 1:])


@pytest.mark.parametrize("isa", ISAS)
def test_masks_and_score_modifiers(isa, rng):
    B, H, cap = 2, 4, 10
    cache = libmha.KVCache(B, 2, cap, 8)
    cache.append(rand(rng, B, 2, 7, 8), rand(rng, B, 2, 7, 8))
    cache.lens[:] = [7, 5]
    q = rand(rng, B, H, 3, 8)
    fields = {"causal": True, "window": 4, "softcap": 2.0, "bias": rand(rng, B, 1, 3, cap),
              "alibi_slopes": -rng.uniform(0.1, 1, H).astype(np.float32),
              "sinks": rand(rng, H), "query_key_lens": [[7, 6, 7], [2, 5, 10]]}
    out, lse = cache.attention(q, lse=True, isa=isa, **fields)
    want, want_lse = cached64(cache, q, **fields)
    assert_close(out, want)
    assert_close(lse, want_lse)


@pytest.mark.parametrize("isa", ISAS)
def test_v_head_dim(isa, rng):
    cache = libmha.KVCache(2, 1, 8, 16, v_head_dim=4, layout="bshd")
    cache.append(rand(rng, 2, 1, 5, 16), rand(rng, 2, 1, 5, 4))
    q = rand(rng, 2, 2, 2, 16)
    out = cache.attention(q, causal=True, isa=isa)
    assert out.shape == (2, 2, 2, 4)
    assert_close(out, cached64(cache, q, causal=True)[0])


@pytest.mark.parametrize("isa", ISAS)
def test_layer_step_matches_causal_forward(isa, rng):
    w, b = weights(rng, 48, 6, 2, 8, 8)
    layer = libmha.Layer(6, w[0], w[1], w[2], b_q=b[0], b_k=b[1], b_v=b[2], w_o=w[3], b_o=b[3])
    x = rand(rng, 2, 9, 48)
    cache = libmha.KVCache(2, layer.kv_heads, 12, layer.head_dim)
    outs = [layer.step(x[:, s:e], cache, isa=isa) for s, e in ((0, 5), (5, 6), (6, 7), (7, 9))]
    assert list(cache.lens) == [9, 9]
    assert_close(np.concatenate(outs, axis=1), layer64(x, x, x, 6, w, b, kv_heads=2, causal=True))


def test_layer_step_from_torch_sequence_first(rng):
    torch = pytest.importorskip("torch")
    m = torch.nn.MultiheadAttention(32, 4).double().eval()  # batch_first=False: [S, B, E]
    layer = libmha.Layer.from_torch(m)
    x = torch.from_numpy(rng.uniform(-1, 1, (6, 2, 32)))
    with torch.no_grad():
        want = m(x, x, x, attn_mask=torch.triu(torch.ones(6, 6, dtype=torch.bool), 1),
                 need_weights=False)[0]
    cache = libmha.KVCache(2, 4, 8, 8)
    xn = x.numpy()
    got = np.concatenate([layer.step(xn[:4], cache), layer.step(xn[4:5], cache),
                          layer.step(xn[5:], cache)], axis=0)
    assert_close(got, want.numpy())


def test_python_errors(rng):
    for kwargs in ({"batch": 0}, {"capacity": -1}, {"v_head_dim": -1}, {"layout": "bsd"}):
        args = {"batch": 2, "kv_heads": 1, "capacity": 4, "head_dim": 8, **kwargs}
        with pytest.raises(ValueError):
            libmha.KVCache(**args)
    cache = libmha.KVCache(2, 1, 4, 8)
    with pytest.raises(ValueError):
        cache.append(rand(rng, 2, 1, 2, 4), rand(rng, 2, 1, 2, 8))  # head_dim
    with pytest.raises(ValueError):
        cache.append(rand(rng, 2, 1, 2, 8), rand(rng, 2, 1, 3, 8))  # rows differ
    with pytest.raises(TypeError):
        cache.append(rand(rng, 2, 1, 2, 8) > 0, rand(rng, 2, 1, 2, 8))
    with pytest.raises(ValueError):
        cache.attention(rand(rng, 1, 1, 1, 8))  # batch
    with pytest.raises(ValueError):
        cache.attention(rand(rng, 2, 1, 1, 8), bias=np.zeros((2, 1, 1, 5)))  # 5 != capacity
    with pytest.raises(ValueError):
        cache.attention(rand(rng, 2, 1, 1, 8), out=cache.k.reshape(-1)[:16].reshape(2, 1, 1, 8))
    assert list(cache.lens) == [0, 0]
    w, _ = weights(rng, 8, 1, 1, 8, 8)
    layer = libmha.Layer(1, *w[:3])
    with pytest.raises(TypeError):
        layer.step(rand(rng, 2, 1, 8), None)
    with pytest.raises(ValueError):
        layer.step(rand(rng, 3, 1, 8), cache)


def test_library_errors_leave_cache_untouched(rng):
    cache = libmha.KVCache(2, 1, 4, 8)
    cache.append(rand(rng, 2, 1, 3, 8), rand(rng, 2, 1, 3, 8))
    k, v = cache.k.copy(), cache.v.copy()
    with pytest.raises(libmha.ShapeError) as info:
        cache.append(rand(rng, 2, 1, 2, 8), rand(rng, 2, 1, 2, 8))  # 3 + 2 > capacity 4
    assert info.value.func == "mha_kv_append"
    assert list(cache.lens) == [3, 3]
    np.testing.assert_array_equal(cache.k, k)
    np.testing.assert_array_equal(cache.v, v)
    w, _ = weights(rng, 8, 1, 1, 8, 8)
    layer = libmha.Layer(1, *w[:3])
    with pytest.raises(libmha.ShapeError):
        layer.step(rand(rng, 2, 2, 8), cache)  # 3 + 2 > capacity 4
    assert list(cache.lens) == [3, 3]
    np.testing.assert_array_equal(cache.k, k)
    cache.lens[:] = [5, 0]  # beyond capacity
    with pytest.raises(libmha.ShapeError):
        cache.attention(rand(rng, 2, 1, 1, 8))
    cache.lens[:] = [2, 2]
    with pytest.raises(libmha.MaskError):
        cache.attention(rand(rng, 2, 1, 1, 8), query_key_lens=[[5], [1]])  # > capacity
