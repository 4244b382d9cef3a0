"""libmha from Python: the CPU multi-head-attention kernels of libmha over numpy arrays.

    attention(q, k, v, ...)        fused scale-mask-softmax-matmul (mha_attention)
    Layer(...), Layer.from_torch   a whole layer with packed weights (mha_layer_*)
    KVCache(...)                   a KV cache for decoding (mha_kv_append, mha_attention_cached),
                                   f32, f16, bf16 or q8_0, contiguous or paged
    q8_0_values(a)                 the float32 values a q8_0 byte array holds
    isa_available(), isa_active()  the kernels this CPU runs

Every call releases the GIL while the library computes. A status other than
MHA_OK raises a libmha.Error subclass whose message is mha_status_str's.
"""
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
           "isa_available", "q8_0_values"]
