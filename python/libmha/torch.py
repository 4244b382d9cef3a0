"""libmha under PyTorch: scaled_dot_product_attention over torch tensors.

    scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 window=None, softcap=None, sinks=None, alibi_slopes=None,
                                 return_lse=False, out=None)

computes what torch.nn.functional.scaled_dot_product_attention computes, on the CPU,
for float32, float16 and bfloat16 tensors of [B, H, S, D] (or [H, S, D]) with any
strides whose last dimension is contiguous: a [B, S, H, D] tensor .transpose(1, 2) is
read in place, never copied. Scores, softmax and P.V are computed in float32 and the
output rounded once to the inputs' type. is_causal is top-left as torch defines it.
A boolean attn_mask (True attends) or a float one (added to the scores) that is one of
the patterns libmha's mask fields describe - key padding at the end or the start of
each sequence, causality at an offset per sequence, a sliding window - is mapped onto
those fields after an exact check (the skipped tiles are then never computed);
any other mask is added as a bias through its broadcast strides. The one difference
from torch: a query row that may see no key gets zeros (torch gives NaN).

Under torch.compile the call is the custom operator torch.ops.libmha.sdpa (where
torch.library has custom_op, torch >= 2.4), with a fake kernel, so that the graph
traces through it; eager calls run the same code without the dispatcher's tens of
microseconds. It is inference only: dropout_p != 0, and inputs that require grad while grad
mode is on, raise.
"""
import ctypes as C
import math
import weakref
from typing import Optional, Tuple

import numpy as np
import torch

from ._capi import DTYPES, F32P, AttnDims, Mask, Strides, check, lib
from ._core import _I32_MAX, _mask, _ptr

_TYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _tensor(t, name):
    """t checked (a CPU tensor of a type libmha takes, 4-D) and with a contiguous last
    dimension (a copy only when it was not)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"{name} must be on the CPU, not {t.device}")
    if t.dtype not in _TYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, not {t.dtype}")
    shape, stride = t.shape, t.stride()
    if len(shape) != 4:
        raise ValueError(f"{name} must be 4-D [B, H, S, D] (or 3-D [H, S, D]), "
                         f"got shape {tuple(shape)}")
    if max(shape) > _I32_MAX:
        raise ValueError(f"{name}: every dimension must fit in int32, got {tuple(shape)}")
    if (stride[3] != 1 and shape[3] > 1) or min(stride) < 0:
        t = t.contiguous()
    return t


def _strides(t):
    """Element strides (b, h, s) of a 4-D tensor, 0 on dimensions of size 1."""
    (b, h, s, _), (sb, sh, ss, _) = t.shape, t.stride()
    return Strides(0 if b == 1 else sb, 0 if h == 1 else sh, 0 if s == 1 else ss)


def _per_head(x, name, H):
    """A [H] float32 numpy copy of a per-head tensor or array (None stays None)."""
    if x is None:
        return None
    a = x.detach().to(torch.float32).numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.shape != (H,):
        raise ValueError(f"{name} must have shape [H] = ({H},), not {a.shape}")
    return a


def _intervals(vis):
    """For a boolean [B, L, S] mask: (lo, hi, any) per row when every row's visible
    keys are one interval [lo, hi), else None."""
    S = vis.shape[-1]
    seen = vis.any(-1)
    lo = np.where(seen, vis.argmax(-1), 0)
    hi = np.where(seen, S - vis[..., ::-1].argmax(-1), 0)
    if not np.array_equal(vis.sum(-1), hi - lo):
        return None
    return lo, hi, seen


def mask_fields(vis):
    """libmha's mask fields for a boolean [B, L, S] mask (True attends) when they
    describe it exactly, else None: {"key_lens", "key_starts", "causal", "q_offsets",
    "window"} (None or 0 where a field is not needed)."""
    B, L, S = vis.shape
    found = _intervals(vis)
    if found is None:
        return None
    lo, hi, seen = found
    i = np.arange(L)
    lens = np.where(seen.any(-1), np.where(seen, hi, 0).max(-1), 0)
    starts = np.where(seen.any(-1), np.where(seen, lo, S).min(-1), 0)
    cut = seen & (hi < lens[:, None])  # rows that causality stops short of the length
    causal = bool(cut.any())
    offsets = np.full(B, S - L, np.int64)  # bottom-right, the default
    if causal:
        for b in range(B):
            if cut[b].any():
                offsets[b] = (hi[b] - 1 - i)[cut[b]][0]
            else:  # every row reaches the length: rows sit at or past it
                offsets[b] = max(int(lens[b]) - 1, 0)
    narrowed = seen & (lo > starts[:, None])  # rows that a window starts after key_starts
    window = 0
    if narrowed.any():
        b = int(np.argmax(narrowed.any(-1)))
        r = int(np.argmax(narrowed[b]))
        window = int(offsets[b] + r - lo[b, r] + 1)
        if window < 1:
            return None
    # The mask these fields describe, against the given one.
    p = offsets[:, None, None] + i[None, :, None]
    j = np.arange(S)[None, None, :]
    want = (j >= starts[:, None, None]) & (j < lens[:, None, None])
    if causal:
        want = want & (j <= p)
    if window:
        want = want & (j > p - window)
    if not np.array_equal(np.broadcast_to(want, vis.shape), vis):
        return None
    if (offsets < -2**31).any() or (offsets > _I32_MAX).any():
        return None
    return {"key_lens": None if (lens == S).all() else lens,
            "key_starts": None if (starts == 0).all() else starts,
            "causal": causal,
            "q_offsets": offsets if causal or window else None,
            "window": window}


class _MaskCache:
    """The fields (or bias) last found for a mask tensor: a model hands every layer the
    same mask, so its check runs once per forward, not once per layer. The entry holds a
    weak reference to the tensor itself (an address could be reused by a new mask)
    and its version counter (bumped by every in-place change); a bias that views the
    mask keeps it alive until the next mask replaces the entry."""

    def __init__(self):
        self.entry = None

    def get(self, m, shape, compute):
        entry = self.entry
        if entry is not None:
            ref, version, key, value = entry
            if ref() is m and version == m._version and key == shape:
                return value
        value = compute()
        self.entry = (weakref.ref(m), m._version, shape, value)
        return value


_mask_cache = _MaskCache()


def _mask_from(attn_mask, B, H, L, S):
    """(fields, None) with the mask fields attn_mask maps to, or (None, bias): a float32
    bias of it (a numpy view, copied only when its type needs) for bias_view to
    broadcast."""
    a = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))

    def compute():  # on the mask as given, before broadcasting: its own size
        vis = a
        fields = None
        if a.dtype == torch.bool or bool(((a == 0) | (a == -math.inf)).all()):
            vis = a if a.dtype == torch.bool else a == 0
            if a.shape[1] == 1 or bool((vis == vis[:, :1]).all()):  # the same for every head
                fields = mask_fields(np.asarray(vis[:, 0].expand(B, L, S)))
        if fields is not None:
            return fields, None
        if a.dtype == torch.bool:
            return None, torch.zeros(a.shape).masked_fill_(~a, -math.inf).numpy()
        return None, a.to(torch.float32).numpy()

    # every layer of a model hands over the same mask: its fields or bias are found once
    return _mask_cache.get(attn_mask, (B, H, L, S), compute)


_NO_MASK = Mask()  # every field off: the C library only reads it


def _run(query, key, value, attn_mask, is_causal, scale, window, softcap, sinks, alibi_slopes,
         out, lse):
    B, H, L, E = query.shape
    Hkv, S, Ev = key.shape[1], key.shape[2], value.shape[3]
    kw = {}
    bias = None
    if is_causal:
        kw.update(causal=True, q_offsets=np.zeros(B, np.int64))  # top-left, as torch
    elif attn_mask is not None:
        fields, bias = _mask_from(attn_mask, B, H, L, S)
        if fields is not None:
            w = fields["window"]
            kw.update({k: v for k, v in fields.items() if v is not None and k != "window"})
            window = min(w, window) if w and window else w or window
    if kw or bias is not None or window or softcap or sinks is not None or \
            alibi_slopes is not None:
        mask, keep = _mask(B, H, L, S, bias=bias, window=window, softcap=softcap, sinks=sinks,
                           alibi_slopes=alibi_slopes, **kw)
    else:
        mask, keep = _NO_MASK, None
    dims = AttnDims(B, H, Hkv, L, S, E, Ev, DTYPES[_TYPES[query.dtype]])
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    check(lib.mha_attention_strided(C.byref(dims), query.data_ptr(), C.byref(_strides(query)),
                                    key.data_ptr(), C.byref(_strides(key)), value.data_ptr(),
                                    C.byref(_strides(value)), scale, C.byref(mask),
                                    out.data_ptr(), C.byref(_strides(out)),
                                    None if lse is None else C.cast(lse.data_ptr(), F32P)),
          "mha_attention_strided")
    del keep


def _checked(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, out, extra):
    if dropout_p:
        raise ValueError("libmha is inference only: dropout_p must be 0")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (query, key, value, attn_mask) + extra):
        raise RuntimeError("libmha is inference only: inputs require grad (run under "
                           "torch.no_grad() or torch.inference_mode(), or detach them)")
    q, k, v = (_tensor(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"query, key and value must have one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    B, H, L, E = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"key {tuple(k.shape)} and value {tuple(v.shape)} do not match query "
                         f"{tuple(q.shape)} as [B, Hkv, S, D]")
    if k.shape[3] != E:
        raise ValueError(f"key's last dimension ({k.shape[3]}) must be query's ({E})")
    if k.shape[1] != H and not (enable_gqa and H % k.shape[1] == 0):
        raise ValueError(f"query has {H} heads and key {k.shape[1]}: pass enable_gqa=True "
                         "with heads a multiple of key's")
    if is_causal and attn_mask is not None:
        raise ValueError("pass attn_mask or is_causal, not both (as torch)")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.device.type != "cpu":
            raise TypeError("attn_mask must be a CPU torch.Tensor")
        if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
            raise TypeError(f"attn_mask must be bool or floating point, not {attn_mask.dtype}")
        shape = (B, H, L, k.shape[2])
        try:
            if attn_mask.dim() > 4 or torch.broadcast_shapes(attn_mask.shape, shape) != shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                             f"to [B, H, L, S] = {shape}") from None
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != q.dtype or \
                tuple(out.shape) != (B, H, L, v.shape[3]):
            raise ValueError(f"out must be a {q.dtype} tensor of shape {(B, H, L, v.shape[3])}")
        if (out.stride(-1) != 1 and out.shape[-1] > 1) or any(st < 0 for st in out.stride()):
            raise ValueError("out's last dimension must be contiguous, its strides >= 0")
    return q, k, v


def _impl(query, key, value, attn_mask, is_causal, scale, window, softcap, sinks, alibi_slopes,
          out, want_lse=True):
    """out (or a new [B, H, L, Ev] tensor) and lse [B, H, L] (None unless want_lse)."""
    B, H, L, _ = query.shape
    if out is None:
        out = torch.empty((B, H, L, value.shape[3]), dtype=query.dtype)
    lse = torch.empty((B, H, L), dtype=torch.float32) if want_lse else None
    _run(query, key, value, attn_mask, is_causal, scale, window, softcap,
         _per_head(sinks, "sinks", H), _per_head(alibi_slopes, "alibi_slopes", H), out, lse)
    return out, lse


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("libmha::sdpa", mutates_args=())
    def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                 window: int, softcap: float, sinks: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return _impl(query, key, value, attn_mask, is_causal, scale, window, softcap, sinks,
                     alibi_slopes, None)

    @_sdpa_op.register_fake
    def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, window, softcap, sinks,
                   alibi_slopes):
        B, H, L, _ = query.shape
        return (query.new_empty((B, H, L, value.shape[3])),
                query.new_empty((B, H, L), dtype=torch.float32))
else:
    _sdpa_op = None


def _tracing():
    """True while torch.compile (dynamo) traces: calls go through the custom op, which
    costs tens of microseconds in eager mode and computes the same."""
    compiler = getattr(torch, "compiler", None)
    return _sdpa_op is not None and compiler is not None and compiler.is_compiling()


def _as_tensor(x):
    if x is None or isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(np.asarray(x, dtype=np.float32))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, window=None,
                                 softcap=None, sinks=None, alibi_slopes=None, return_lse=False,
                                 out=None):
    """torch.nn.functional.scaled_dot_product_attention on libmha (see the module's
    docstring), plus libmha's score modifiers: window (keys at or before p(i) - window
    masked), softcap (s -> softcap tanh(s / softcap)), sinks [H] (a virtual key per head
    in the softmax denominator) and alibi_slopes [H] (slopes[h] * (j - p(i)) added),
    with p(i) the row's position (i + S - L, or i when is_causal). Returns the output
    [B, H, L, Ev] in the inputs' type, written into out= when given, or (output, lse
    [B, H, L] float32) when return_lse is true: the log of each row's softmax
    denominator, -inf for a row that sees no key, for merging results over key shards."""
    squeeze = query.dim() == 3 if isinstance(query, torch.Tensor) else False
    if squeeze:
        query, key, value = query[None], key[None], value[None]
        out = None if out is None else out[None]
    sinks, alibi_slopes = _as_tensor(sinks), _as_tensor(alibi_slopes)
    q, k, v = _checked(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, out,
                       (sinks, alibi_slopes))
    window = 0 if window is None else int(window)
    softcap = 0.0 if softcap is None else float(softcap)
    if sinks is not None:
        sinks = sinks.detach()
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.detach()
    args = (q, k, v, attn_mask, bool(is_causal), None if scale is None else float(scale), window,
            softcap, sinks, alibi_slopes)
    if out is None and _tracing():
        res, lse = _sdpa_op(*args)
    else:
        res, lse = _impl(*args, out, return_lse)
    if squeeze:
        res, lse = res[0], None if lse is None else lse[0]
    return (res, lse) if return_lse else res
