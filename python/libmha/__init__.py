"""libmha from Python: the CPU multi-head-attention kernels of libmha over numpy arrays.

    attention(q, k, v, ...)        fused scale-mask-softmax-matmul (mha_attention)
    Layer(...), Layer.from_torch   a whole layer with packed weights (mha_layer_*)
    KVCache(...)                   a KV cache for decoding (mha_kv_append, mha_attention_cached)
    isa_available(), isa_active()  the kernels this CPU runs

Every call releases the GIL while the library computes. A status other than
MHA_OK raises a libmha.Error subclass whose message is mha_status_str's.
"""
from ._capi import (ISAS, ArgumentError, Error, MaskError, NoMemoryError, ShapeError,
                    UnsupportedError, lib)
from ._core import KVCache, Layer, attention

__version__ = lib.mha_version().decode()


def isa_available():
    """The ISAs this build has and this CPU runs, e.g. ['scalar', 'avx2', 'avx512']."""
    return [name for name, code in ISAS.items() if lib.mha_isa_available(code)]


def isa_active():
    """The ISA that calls use now (the best available, or MHA_ISA's choice)."""
    code = lib.mha_isa_active()
    return next(name for name, c in ISAS.items() if c == code)


__all__ = ["ArgumentError", "Error", "KVCache", "Layer", "MaskError", "NoMemoryError",
           "ShapeError", "UnsupportedError", "attention", "isa_active", "isa_available"]
