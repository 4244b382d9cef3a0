"""libmha from Python: the CPU multi-head-attention kernels of libmha over numpy arrays.

    attention(q, k, v, ...)        fused scale-mask-softmax-matmul (mha_attention)
    Layer(...), Layer.from_torch   a whole layer with packed weights (mha_layer_*)
    KVCache(...)                   a KV cache for decoding (mha_kv_append, mha_attention_cached),
                                   f32, f16, bf16 or q8_0, contiguous or paged;
                                   KVCache.wrap over the caller's arrays or tensors
    q8_0_values(a)                 the float32 values a q8_0 byte array holds
    isa_available(), isa_active()  the kernels this CPU runs
    set_num_threads, get_num_threads  the threads of the library's parallel loops
    libmha.torch                   scaled_dot_product_attention over torch tensors (a
                                   torch.library custom op); libmha.hf: transformers

Every call releases the GIL while the library computes. A status other than
MHA_OK raises a libmha.Error subclass whose message is mha_status_str's.
"""
import ctypes as _C
import os as _os

from ._capi import (DTYPES, ISAS, ArgumentError, Error, MaskError, NoMemoryError, ShapeError,
                    UnsupportedError, lib)
from ._core import BFLOAT16, KVCache, Layer, attention, q8_0_values

__version__ = lib.mha_version().decode()


def isa_available():
    """The ISAs this build has and this CPU runs, e.g. ['scalar', 'avx2', 'avx512']."""
    return [name for name, code in ISAS.items() if lib.mha_isa_available(code)]


def isa_active():
    """The ISA that calls use now (the best available, or MHA_ISA's choice)."""
    code = lib.mha_isa_active()
    return next(name for name, c in ISAS.items() if c == code)


__all__ = ["ArgumentError", "BFLOAT16", "DTYPES", "Error", "KVCache", "Layer", "MaskError",
           "NoMemoryError", "ShapeError", "UnsupportedError", "attention", "isa_active",
           "isa_available", "q8_0_values", "get_num_threads", "set_num_threads"]


def _omp():
    """The OpenMP runtime the library loaded (RTLD_NOLOAD finds only one already in
    the process), or None: a build without OpenMP."""
    for name in ("libgomp.so.1", "libomp.so", "libomp.dylib"):
        try:
            return _C.CDLL(name, mode=_os.RTLD_NOLOAD)
        except OSError:
            continue
    return None


def set_num_threads(n):
    """The number of threads of libmha's parallel loops (OpenMP's omp_set_num_threads
    for the library's OpenMP runtime; a caller's thread pool set with
    mha_set_parallel_for is not affected)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"threads must be >= 1, not {n}")
    omp = _omp()
    if omp is None:
        raise RuntimeError("this libmha was built without OpenMP: it runs on one thread")
    omp.omp_set_num_threads(n)


def get_num_threads():
    """The number of threads libmha's next parallel loop will use."""
    omp = _omp()
    return 1 if omp is None else omp.omp_get_max_threads()
