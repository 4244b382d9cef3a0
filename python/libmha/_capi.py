"""ctypes bindings of include/mha.h, status codes as exceptions, and the ISA lock.

The package drives the library through ctypes rather than a C extension: no
Python headers or ABI to build against, and ctypes.CDLL drops the GIL for the
whole duration of every foreign call. libmha.so sits beside this file (or where
the environment variable LIBMHA_LIBRARY says).
"""
import contextlib
import ctypes as C
import os
import threading

F32P, I32P = C.POINTER(C.c_float), C.POINTER(C.c_int32)

LAYOUTS = {"bhsd": 0, "bshd": 1}


class Mask(C.Structure):
    _fields_ = [("key_lens", I32P), ("query_key_lens", I32P), ("bias", F32P),
                ("bias_stride_b", C.c_int64), ("bias_stride_h", C.c_int64),
                ("bias_stride_q", C.c_int64), ("causal", C.c_int32), ("window", C.c_int32),
                ("softcap", C.c_float), ("alibi_slopes", F32P), ("sinks", F32P),
                ("key_starts", I32P), ("q_offsets", I32P)]


class AttnDims(C.Structure):
    _fields_ = [(n, C.c_int32) for n in ("batch", "heads", "kv_heads", "seq_q", "seq_kv",
                                         "head_dim", "v_head_dim")] + [("dtype", C.c_int)]


class KvCache(C.Structure):
    _fields_ = [("k", C.c_void_p), ("v", C.c_void_p), ("batch", C.c_int32),
                ("kv_heads", C.c_int32), ("head_dim", C.c_int32), ("capacity", C.c_int32),
                ("stride_b", C.c_int64), ("stride_h", C.c_int64), ("stride_s", C.c_int64),
                ("v_head_dim", C.c_int32), ("v_stride_b", C.c_int64), ("v_stride_h", C.c_int64),
                ("v_stride_s", C.c_int64), ("dtype", C.c_int), ("io_dtype", C.c_int),
                ("block_table", I32P), ("block_size", C.c_int32), ("max_blocks", C.c_int32),
                ("num_blocks", C.c_int32)]


class Strides(C.Structure):
    _fields_ = [("b", C.c_int64), ("h", C.c_int64), ("s", C.c_int64)]


class LayerDesc(C.Structure):
    _fields_ = [(n, C.c_int32) for n in ("heads", "kv_heads", "head_dim", "q_in", "k_in", "v_in",
                                         "out_dim")] + \
               [(n, F32P) for n in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o")] + \
               [("v_head_dim", C.c_int32)]


_I32, _P = C.c_int32, C.c_void_p
# name: (restype, argtypes); bound on first use, so that a library without one of
# them still serves the others (and the call that needs it raises AttributeError).
_SIGNATURES = {
    "mha_status_str": (C.c_char_p, [C.c_int]),
    "mha_version": (C.c_char_p, []),
    "mha_isa_active": (C.c_int, []),
    "mha_isa_available": (C.c_int, [C.c_int]),
    "mha_isa_force": (C.c_int, [C.c_int]),
    "mha_isa_name": (C.c_char_p, [C.c_int]),
    "mha_isa_count": (C.c_int, []),
    "mha_attention": (C.c_int, [C.POINTER(AttnDims), F32P, F32P, F32P, C.c_float,
                                C.POINTER(Mask), F32P, C.c_int]),
    "mha_kv_append": (C.c_int, [C.POINTER(KvCache), I32P, _P, _P, _I32]),
    "mha_dtype_name": (C.c_char_p, [C.c_int]),
    "mha_attention_strided": (C.c_int, [C.POINTER(AttnDims), _P, C.POINTER(Strides), _P,
                                        C.POINTER(Strides), _P, C.POINTER(Strides), C.c_float,
                                        C.POINTER(Mask), _P, C.POINTER(Strides), F32P]),
    "mha_attention_cached_strided": (C.c_int, [C.POINTER(KvCache), I32P, _P, C.POINTER(Strides),
                                               _I32, _I32, C.c_float, C.POINTER(Mask), _P,
                                               C.POINTER(Strides), F32P]),
    "mha_attention_cached": (C.c_int, [C.POINTER(KvCache), I32P, F32P, _I32, _I32, C.c_float,
                                       C.POINTER(Mask), F32P, C.c_int, F32P]),
    "mha_layer_create": (C.c_int, [C.POINTER(LayerDesc), C.POINTER(_P)]),
    "mha_layer_destroy": (None, [_P]),
    "mha_layer_forward": (C.c_int, [_P, F32P, F32P, F32P, _I32, _I32, _I32, C.POINTER(Mask),
                                    F32P, _P, C.c_size_t]),
    "mha_layer_step": (C.c_int, [_P, F32P, _I32, C.POINTER(KvCache), I32P, C.POINTER(Mask),
                                 F32P, _P, C.c_size_t]),
}


class _Lib:
    def __init__(self, path):
        self._dll = C.CDLL(path)

    def __getattr__(self, name):
        fn = getattr(self._dll, name)
        fn.restype, fn.argtypes = _SIGNATURES[name]
        setattr(self, name, fn)
        return fn


# LIBMHA_LIBRARY names another build of the library to run the package on.
lib = _Lib(os.environ.get("LIBMHA_LIBRARY")
           or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmha.so"))

# name -> mha_isa value, from the library's own list.
ISAS = {lib.mha_isa_name(i).decode(): i for i in range(lib.mha_isa_count())}


def _dtype_names():
    names, i = {}, 0
    while (n := lib.mha_dtype_name(i).decode()) != "unknown":
        names[n] = i
        i += 1
    return names


# name -> mha_dtype value ("f32", "f16", "bf16", "q8_0"), from the library.
DTYPES = _dtype_names()


class Error(Exception):
    """A status other than MHA_OK; .status is the mha_status value, str() is
    mha_status_str's text with the function that returned it."""

    def __init__(self, status, func):
        self.status = status
        self.func = func
        super().__init__(f"{func}: {lib.mha_status_str(status).decode()}")


class ArgumentError(Error, ValueError):
    """MHA_ERR_ARG"""


class ShapeError(Error, ValueError):
    """MHA_ERR_SHAPE"""


class MaskError(Error, ValueError):
    """MHA_ERR_MASK"""


class UnsupportedError(Error):
    """MHA_ERR_UNSUPPORTED: an ISA this build or CPU does not have"""


class NoMemoryError(Error, MemoryError):
    """MHA_ERR_NOMEM"""


_ERRORS = {1: ArgumentError, 2: ShapeError, 3: MaskError, 4: UnsupportedError, 5: NoMemoryError}


def check(status, func):
    if status != 0:
        raise _ERRORS.get(status, Error)(status, func)


class _SharedExclusive:
    """Any number of shared holders, or one exclusive holder."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


_isa_lock = _SharedExclusive()


def isa_code(name):
    if name not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, not {name!r}")
    return ISAS[name]


@contextlib.contextmanager
def on_isa(isa):
    """Runs the body on ISA isa (a name), or on the process's ISA when None.

    The C API has only the process-wide mha_isa_force, so isa= forces, runs and
    restores while holding the lock exclusively: libmha calls made through this
    package from other threads wait meanwhile, but C code calling the library
    directly in the same process would run on the forced ISA for that time."""
    if isa is None:
        with _isa_lock.shared():
            yield
        return
    code = isa_code(isa)
    with _isa_lock.exclusive():
        before = lib.mha_isa_active()
        check(lib.mha_isa_force(code), "mha_isa_force")
        try:
            yield
        finally:
            lib.mha_isa_force(before)
