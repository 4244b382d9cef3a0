"""libmha.Layer from numpy weights against float64 numpy, Layer.from_torch against
float64 torch.nn.MultiheadAttention (self- and cross-attention, key padding, causal,
batch_first either way, with and without bias), and the Layer's error paths."""
import numpy as np
import pytest

import libmha
from reference import assert_close, layer64, rand, weights

torch = pytest.importorskip("torch")
nn = torch.nn
ISAS = libmha.isa_available()


@pytest.fixture
def rng():
    return np.random.default_rng(2)


def make_layer(w, b, heads, **kw):
    return libmha.Layer(heads, w[0], w[1], w[2], b_q=b[0], b_k=b[1], b_v=b[2], w_o=w[3],
                        b_o=b[3], **kw)


@pytest.mark.parametrize("isa", ISAS)
def test_gqa_layer_matches_float64(isa, rng):
    w, b = weights(rng, 48, 6, 2, 8, 8)
    layer = make_layer(w, b, 6)
    assert (layer.heads, layer.kv_heads, layer.head_dim, layer.v_head_dim) == (6, 2, 8, 8)
    x = rand(rng, 3, 7, 48)
    got = layer(x, key_lens=[7, 5, 1], causal=True, isa=isa)
    assert_close(got, layer64(x, x, x, 6, w, b, kv_heads=2, causal=True, key_lens=[7, 5, 1]))


def test_cross_attention_without_output_projection(rng):
    w, b = weights(rng, 32, 4, 4, 8, 8, k_in=20, v_in=12, out_dim=0, bias=False)
    layer = make_layer(w, b, 4)
    xq, xk, xv = rand(rng, 2, 5, 32), rand(rng, 2, 9, 20), rand(rng, 2, 9, 12)
    got = layer(xq, xk, xv, key_lens=[9, 4])
    assert got.shape == (2, 5, 32)
    assert_close(got, layer64(xq, xk, xv, 4, w, b, key_lens=[9, 4]))


def test_bias_mask(rng):
    w, b = weights(rng, 32, 4, 4, 8, 8)
    layer = make_layer(w, b, 4)
    x = rand(rng, 2, 6, 32)
    bias = np.where(np.arange(6) < [[6], [3]], 0, -np.inf).astype(np.float32)[:, None, None, :]
    assert_close(layer(x, bias=bias), layer64(x, x, x, 4, w, b, key_lens=[6, 3]))


@pytest.mark.parametrize("isa", ISAS)
def test_layer_v_head_dim(isa, rng):
    """v_head_dim != head_dim (mha_layer_desc.v_head_dim): needs the C implementation."""
    w, b = weights(rng, 40, 4, 2, 12, 6)
    layer = make_layer(w, b, 4)
    assert (layer.head_dim, layer.v_head_dim) == (12, 6)
    x = rand(rng, 2, 5, 40)
    assert_close(layer(x, causal=True, isa=isa),
                 layer64(x, x, x, 4, w, b, kv_heads=2, causal=True))


def torch_mha(E, heads, *, kdim=None, vdim=None, bias=True, batch_first=True):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E, heads, bias=bias, kdim=kdim, vdim=vdim,
                              batch_first=batch_first).double().eval()
    if bias:
        with torch.no_grad():
            m.in_proj_bias.uniform_(-0.5, 0.5)
            m.out_proj.bias.uniform_(-0.5, 0.5)
    return m


def tensor(rng, *shape):
    return torch.from_numpy(rng.uniform(-1, 1, shape))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_from_torch_self_attention(isa, batch_first, rng):
    m = torch_mha(64, 4, batch_first=batch_first)
    layer = libmha.Layer.from_torch(m)
    B, S = 3, 7
    x = tensor(rng, B, S, 64) if batch_first else tensor(rng, S, B, 64)
    lens = [7, 4, 1]
    pad = torch.arange(S)[None, :] >= torch.tensor(lens)[:, None]
    causal = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    with torch.no_grad():
        plain = m(x, x, x, need_weights=False)[0]
        padded = m(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        masked = m(x, x, x, attn_mask=causal, need_weights=False)[0]
    xn = x.numpy()
    assert_close(layer(xn, isa=isa), plain.numpy())
    assert_close(layer(xn, key_lens=lens, isa=isa), padded.numpy())
    assert_close(layer(xn, xn, xn, causal=True, isa=isa), masked.numpy())


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_cross_attention_kdim_vdim(batch_first, bias, rng):
    m = torch_mha(48, 3, kdim=32, vdim=20, bias=bias, batch_first=batch_first)
    layer = libmha.Layer.from_torch(m)
    B, Sq, Skv = 2, 5, 9
    dims = (lambda s: (B, s)) if batch_first else (lambda s: (s, B))
    x, y, z = tensor(rng, *dims(Sq), 48), tensor(rng, *dims(Skv), 32), tensor(rng, *dims(Skv), 20)
    lens = [6, 9]
    pad = torch.arange(Skv)[None, :] >= torch.tensor(lens)[:, None]
    with torch.no_grad():
        want = m(x, y, z, key_padding_mask=pad, need_weights=False)[0]
    got = layer(x.numpy(), y.numpy(), z.numpy(), key_lens=lens)
    assert got.shape == tuple(want.shape)
    assert_close(got, want.numpy())


def test_from_torch_float32_module(rng):
    m = nn.MultiheadAttention(32, 2, batch_first=True).eval()
    x = torch.from_numpy(rand(rng, 2, 4, 32))
    with torch.no_grad():
        want = m(x, x, x, need_weights=False)[0]
    assert_close(libmha.Layer.from_torch(m)(x.numpy()), want.numpy())


def test_from_torch_errors():
    with pytest.raises(TypeError):
        libmha.Layer.from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError):
        libmha.Layer.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError):
        libmha.Layer.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))


def test_construction_errors(rng):
    w, b = weights(rng, 16, 2, 2, 8, 8)
    with pytest.raises(ValueError, match="heads"):
        libmha.Layer(3, w[0], w[1], w[2])
    with pytest.raises(ValueError):
        libmha.Layer(2, w[0][:, None], w[1], w[2])  # 3-D weight
    with pytest.raises(ValueError):
        libmha.Layer(2, w[0], w[1][:8], w[2], kv_heads=2)  # w_k rows != kv_heads * head_dim
    with pytest.raises(ValueError):
        libmha.Layer(2, w[0], w[1], w[2], kv_heads=2, v_head_dim=6)  # w_v rows != 2 * 6
    with pytest.raises(ValueError):
        libmha.Layer(2, w[0], w[1], w[2], b_q=b[0][:4])
    with pytest.raises(ValueError):
        libmha.Layer(2, w[0], w[1], w[2], w_o=w[3][:, :8])
    with pytest.raises(ValueError, match="b_o needs w_o"):
        libmha.Layer(2, w[0], w[1], w[2], b_o=b[3])
    with pytest.raises(TypeError):
        libmha.Layer(2, w[0].astype(np.complex64), w[1], w[2])
    with pytest.raises(libmha.ShapeError):  # 2 query heads over 3 kv heads: the library's check
        libmha.Layer(2, w[0], np.vstack([w[1], w[1][:8]]), np.vstack([w[2], w[2][:8]]))


def test_call_errors(rng):
    w, b = weights(rng, 16, 2, 2, 8, 8, k_in=12, v_in=12)
    layer = make_layer(w, b, 2)
    x, y = rand(rng, 2, 3, 16), rand(rng, 2, 5, 12)
    with pytest.raises(ValueError):
        layer(x)  # key defaults to query, but k_in is 12
    with pytest.raises(ValueError):
        layer(x[0], y, y)  # 2-D query
    with pytest.raises(ValueError):
        layer(x, y[:1], y[:1])  # batch 1 against 2
    with pytest.raises(ValueError):
        layer(x, y, y[:, :4])  # value shorter than key
    with pytest.raises(ValueError):
        layer(x, y[..., :8], y)  # key width
    with pytest.raises(ValueError):
        layer(x, y, y, key_lens=[1, 2, 3])
    with pytest.raises(libmha.MaskError) as info:
        layer(x, y, y, key_lens=[6, 1])
    assert info.value.func == "mha_layer_forward"
