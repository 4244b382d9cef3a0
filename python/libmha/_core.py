"""attention, KVCache and Layer over numpy arrays.

Inputs that are float32, float16 or bfloat16 (ml_dtypes) ndarrays whose last axis
is contiguous are passed to the library as they are, through their strides (a
[B, S, H, d] array viewed as [B, H, S, d] is not copied); other real-valued arrays
(float64, lists) are converted to a C-contiguous float32 copy. Shapes are checked
here, since the library only sees pointers and the sizes it is given. Outputs
(out=) are never converted.
"""
import ctypes as C
import math
import mmap
import weakref

import numpy as np

from ._capi import (DTYPES, F32P, I32P, LAYOUTS, AttnDims, KvCache, LayerDesc, Mask, Strides,
                    check, lib, on_isa)

_I32_MAX = 2**31 - 1

try:  # bfloat16 arrays come from ml_dtypes, when it is installed
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

# numpy dtypes of activations -> mha_dtype names
_NP_TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
if BFLOAT16 is not None:
    _NP_TYPES[BFLOAT16] = "bf16"
# mha_dtype names -> the numpy dtype of an array holding them (q8_0: raw bytes)
_TYPE_NP = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BFLOAT16,
            "q8_0": np.dtype(np.uint8)}


def _type_name(t, what):
    if t not in DTYPES:
        raise ValueError(f"{what} must be one of {', '.join(DTYPES)}, not {t!r}")
    if _TYPE_NP[t] is None:
        raise ImportError(f"{what} {t!r} needs the ml_dtypes package (pip install ml_dtypes)")
    return t


def as_typed(x, name):
    """(array, type name): x itself when it is a float32, float16 or bfloat16 ndarray whose
    last axis is contiguous and whose other strides are whole non-negative elements;
    a C-contiguous copy of a 16-bit array in its type otherwise; any other real array
    as a C-contiguous float32 copy."""
    if isinstance(x, np.ndarray) and x.dtype in _NP_TYPES:
        item = x.dtype.itemsize
        ok = x.ndim == 0 or (x.strides[-1] == item or x.shape[-1] == 1)
        ok = ok and all(st >= 0 and st % item == 0 for st in x.strides)
        return (x if ok else np.ascontiguousarray(x)), _NP_TYPES[x.dtype]
    return as_f32(x, name), "f32"


def _strides(a):
    """Element strides (b, h, s) of a 4-D array, 0 on dimensions of size 1."""
    return Strides(*(0 if n == 1 else st // a.dtype.itemsize
                     for n, st in zip(a.shape[:3], a.strides[:3])))


def q8_0_values(a):
    """The values a q8_0 array holds, as float32: a is uint8 [..., n // 32 * 34] (ggml's
    block_q8_0: a binary16 scale d, then 32 int8 values q; value = d * q)."""
    a = np.ascontiguousarray(a, dtype=np.uint8)
    if a.shape[-1] % 34:
        raise ValueError(f"q8_0 rows hold 34-byte blocks; the last dimension is {a.shape[-1]}")
    blocks = a.reshape(a.shape[:-1] + (a.shape[-1] // 34, 34))
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(a.shape[:-1] + (a.shape[-1] // 34 * 32,))


def as_f32(x, name):
    """x itself when it is a C-contiguous float32 ndarray, else a converted copy."""
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous:
        return x
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected an array of real numbers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _as_i32(x, name, shape):
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an array of integers, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, not {a.shape}")
    if a.size and (a.min() < -2**31 or a.max() > _I32_MAX):
        raise ValueError(f"{name}: values must fit in int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _dims(a, name, layout):
    """a's shape, checked to have as many dimensions as layout names."""
    if a.ndim != len(layout):
        raise ValueError(f"{name} must be {len(layout)}-D [{', '.join(layout)}], "
                         f"got shape {a.shape}")
    if any(n > _I32_MAX for n in a.shape):
        raise ValueError(f"{name}: every dimension must fit in int32, got shape {a.shape}")
    return a.shape


def _expect(a, name, shape, layout):
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape [{', '.join(layout)}] = {tuple(shape)}, "
                         f"got {a.shape}")


def _ptr(a, ptype=F32P):
    return None if a is None else a.ctypes.data_as(ptype)


def bias_view(bias, shape):
    """bias broadcast to shape [B, H, Sq, Skv]: (view, stride_b, stride_h, stride_q) with
    strides in floats (0 on broadcast dimensions). No copy when bias is float32 with
    non-negative element-aligned strides and contiguous along keys; else a copy that is."""
    a = bias if isinstance(bias, np.ndarray) and bias.dtype == np.float32 else as_f32(bias, "bias")
    try:
        view = np.broadcast_to(a, shape)
    except ValueError:
        raise ValueError(f"bias of shape {a.shape} does not broadcast to "
                         f"[B, H, Sq, Skv] = {shape}") from None
    strides = [0 if n == 1 else s for n, s in zip(shape, view.strides)]
    if any(s < 0 or s % 4 for s in strides) or (shape[3] > 1 and strides[3] != 4):
        a = np.ascontiguousarray(np.broadcast_to(a, np.broadcast_shapes(a.shape, shape[3:])))
        view = np.broadcast_to(a, shape)
        strides = [0 if n == 1 else s for n, s in zip(shape, view.strides)]
    return view, strides[0] // 4, strides[1] // 4, strides[2] // 4


def _mask(B, H, Sq, Skv, *, key_lens=None, query_key_lens=None, bias=None, causal=False,
          window=None, softcap=None, alibi_slopes=None, sinks=None, key_starts=None,
          q_offsets=None):
    """The mha_mask of these fields (None: off), and the arrays its pointers refer to
    (keep them)."""
    keep = {}
    for name, arr, shape in (("key_lens", key_lens, (B,)), ("query_key_lens", query_key_lens, (B, Sq)),
                             ("key_starts", key_starts, (B,)), ("q_offsets", q_offsets, (B,))):
        if arr is not None:
            keep[name] = _as_i32(arr, name, shape)
    for name, arr in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if arr is not None:
            keep[name] = as_f32(arr, name)
            _expect(keep[name], name, (H,), ["H"])
    strides = (0, 0, 0)
    if bias is not None:
        keep["bias"], *strides = bias_view(bias, (B, H, Sq, Skv))
    window = 0 if window is None else int(window)
    if not -2**31 <= window <= _I32_MAX:
        raise ValueError("window must fit in int32")
    mask = Mask(key_lens=_ptr(keep.get("key_lens"), I32P),
                query_key_lens=_ptr(keep.get("query_key_lens"), I32P),
                bias=_ptr(keep.get("bias")), bias_stride_b=strides[0],
                bias_stride_h=strides[1], bias_stride_q=strides[2], causal=bool(causal),
                window=window, softcap=0.0 if softcap is None else float(softcap),
                alibi_slopes=_ptr(keep.get("alibi_slopes")), sinks=_ptr(keep.get("sinks")),
                key_starts=_ptr(keep.get("key_starts"), I32P),
                q_offsets=_ptr(keep.get("q_offsets"), I32P))
    return mask, keep


_HUGE_PAGE = 2 << 20


def _lines(shape, dtype, zero=False):
    """A new C-contiguous array that starts on a 64-byte cache line (NumPy's start 16
    bytes off one; the kernels' row loads then straddle lines: Zen 5, decode on an f32
    cache in L2 17% slower, f16 in L3 9%). One of 2 MiB or more (a cache, a pool) starts
    on a 2 MiB boundary of its own zeroed mapping, advised onto transparent huge pages
    where Linux offers them: a pool of small blocks read in a shuffled order otherwise
    pays a page walk per block (Xeon, f16 decode B=8, blocks of 16 rows: 0.88x the same
    cache contiguous on 4 KiB pages, 1.0x on huge ones)."""
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize
    if n >= _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        m = mmap.mmap(-1, n + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf = np.frombuffer(m, np.uint8)
        start = -buf.ctypes.data % _HUGE_PAGE
        m.madvise(mmap.MADV_HUGEPAGE, start, n)
        return buf[start:start + n].view(dtype).reshape(shape)
    buf = (np.zeros if zero else np.empty)(n + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start:start + n].view(dtype).reshape(shape)


def _out(out, shape, inputs, dtype=np.dtype(np.float32)):
    """out checked to be a writable C-contiguous array of dtype and shape that overlaps no
    input, or a new array (on a cache line) when None."""
    if out is None:
        return _lines(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, not {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out must be {dtype}, not {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, not {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writable")
    if any(a is not None and np.may_share_memory(out, a) for a in inputs):
        raise ValueError("out must not overlap an input")
    return out


def _layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhsd' or 'bshd', not {layout!r}")
    return LAYOUTS[layout]


def attention(q, k, v, *, scale=None, key_lens=None, query_key_lens=None, bias=None,
              causal=False, window=None, softcap=None, alibi_slopes=None, sinks=None,
              key_starts=None, q_offsets=None, layout="bhsd", out=None, lse=False, isa=None):
    """softmax(scale q k^T + mask) v per batch and head (mha_attention_strided).

    q [B, H, Sq, dh], k [B, Hkv, Skv, dh], v [B, Hkv, Skv, dv] with H % Hkv == 0;
    scale defaults to 1/sqrt(dh). key_lens [B], query_key_lens [B, Sq], bias
    broadcastable to [B, H, Sq, Skv], causal, window, softcap, alibi_slopes [H],
    sinks [H], key_starts [B] (keys before them masked) and q_offsets [B] (row i of
    sequence b at position q_offsets[b] + i; 0 is top-left causal) are mha_mask's
    fields, None leaving each off. Returns out [B, H, Sq, dv] (layout "bhsd") or
    [B, Sq, H, dv] ("bshd"), written into out= when given, or (out, lse [B, H, Sq])
    when lse is true. isa= runs this call on that ISA (see on_isa for what other
    threads see)."""
    (q, tq), (k, tk), (v, tv) = as_typed(q, "q"), as_typed(k, "k"), as_typed(v, "v")
    if not tq == tk == tv:
        raise TypeError(f"q, k and v must have one element type, got {tq}, {tk}, {tv}")
    B, H, Sq, dh = _dims(q, "q", "B H Sq dh".split())
    _, Hkv, Skv, _ = _dims(k, "k", "B Hkv Skv dh".split())
    _expect(k, "k", (B, Hkv, Skv, dh), "B Hkv Skv dh".split())
    dv = _dims(v, "v", "B Hkv Skv dv".split())[3]
    _expect(v, "v", (B, Hkv, Skv, dv), "B Hkv Skv dv".split())
    code = _layout(layout)
    mask, keep = _mask(B, H, Sq, Skv, key_lens=key_lens, query_key_lens=query_key_lens,
                       bias=bias, causal=causal, window=window, softcap=softcap,
                       alibi_slopes=alibi_slopes, sinks=sinks, key_starts=key_starts,
                       q_offsets=q_offsets)
    out = _out(out, (B, H, Sq, dv) if code == 0 else (B, Sq, H, dv), (q, k, v, *keep.values()),
               _TYPE_NP[tq])
    view = out if code == 0 else out.transpose(0, 2, 1, 3)
    dims = AttnDims(B, H, Hkv, Sq, Skv, dh, dv, DTYPES[tq])
    scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
    lse_out = np.empty((B, H, Sq), dtype=np.float32) if lse else None
    with on_isa(isa):
        check(lib.mha_attention_strided(C.byref(dims), q.ctypes.data, C.byref(_strides(q)),
                                        k.ctypes.data, C.byref(_strides(k)), v.ctypes.data,
                                        C.byref(_strides(v)), scale, C.byref(mask),
                                        out.ctypes.data, C.byref(_strides(view)), _ptr(lse_out)),
              "mha_attention_strided")
    return (out, lse_out) if lse else out


def _host_view(x, name):
    """A numpy view of an ndarray or a CPU torch tensor (its memory, not a copy)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        if x.device.type != "cpu":
            raise TypeError(f"{name} must be on the CPU, not {x.device}")
        x = x.detach()
        if x.dtype == torch.bfloat16:
            if BFLOAT16 is None:
                raise TypeError(f"{name}: bfloat16 needs ml_dtypes (pip install ml_dtypes)")
            return x.view(torch.int16).numpy().view(BFLOAT16)
        return x.numpy()
    raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, not {type(x).__name__}")


def _int32_in_place(x, name, ndim):
    """x as a C-contiguous int32 array sharing its memory (the library reads it and
    KVCache.append updates lens)."""
    a = _host_view(x, name)
    if a.dtype != np.int32 or a.ndim != ndim or not a.flags.c_contiguous or not a.flags.writeable:
        raise TypeError(f"{name} must be a writable C-contiguous int32 array of {ndim} axes, "
                        f"not {a.dtype} {a.shape}")
    return a


class KVCache:
    """A KV cache in numpy arrays it owns: k, v and lens (int32 [B], rows filled per
    sequence), in the element type `dtype` ("f32", "f16", "bf16": float32, float16,
    ml_dtypes.bfloat16 arrays; "q8_0": uint8 arrays of ggml's 34-byte blocks, read them
    with q8_0_values), with q, out and the appended rows in `io_dtype` ("f32", "f16",
    "bf16"). layout "bhsd": k [B, Hkv, capacity, dh], v [B, Hkv, capacity, dv]; "bshd":
    k [B, capacity, Hkv, dh] (q8_0: the last dimension counts bytes, d // 32 * 34).
    block_size > 0 makes it paged: k and v are then a pool of num_blocks blocks
    ([num_blocks, Hkv, block_size, d] or [num_blocks, block_size, Hkv, d]), and
    block_table (int32 [B, capacity // block_size], initially block b * n + i for
    sequence b) names the pool block of each sequence's i-th block of rows; any
    reassignment of its entries is taken by the next call."""

    def __init__(self, batch, kv_heads, capacity, head_dim, v_head_dim=0, layout="bhsd",
                 dtype="f32", io_dtype="f32", block_size=0, num_blocks=None):
        sizes = {"batch": batch, "kv_heads": kv_heads, "capacity": capacity,
                 "head_dim": head_dim}
        for name, n in sizes.items():
            if not 0 < int(n) <= _I32_MAX:
                raise ValueError(f"{name} must be in [1, 2**31 - 1], not {n}")
        if not 0 <= int(v_head_dim) <= _I32_MAX:
            raise ValueError(f"v_head_dim must be in [0, 2**31 - 1], not {v_head_dim}")
        self.dtype, self.io_dtype = _type_name(dtype, "dtype"), _type_name(io_dtype, "io_dtype")
        if self.io_dtype == "q8_0":
            raise ValueError("io_dtype must be f32, f16 or bf16 (q8_0 is for caches)")
        self.layout = layout
        self.batch, self.kv_heads, self.capacity = int(batch), int(kv_heads), int(capacity)
        self.head_dim, self.v_head_dim = int(head_dim), int(v_head_dim) or int(head_dim)
        self.block_size = int(block_size)
        per, unit = (32, 34) if self.dtype == "q8_0" else (1, 1)
        for name, d in (("head_dim", self.head_dim), ("v_head_dim", self.v_head_dim)):
            if d % per:
                raise ValueError(f"{name} must be a multiple of 32 for a q8_0 cache, not {d}")
        B, G, S = self.batch, self.kv_heads, self.capacity
        rows, seqs = S, B
        self._table = None
        if self.block_size:
            if self.block_size < 0 or S % self.block_size:
                raise ValueError(f"block_size ({block_size}) must divide capacity ({S})")
            max_blocks = S // self.block_size
            seqs = B * max_blocks if num_blocks is None else int(num_blocks)
            rows = self.block_size
            self._table = np.arange(B * max_blocks, dtype=np.int32).reshape(B, max_blocks) % seqs
        # the axes of sequence (or pool block), kv head and row in each array
        axes = (0, 1, 2) if _layout(layout) == 0 else (0, 2, 1)
        shape = (seqs, G, rows) if axes == (0, 1, 2) else (seqs, rows, G)
        np_type = _TYPE_NP[self.dtype]
        self._k = _lines(shape + (self.head_dim // per * unit,), np_type, zero=True)
        self._v = _lines(shape + (self.v_head_dim // per * unit,), np_type, zero=True)
        self._lens = np.zeros(B, dtype=np.int32)
        self._bind(axes, seqs)

    def _bind(self, axes, pool):
        """The C description of the arrays k, v, lens and block table."""
        unit = 34 if self.dtype == "q8_0" else 1  # strides count 34-byte blocks for q8_0
        ub = self._k.dtype.itemsize * unit
        ks = [self._k.strides[a] // ub for a in axes]
        vs = [self._v.strides[a] // ub for a in axes]
        self._c = KvCache(self._k.ctypes.data, self._v.ctypes.data, self.batch, self.kv_heads,
                          self.head_dim, self.capacity, *ks, self.v_head_dim, *vs,
                          DTYPES[self.dtype], DTYPES[self.io_dtype])
        if self._table is not None:
            self._c.block_table = _ptr(self._table, I32P)
            self._c.block_size = self.block_size
            self._c.max_blocks = self.capacity // self.block_size
            self._c.num_blocks = pool

    @classmethod
    def wrap(cls, k, v, lens=None, *, layout="bhsd", dtype=None, io_dtype="f32",
             block_table=None):
        """A KVCache over the caller's arrays (numpy, or CPU torch tensors such as a
        transformers StaticCache's), read and written in place, in any strides whose
        last axis is contiguous: k [B, Hkv, capacity, dh] and v [B, Hkv, capacity, dv]
        for layout "bhsd", [B, capacity, Hkv, d] for "bshd". With block_table (int32
        [B, max_blocks]) k and v are pools of blocks, [num_blocks, Hkv, block_size, d]
        (or [num_blocks, block_size, Hkv, d]), and capacity = max_blocks * block_size.
        dtype follows the arrays (float32, float16, bfloat16); pass "q8_0" for uint8
        arrays of ggml's blocks (the last axis counts bytes). lens (int32 [B], the rows
        filled) and block_table are used in place when they are int32 arrays; lens
        defaults to zeros."""
        self = cls.__new__(cls)
        k, v = _host_view(k, "k"), _host_view(v, "v")
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"k and v must be 4-D, not {k.ndim}-D and {v.ndim}-D")
        if dtype is None:
            if k.dtype not in _NP_TYPES:
                raise TypeError(f"k is {k.dtype}: pass dtype='q8_0' for q8_0 bytes, or use "
                                "float32, float16 or bfloat16 arrays")
            dtype = _NP_TYPES[k.dtype]
        self.dtype, self.io_dtype = _type_name(dtype, "dtype"), _type_name(io_dtype, "io_dtype")
        if self.io_dtype == "q8_0":
            raise ValueError("io_dtype must be f32, f16 or bf16 (q8_0 is for caches)")
        want = _TYPE_NP[self.dtype]
        for name, a in (("k", k), ("v", v)):
            if a.dtype != want:
                raise TypeError(f"{name} must be {want} for a {self.dtype} cache, not {a.dtype}")
            if a.strides[-1] != a.itemsize and a.shape[-1] > 1:
                raise ValueError(f"{name}'s last axis must be contiguous")
            unit = a.itemsize * (34 if self.dtype == "q8_0" else 1)
            if any(st < 0 or st % unit for st in a.strides[:3]):
                raise ValueError(f"{name}'s strides must be non-negative whole "
                                 f"{'34-byte blocks' if unit > a.itemsize else 'elements'}")
        self.layout = layout
        axes = (0, 1, 2) if _layout(layout) == 0 else (0, 2, 1)
        pool, G, rows = (k.shape[a] for a in axes)
        if tuple(v.shape[a] for a in axes) != (pool, G, rows):
            raise ValueError(f"k {k.shape} and v {v.shape} differ outside their last axis")
        per, unit = (32, 34) if self.dtype == "q8_0" else (1, 1)
        if k.shape[3] % unit or v.shape[3] % unit:
            raise ValueError("q8_0 rows must be whole 34-byte blocks")
        self.head_dim, self.v_head_dim = k.shape[3] // unit * per, v.shape[3] // unit * per
        self.kv_heads, self.block_size, self._table = G, 0, None
        if block_table is not None:
            self._table = _int32_in_place(block_table, "block_table", 2)
            self.batch, max_blocks = self._table.shape
            self.block_size, self.capacity = rows, max_blocks * rows
        else:
            self.batch, self.capacity = pool, rows
        for name, n in (("batch", self.batch), ("kv_heads", G), ("capacity", self.capacity),
                        ("head_dim", self.head_dim), ("v_head_dim", self.v_head_dim)):
            if not 0 < n <= _I32_MAX:
                raise ValueError(f"{name} must be in [1, 2**31 - 1], not {n}")
        if lens is None:
            lens = np.zeros(self.batch, dtype=np.int32)
        self._lens = _int32_in_place(lens, "lens", 1)
        if self._lens.shape != (self.batch,):
            raise ValueError(f"lens must have shape ({self.batch},), not {self._lens.shape}")
        self._k, self._v = k, v
        self._bind(axes, pool)
        return self

    # The arrays the library reads and writes in place: their contents may be changed
    # (lens[:] = 0 empties the cache), the arrays themselves not replaced.
    @property
    def k(self):
        return self._k

    @property
    def v(self):
        return self._v

    @property
    def lens(self):
        return self._lens

    @property
    def block_table(self):
        return self._table

    def _io(self, x, name):
        """x as an array of the io type, C-contiguous."""
        a, t = as_typed(x, name)
        if t != self.io_dtype:
            if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or self.io_dtype != "f32":
                raise TypeError(f"{name} must be {self.io_dtype} (the cache's io_dtype), not {t}")
        return np.ascontiguousarray(a, dtype=_TYPE_NP[self.io_dtype])

    def append(self, k_new, v_new):
        """Writes k_new [B, Hkv, n, dh] and v_new [B, Hkv, n, dv] (io_dtype) converted to
        the cache's type at rows lens[b].. lens[b] + n - 1 and adds n to lens
        (mha_kv_append)."""
        k_new, v_new = self._io(k_new, "k_new"), self._io(v_new, "v_new")
        n = _dims(k_new, "k_new", "B Hkv n dh".split())[2]
        _expect(k_new, "k_new", (self.batch, self.kv_heads, n, self.head_dim),
                "B Hkv n dh".split())
        _expect(v_new, "v_new", (self.batch, self.kv_heads, n, self.v_head_dim),
                "B Hkv n dv".split())
        with on_isa(None):
            check(lib.mha_kv_append(C.byref(self._c), _ptr(self.lens, I32P), k_new.ctypes.data,
                                    v_new.ctypes.data, n), "mha_kv_append")
        self._lens += n

    def attention(self, q, *, scale=None, query_key_lens=None, bias=None, causal=False,
                  window=None, softcap=None, alibi_slopes=None, sinks=None, key_starts=None,
                  q_offsets=None, layout="bhsd", out=None, lse=False, isa=None):
        """Attention of q [B, H, Sq, dh] (io_dtype) against rows j < lens[b]
        (mha_attention_cached_strided): row i sits at position lens[b] - Sq + i (or
        q_offsets[b] + i). bias broadcasts to [B, H, Sq, capacity]. Returns out as attention() does, in io_dtype,
        or (out, lse [B, H, Sq]) when lse is true: the log of each row's softmax
        denominator, -inf for a row that sees no key."""
        q, tq = as_typed(q, "q")
        if tq != self.io_dtype:
            q = self._io(q, "q")
        B, H, Sq, _ = _dims(q, "q", "B H Sq dh".split())
        _expect(q, "q", (self.batch, H, Sq, self.head_dim), "B H Sq dh".split())
        code = _layout(layout)
        mask, keep = _mask(B, H, Sq, self.capacity, query_key_lens=query_key_lens, bias=bias,
                           causal=causal, window=window, softcap=softcap,
                           alibi_slopes=alibi_slopes, sinks=sinks, key_starts=key_starts,
                           q_offsets=q_offsets)
        dv = self.v_head_dim
        out = _out(out, (B, H, Sq, dv) if code == 0 else (B, Sq, H, dv),
                   (q, self.k, self.v, *keep.values()), _TYPE_NP[self.io_dtype])
        view = out if code == 0 else out.transpose(0, 2, 1, 3)
        lse_out = np.empty((B, H, Sq), dtype=np.float32) if lse else None
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        with on_isa(isa):
            check(lib.mha_attention_cached_strided(
                C.byref(self._c), _ptr(self.lens, I32P), q.ctypes.data, C.byref(_strides(q)), H,
                Sq, scale, C.byref(mask), out.ctypes.data, C.byref(_strides(view)),
                _ptr(lse_out)), "mha_attention_cached_strided")
        return (out, lse_out) if lse else out


class Layer:
    """A multi-head attention layer (mha_layer) with packed copies of nn.Linear-layout
    weights: w_q [H*dh, q_in], w_k [Hkv*dh, k_in], w_v [Hkv*dv, v_in], optional biases
    b_q, b_k, b_v, and the output projection w_o [out_dim, H*dv], b_o (none when w_o is
    None). head_dim defaults to w_q's rows / heads, kv_heads to w_k's rows / head_dim,
    v_head_dim to w_v's rows / kv_heads. Inputs are [B, S, E] when batch_first, else
    [S, B, E], like nn.MultiheadAttention."""

    def __init__(self, heads, w_q, w_k, w_v, *, kv_heads=None, head_dim=None, v_head_dim=None,
                 b_q=None, b_k=None, b_v=None, w_o=None, b_o=None, batch_first=True):
        w = {n: as_f32(a, n) for n, a in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v))}
        for n, a in w.items():
            _dims(a, n, ["out", "in"])
        H = int(heads)
        if H <= 0 or w["w_q"].shape[0] % H:
            raise ValueError(f"heads ({heads}) must be positive and divide w_q's "
                             f"{w['w_q'].shape[0]} rows")
        dh = int(head_dim) if head_dim is not None else w["w_q"].shape[0] // H
        Hkv = int(kv_heads) if kv_heads is not None else w["w_k"].shape[0] // dh if dh > 0 else 0
        dv = int(v_head_dim) if v_head_dim is not None else w["w_v"].shape[0] // Hkv if Hkv > 0 else 0
        if min(dh, Hkv, dv) <= 0:
            raise ValueError(f"head_dim ({dh}), kv_heads ({Hkv}) and v_head_dim ({dv}) must be "
                             "positive")
        _expect(w["w_q"], "w_q", (H * dh, w["w_q"].shape[1]), ["heads*head_dim", "q_in"])
        _expect(w["w_k"], "w_k", (Hkv * dh, w["w_k"].shape[1]), ["kv_heads*head_dim", "k_in"])
        _expect(w["w_v"], "w_v", (Hkv * dv, w["w_v"].shape[1]), ["kv_heads*v_head_dim", "v_in"])
        b = {}
        for n, a, rows in (("b_q", b_q, H * dh), ("b_k", b_k, Hkv * dh), ("b_v", b_v, Hkv * dv)):
            if a is not None:
                b[n] = as_f32(a, n)
                _expect(b[n], n, (rows,), [str(rows)])
        out_dim = 0
        if w_o is not None:
            w["w_o"] = as_f32(w_o, "w_o")
            out_dim = _dims(w["w_o"], "w_o", ["out_dim", "heads*v_head_dim"])[0]
            _expect(w["w_o"], "w_o", (out_dim, H * dv), ["out_dim", "heads*v_head_dim"])
            if b_o is not None:
                b["b_o"] = as_f32(b_o, "b_o")
                _expect(b["b_o"], "b_o", (out_dim,), ["out_dim"])
        elif b_o is not None:
            raise ValueError("b_o needs w_o")
        self.heads, self.kv_heads, self.head_dim, self.v_head_dim = H, Hkv, dh, dv
        self.q_in, self.k_in, self.v_in = (w[n].shape[1] for n in ("w_q", "w_k", "w_v"))
        self.out_dim = out_dim or H * dv
        self.batch_first = bool(batch_first)
        desc = LayerDesc(heads=H, kv_heads=Hkv, head_dim=dh, q_in=self.q_in, k_in=self.k_in,
                         v_in=self.v_in, out_dim=out_dim, v_head_dim=dv,
                         **{n: _ptr(a) for n, a in {**w, **b}.items()})
        handle = C.c_void_p()
        with on_isa(None):
            check(lib.mha_layer_create(C.byref(desc), C.byref(handle)), "mha_layer_create")
        self._handle = handle
        weakref.finalize(self, lib.mha_layer_destroy, handle)

    @classmethod
    def from_torch(cls, module):
        """A Layer computing what torch.nn.MultiheadAttention `module` computes in eval
        mode (kdim/vdim, with or without bias, batch_first either way)."""
        import torch  # optional: only this constructor needs it

        if not isinstance(module, torch.nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, not {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")

        def arr(t):
            return None if t is None else t.detach().cpu().to(torch.float32).numpy()

        E = module.embed_dim
        if module._qkv_same_embed_dim:
            w_q, w_k, w_v = module.in_proj_weight.split(E)
        else:
            w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        b_q = b_k = b_v = None
        if module.in_proj_bias is not None:
            b_q, b_k, b_v = (arr(t) for t in module.in_proj_bias.split(E))
        return cls(module.num_heads, arr(w_q), arr(w_k), arr(w_v), b_q=b_q, b_k=b_k, b_v=b_v,
                   w_o=arr(module.out_proj.weight), b_o=arr(module.out_proj.bias),
                   batch_first=module.batch_first)

    def _input(self, x, name, width):
        """x as a C-contiguous float32 [B, S, width] array."""
        x = as_f32(x, name)
        _dims(x, name, ["B", "S", name + "_dim"] if self.batch_first else ["S", "B", name + "_dim"])
        if not self.batch_first:
            x = np.ascontiguousarray(x.transpose(1, 0, 2))
        if x.shape[2] != width:
            raise ValueError(f"{name}'s last dimension must be {width}, got shape {x.shape}")
        return x

    def _result(self, out):
        return out if self.batch_first else out.transpose(1, 0, 2)

    def __call__(self, query, key=None, value=None, key_lens=None, causal=False, bias=None,
                 isa=None):
        """The layer's output for query [B, Sq, q_in] against key [B, Skv, k_in] and value
        [B, Skv, v_in] (key defaults to query, value to key; [S, B, E] when not
        batch_first): [B, Sq, out_dim] (or [Sq, B, out_dim]). key_lens [B] masks padding
        keys; bias broadcasts to [B, H, Sq, Skv]."""
        xq = self._input(query, "query", self.q_in)
        xk = xq if key is None or key is query else self._input(key, "key", self.k_in)
        xv = xk if value is None or value is key else self._input(value, "value", self.v_in)
        if (xk is xq and self.k_in != self.q_in) or (xv is xk and self.v_in != self.k_in):
            raise ValueError("key and value default to query only when the widths agree")
        B, Sq = xq.shape[:2]
        Skv = xk.shape[1]
        if xk.shape[0] != B or xv.shape[:2] != (B, Skv):
            raise ValueError(f"batch and key lengths disagree: query {xq.shape}, key {xk.shape}, "
                             f"value {xv.shape} (as [B, S, E])")
        mask, keep = _mask(B, self.heads, Sq, Skv, key_lens=key_lens, bias=bias, causal=causal)
        out = _lines((B, Sq, self.out_dim), np.float32)
        with on_isa(isa):
            check(lib.mha_layer_forward(self._handle, _ptr(xq), _ptr(xk), _ptr(xv), B, Sq, Skv,
                                        C.byref(mask), _ptr(out), None, 0), "mha_layer_forward")
        return self._result(out)

    def step(self, x, cache, causal=True, isa=None):
        """One decoder step (mha_layer_step): x [B, S, E] ([S, B, E] when not batch_first)
        is projected, its K and V rows appended to cache at rows cache.lens[b].., and its
        queries attend to the cache; cache.lens grows by S. Returns [B, S, out_dim]."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a libmha.KVCache, not {type(cache).__name__}")
        x = self._input(x, "x", self.q_in)
        B, S = x.shape[:2]
        if B != cache.batch:
            raise ValueError(f"x has batch {B}, the cache {cache.batch}")
        mask = Mask(causal=bool(causal))
        out = _lines((B, S, self.out_dim), np.float32)
        with on_isa(isa):
            check(lib.mha_layer_step(self._handle, _ptr(x), S, C.byref(cache._c),
                                     _ptr(cache.lens, I32P), C.byref(mask), _ptr(out), None, 0),
                  "mha_layer_step")
        return self._result(out)
