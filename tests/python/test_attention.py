"""libmha.attention and the module's functions against float64 numpy: every mask field,
every available ISA through isa=, no copies of C-contiguous float32 arrays, and every
error path (Python's checks and the library's statuses)."""
import ctypes
import re
import threading

import numpy as np
import pytest

import libmha
from libmha import _capi, _core
from reference import assert_close, attention64, rand

ISAS = libmha.isa_available()
B, H, HKV, SQ, SKV, DH = 2, 4, 2, 5, 11, 16


@pytest.fixture
def rng():
    return np.random.default_rng(0)


_rng = np.random.default_rng(1)
QKV = rand(_rng, B, H, SQ, DH), rand(_rng, B, HKV, SKV, DH), rand(_rng, B, HKV, SKV, DH)


@pytest.fixture
def qkv():
    return QKV


def test_module_functions():
    assert re.fullmatch(r"\d+\.\d+\.\d+", libmha.__version__)
    assert ISAS[0] == "scalar" and set(ISAS) <= set(libmha.ISAS)
    assert list(libmha.ISAS.values()) == list(range(len(libmha.ISAS)))
    assert "unknown" not in libmha.ISAS
    assert libmha.isa_active() in ISAS


def test_gil_released():
    # ctypes.CDLL (not PyDLL) functions release the GIL during the foreign call
    assert type(_capi.lib._dll) is ctypes.CDLL


# Mask fields the library implements in mha_attention, each alone and combined; the
# arrays are made from rng in the test.
MASKS = {
    "none": lambda rng: {},
    "key_lens": lambda rng: {"key_lens": [SKV, 3]},
    "query_key_lens": lambda rng: {"query_key_lens": [[1, 2, 3, 4, 11], [11, 7, 5, 0, 1]]},
    "causal": lambda rng: {"causal": True},
    "bias_full": lambda rng: {"bias": rand(rng, B, H, SQ, SKV)},
    "bias_bert": lambda rng: {"bias": np.where(np.arange(SKV) < [[9], [4]], 0, -1e4)
                              .astype(np.float32)[:, None, None, :]},
    "bias_neg_inf": lambda rng: {"bias": np.where(rng.random((B, 1, SQ, SKV)) < 0.3, -np.inf, 0)
                                 .astype(np.float32)},
    "combined": lambda rng: {"key_lens": [8, 10], "causal": True, "bias": rand(rng, 1, H, 1, SKV),
                             "query_key_lens": [[11] * 5, [2, 3, 4, 5, 6]]},
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mask", list(MASKS))
def test_attention_matches_float64(isa, mask, qkv, rng):
    q, k, v = qkv
    fields = MASKS[mask](rng)
    before = libmha.isa_active()
    got = libmha.attention(q, k, v, isa=isa, **fields)
    assert libmha.isa_active() == before  # isa= leaves the process's ISA as it was
    assert_close(got, attention64(q, k, v, **fields)[0])


@pytest.mark.parametrize("isa", ISAS)
def test_layout_bshd_and_scale(isa, qkv):
    q, k, v = qkv
    got = libmha.attention(q, k, v, scale=0.3, causal=True, layout="bshd", isa=isa)
    assert got.shape == (B, SQ, H, DH)
    assert_close(got.transpose(0, 2, 1, 3), attention64(q, k, v, 0.3, causal=True)[0])


@pytest.mark.parametrize("isa", ISAS)
def test_v_head_dim(isa, rng):
    """v's own last dimension (mha_attn_dims.v_head_dim): needs the C implementation."""
    q, k, v = rand(rng, B, H, SQ, 24), rand(rng, B, HKV, SKV, 24), rand(rng, B, HKV, SKV, 8)
    got = libmha.attention(q, k, v, key_lens=[SKV, 6], isa=isa)
    assert got.shape == (B, H, SQ, 8)
    assert_close(got, attention64(q, k, v, key_lens=[SKV, 6])[0])
    merged = libmha.attention(q, k, v, key_lens=[SKV, 6], layout="bshd", isa=isa)
    assert_close(merged.transpose(0, 2, 1, 3), got)


# The score modifiers of mha_mask (window, softcap, ALiBi, sinks): need the C
# implementation.
MODIFIERS = {
    "window": lambda rng: {"window": 3, "causal": True},
    "window_no_causal": lambda rng: {"window": 4},
    "softcap": lambda rng: {"softcap": 0.5, "scale": 2.0},
    "alibi": lambda rng: {"alibi_slopes": -rng.uniform(0.1, 1, H).astype(np.float32),
                          "causal": True},
    "sinks": lambda rng: {"sinks": rand(rng, H, scale=2)},
    "sinks_all_masked_row": lambda rng: {"sinks": rand(rng, H), "key_lens": [0, 5]},
    "left_padding": lambda rng: {"key_starts": [3, 0], "causal": True},
    "top_left_causal": lambda rng: {"q_offsets": [0, 0], "causal": True},
    "positions": lambda rng: {"key_starts": [2, 9], "q_offsets": [-2, 4], "causal": True,
                              "window": 6, "alibi_slopes": -rng.uniform(0.1, 1, H).astype(np.float32)},
    "none_is_off": lambda rng: {"window": None, "softcap": None, "key_starts": None,
                                "q_offsets": None, "alibi_slopes": None, "sinks": None},
    "all": lambda rng: {"window": 5, "causal": True, "softcap": 1.5, "key_lens": [10, 7],
                        "alibi_slopes": -rng.uniform(0.1, 1, H).astype(np.float32),
                        "sinks": rand(rng, H), "bias": rand(rng, B, 1, SQ, SKV)},
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("modifier", list(MODIFIERS))
def test_score_modifiers(isa, modifier, qkv, rng):
    q, k, v = qkv
    fields = MODIFIERS[modifier](rng)
    assert_close(libmha.attention(q, k, v, isa=isa, **fields), attention64(q, k, v, **fields)[0])


def test_lse(qkv, rng):
    q, k, v = qkv
    fields = {"causal": True, "key_starts": [1, 4], "sinks": rand(rng, H)}
    out, lse = libmha.attention(q, k, v, lse=True, **fields)
    want, want_lse = attention64(q, k, v, **fields)
    assert_close(out, want)
    assert_close(lse, want_lse)


def test_row_without_keys_gets_zeros(qkv):
    q, k, v = qkv
    got = libmha.attention(q, k, v, query_key_lens=[[0] * SQ, [3] * SQ])
    assert np.all(got[0] == 0) and np.all(np.isfinite(got))


def test_c_contiguous_float32_is_not_copied(qkv):
    q, _, _ = qkv
    assert _core.as_f32(q, "q") is q
    converted = _core.as_f32(q.astype(np.float64), "q")
    assert converted.dtype == np.float32 and converted.flags.c_contiguous


def test_out_is_written_in_place(qkv):
    q, k, v = qkv
    out = np.full((B, H, SQ, DH), np.nan, np.float32)
    got = libmha.attention(q, k, v, out=out)
    assert got is out and np.shares_memory(got, out)
    assert_close(out, attention64(q, k, v)[0])
    out_bshd = np.empty((B, SQ, H, DH), np.float32)
    assert libmha.attention(q, k, v, layout="bshd", out=out_bshd) is out_bshd


def test_other_inputs_are_converted(qkv):
    q, k, v = qkv
    want = libmha.attention(q, k, v, key_lens=[5, 6])
    # float64, a strided view, a Fortran-ordered copy and nested lists
    k_strided = np.zeros((B, HKV, SKV, 2 * DH), np.float32)
    k_strided[..., ::2] = k
    got = libmha.attention(q.astype(np.float64), k_strided[..., ::2], np.asfortranarray(v),
                           key_lens=np.array([5, 6], np.int64))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(libmha.attention(q.tolist(), k, v, key_lens=(5, 6)), want)


@pytest.mark.parametrize("shape", [(SKV,), (B, 1, 1, SKV), (1, H, SQ, SKV), (B, H, SQ, SKV),
                                   (H, 1, SKV), (B, 1, SQ, 1)])
def test_bias_broadcast_strides(shape, qkv, rng):
    q, k, v = qkv
    bias = rand(rng, *shape)
    view, sb, sh, sq = _core.bias_view(bias, (B, H, SQ, SKV))
    if shape[-1] == SKV:  # contiguous along keys: the caller's memory, strides 0 where broadcast
        assert np.shares_memory(view, bias)
        full = np.broadcast_to(bias, (B, H, SQ, SKV))
        assert (sb, sh, sq) == tuple(0 if n == 1 else s // 4
                                     for n, s in zip((B, H, SQ), full.strides[:3]))
    assert_close(libmha.attention(q, k, v, bias=bias), attention64(q, k, v, bias=bias)[0])


def test_bias_strided_along_keys_is_copied(qkv, rng):
    q, k, v = qkv
    wide = rand(rng, B, 1, 1, 2 * SKV)
    bias = wide[..., ::2]
    view, *_ = _core.bias_view(bias, (B, H, SQ, SKV))
    assert not np.shares_memory(view, wide)
    assert_close(libmha.attention(q, k, v, bias=bias), attention64(q, k, v, bias=bias)[0])


def test_isa_call_does_not_change_other_threads(qkv):
    """isa= calls in one thread while another computes on the process's ISA."""
    q, k, v = qkv
    want = attention64(q, k, v, causal=True)[0]
    before = libmha.isa_active()
    errors = []

    def work(isa):
        try:
            for _ in range(20):
                assert_close(libmha.attention(q, k, v, causal=True, isa=isa), want)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(isa,)) for isa in [None, *ISAS, None]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and libmha.isa_active() == before


# Python-side checks: TypeError for a wrong kind of object, ValueError for a wrong shape
# or value, before the library is called.
def _bad_calls(q, k, v):
    out = np.zeros((B, H, SQ, DH), np.float32)
    return {
        "q complex": (TypeError, dict(q=q.astype(np.complex64))),
        "q object": (TypeError, dict(q=np.array([None]))),
        "q bool": (TypeError, dict(q=q > 0)),
        "q 3-D": (ValueError, dict(q=q[0])),
        "k batch": (ValueError, dict(k=k[:1])),
        "k head_dim": (ValueError, dict(k=k[..., :8])),
        "v length": (ValueError, dict(v=v[:, :, :4])),
        "v heads": (ValueError, dict(v=v[:, :1])),
        "out list": (TypeError, dict(out=out.tolist())),
        "out float64": (TypeError, dict(out=out.astype(np.float64))),
        "out shape": (ValueError, dict(out=out[:, :2])),
        "out strided": (ValueError, dict(out=np.empty((B, H, SQ, 2 * DH), np.float32)[..., ::2])),
        "out read-only": (ValueError, dict(out=np.broadcast_to(out, out.shape))),
        "out overlaps q": (ValueError, dict(out=q)),
        "key_lens float": (TypeError, dict(key_lens=[1.0, 2.0])),
        "key_lens shape": (ValueError, dict(key_lens=[1, 2, 3])),
        "key_lens int64": (ValueError, dict(key_lens=[2**32 + 1, 1])),
        "query_key_lens shape": (ValueError, dict(query_key_lens=[[1] * SQ])),
        "bias shape": (ValueError, dict(bias=np.zeros((3, SKV), np.float32))),
        "bias strings": (TypeError, dict(bias=np.array(["a"]))),
        "alibi shape": (ValueError, dict(alibi_slopes=np.zeros(H + 1))),
        "sinks shape": (ValueError, dict(sinks=np.zeros((1, H)))),
        "window huge": (ValueError, dict(window=2**31)),
        "layout": (ValueError, dict(layout="bsd")),
        "isa unknown": (ValueError, dict(isa="sse2")),
    }


@pytest.mark.parametrize("case", list(_bad_calls(*QKV)))
def test_python_errors(case, qkv):
    q, k, v = qkv
    exc, kwargs = _bad_calls(q, k, v)[case]
    args = {"q": q, "k": k, "v": v, **kwargs}
    with pytest.raises(exc):
        libmha.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def _status_str(status):
    return _capi.lib.mha_status_str(status).decode()


# The library's statuses, each as its exception carrying mha_status_str.
@pytest.mark.parametrize("case, exc, status, make", [
    ("heads not a multiple of kv_heads", libmha.ShapeError, 2,
     lambda rng: (rand(rng, 1, 3, 2, 8), rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8), {})),
    ("empty query", libmha.ShapeError, 2,
     lambda rng: (rand(rng, 1, 1, 0, 8), rand(rng, 1, 1, 2, 8), rand(rng, 1, 1, 2, 8), {})),
    ("key length > Skv", libmha.MaskError, 3,
     lambda rng: (rand(rng, 2, 1, 2, 8), rand(rng, 2, 1, 3, 8), rand(rng, 2, 1, 3, 8),
                  {"key_lens": [3, 4]})),
    ("negative key length", libmha.MaskError, 3,
     lambda rng: (rand(rng, 2, 1, 2, 8), rand(rng, 2, 1, 3, 8), rand(rng, 2, 1, 3, 8),
                  {"key_lens": [-1, 2]})),
    ("negative query key length", libmha.MaskError, 3,
     lambda rng: (rand(rng, 1, 1, 2, 8), rand(rng, 1, 1, 3, 8), rand(rng, 1, 1, 3, 8),
                  {"query_key_lens": [[1, -2]]})),
])
def test_library_errors(case, exc, status, make, rng):
    q, k, v, fields = make(rng)
    out = np.full((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), np.nan, np.float32)
    with pytest.raises(exc) as info:
        libmha.attention(q, k, v, out=out, **fields)
    assert isinstance(info.value, libmha.Error) and isinstance(info.value, ValueError)
    assert info.value.status == status
    assert str(info.value) == f"mha_attention_strided: {_status_str(status)}"
    assert np.all(np.isnan(out))  # every argument is checked before anything is written


@pytest.mark.parametrize("fields", [{"window": -1}, {"softcap": -1.0}, {"softcap": np.nan}],
                         ids=["negative window", "negative softcap", "NaN softcap"])
def test_modifier_errors(fields, qkv):
    """MHA_ERR_MASK for out-of-range score modifiers: needs the C implementation."""
    q, k, v = qkv
    with pytest.raises(libmha.MaskError, match=re.escape(_status_str(3))):
        libmha.attention(q, k, v, **fields)


def test_unavailable_isa_is_unsupported_and_restores(qkv):
    q, k, v = qkv
    missing = [n for n in _capi.ISAS if n not in ISAS]
    if missing:
        with pytest.raises(libmha.UnsupportedError, match=re.escape(_status_str(4))) as info:
            libmha.attention(q, k, v, isa=missing[0])
        assert info.value.status == 4 and info.value.func == "mha_isa_force"
    before = libmha.isa_active()
    with pytest.raises(libmha.MaskError):  # an error inside a forced call restores the ISA
        libmha.attention(q, k, v, key_lens=[99, 1], isa="scalar")
    assert libmha.isa_active() == before
