#!/usr/bin/python3
"""One peer framework of libmha on the shapes of mha-bench, timed, printed as JSON.

One framework per process (--peer), so that one runtime's thread pool never
spins on the cores another is timed on; tools/bench.sh runs each in turn.

  onnxruntime  attention: the standard Attention op (opset 23) on [B, H, S, dh]
               (grouped-query via fewer K/V heads, is_causal) and
               com.microsoft MultiHeadAttention on [B, S, H*dh] (no GQA;
               unidirectional when causal); the faster of the two is the result
               ("variant" names it, "variants" keeps both times).
               layer: MatMul + Add (fused QKV weight) -> Split -> either
               attention op on [B, S, heads*dh] -> MatMul + Add; the faster again.
  torch        attention: torch.nn.functional.scaled_dot_product_attention on
               [B, H, S, dh] (enable_gqa for grouped-query, is_causal).
               layer: torch.nn.MultiheadAttention (eval, batch_first,
               need_weights=False, under torch.inference_mode: the native fast
               path); it has no grouped-query attention.
  openvino     attention: the ScaledDotProductAttention op (opset 13); for
               grouped-query, Q is viewed as [B, Hkv, H/Hkv, S, dh] and K, V as
               [B, Hkv, 1, S, dh], which the op broadcasts.
               layer: MatMul + Add (fused QKV) -> heads split -> SDPA -> heads
               merged -> MatMul + Add. Compiled for CPU in f32
               (INFERENCE_PRECISION_HINT; its default on AVX-512 is bf16) on
               --threads threads.

Cached and modified attention (families decode, prefill, modifier: the last
seq_q rows of seq positions, causal):
  onnxruntime  com.microsoft GroupQueryAttention, its LLM path: q, k, v of the
               seq_q new rows [B, seq_q, heads*dh]; past_key and past_value
               [B, Hkv, seq, dh] bound (IOBinding) to the same buffers as
               present_key and present_value, which makes the CPU kernel share
               them (past_present_share_buffer: the new rows are written in
               place, the cache is not copied); seqlens_k = seq - 1,
               total_sequence_length = seq. Window: local_window_size =
               window (both count the current key); softcap: softcap;
               sinks: head_sink; ALiBi: a dense attention_bias [1, H, S, S]
               (the op has no slopes).
  torch        scaled_dot_product_attention with enable_gqa: decode with no
               mask (the one row sees every key; is_causal would align to the
               top-left), the chunk with causal_lower_right, the window as a
               boolean mask [S, S], ALiBi as an additive mask [1, H, S, S]
               with -inf above the diagonal; it has no softcap or sinks.
  openvino     not run on these.
  ggml         decode: ggml_flash_attn_ext (llama.cpp's CPU kernel, ggml-python from
               PyPI, built from source) on a cache of the case's type (f32, f16,
               q8_0 written by ggml_quantize_chunk); it converts q to the cache's
               type itself.

Errors: where a builder can, it runs its call once more and records "error",
max |out - ref| / max |ref| against attention64, float64 attention of the inputs
as the peer holds them (rounded to its 16-bit or q8_0 type), so that a figure
names what the peer's arithmetic costs in accuracy: the attention family, and
the cached families without a modifier (ONNX Runtime over the cache as its call
left it; ggml over its q, K and V as it stores them).

The QKV projection's peer (OpenBLAS) is in the C++ harness.

Usage: peers.py --peer NAME --shapes shapes.json [--threads 2] [--min-time 0.3]
                [--out peers.json] [--unavailable REASON]
shapes.json is what `mha-bench --shapes-json` prints. Each result is the mean
wall time per call over at least --min-time seconds (one untimed warm-up call
first, unless it takes over --cold-limit seconds); report.py turns times into
GFLOP/s with the FLOP formulas of main.cc. Progress goes to stderr; a shape the
peer cannot run, or a peer that is missing (--unavailable: bench.sh could not
install it, and says why) or fails, is recorded as skipped with the reason.
"""
import argparse
import json
import math
import platform
import sys
import time

import numpy as np


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def time_calls(fn, min_time, cold_limit):
    """Mean seconds per call and the number of timed calls. The first call warms
    up (thread pools, first touch); when it takes over cold_limit seconds it is
    the measurement, since calls that long gain nothing from a second one."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > cold_limit:
        return first, 1
    n, total = 0, 0.0
    while total < min_time or n == 0:
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
        n += 1
    return total / n, n


def attention64(q, k, v, causal):
    """Attention in float64, the reference of the peers' errors: q [B, H, Sq, dh],
    k and v [B, Hkv, Skv, dh] (any float type), heads in groups of H/Hkv on a kv
    head; causal rows see the keys up to their own position, counted from the end
    (row i of Sq sees keys j <= i + Skv - Sq)."""
    b, h, sq, dh = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    out = np.empty((b, h, sq, v.shape[3]))
    hidden = np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)
    for i in range(b):
        for g in range(hkv):
            kg, vg = np.asarray(k[i, g], np.float64), np.asarray(v[i, g], np.float64)
            for hh in range(g * (h // hkv), (g + 1) * (h // hkv)):
                sc = np.asarray(q[i, hh], np.float64) @ kg.T / math.sqrt(dh)
                if causal:
                    sc[hidden] = -np.inf
                p = np.exp(sc - sc.max(axis=1, keepdims=True))
                out[i, hh] = (p @ vg) / p.sum(axis=1, keepdims=True)
    return out


def rel_error(out, ref):
    """max |out - ref| / max |ref|: a peer's error on the scale of the output."""
    return float(np.max(np.abs(np.asarray(out, np.float64) - ref)) / np.max(np.abs(ref)))


def dims(s):
    """b, h, hkv, n, dh, e = h*dh, ekv = hkv*dh."""
    b, h, hkv, n, dh = s["batch"], s["heads"], s["kv_heads"], s["seq"], s["head_dim"]
    return b, h, hkv, n, dh, h * dh, hkv * dh


def lines(x):
    """x copied to an array that starts on a 64-byte cache line, as mha-bench allocates
    libmha's buffers and engines their tensors (NumPy starts large arrays 16 bytes off a
    line, where row loads straddle two lines)."""
    buf = np.empty(x.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    y = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


class Inputs:
    """Uniform [-1, 1) activations and nn.Linear-initialized weights, fixed seed, each
    array on a cache line."""

    def __init__(self, s):
        self.rng = np.random.default_rng(0)
        self.s = s

    def uniform(self, shape, bound=1.0):
        return lines(self.rng.uniform(-bound, bound, shape).astype(np.float32))

    def qkv(self):
        """q [B][H][S][dh], k and v [B][Hkv][S][dh]."""
        b, h, hkv, n, dh, _, _ = dims(self.s)
        return self.uniform((b, h, n, dh)), self.uniform((b, hkv, n, dh)), self.uniform((b, hkv, n, dh))

    def layer(self):
        """x [B][S][e]; W_qkv [(H + 2 Hkv) dh][e] and W_o [e][e] in nn.Linear's
        [out][in] layout, with their biases."""
        b, _, _, n, _, e, ekv = dims(self.s)
        bound = 1.0 / math.sqrt(e)
        return (self.uniform((b, n, e)), self.uniform((e + 2 * ekv, e), bound),
                self.uniform((e + 2 * ekv,), bound), self.uniform((e, e), bound),
                self.uniform((e,), bound))


def typed(s, key="dtype"):
    """The shape's element type: "f32", "f16", "bf16" or "q8_0" (caches)."""
    return s.get(key, "f32")


def case_dims(s):
    """b, h, hkv, seq_q, seq (the positions, and the cache rows), dh."""
    return s["batch"], s["heads"], s["kv_heads"], s["seq_q"], s["seq"], s["head_dim"]


def alibi_bias(s, causal_inf):
    """ALiBi as a dense [1, H, S, S] bias: slopes 2^(-8(h+1)/H) times (j - i), as
    bench/main.cc; -inf above the diagonal when causal_inf."""
    h, n = s["heads"], s["seq"]
    slopes = 2.0 ** (-8.0 * np.arange(1, h + 1, dtype=np.float32) / h)
    dist = (np.arange(n, dtype=np.float32)[None, :] - np.arange(n, dtype=np.float32)[:, None])
    bias = slopes[:, None, None] * dist[None]
    if causal_inf:
        bias[:, dist > 0] = -np.inf
    return bias[None].astype(np.float32)


class Ort:
    OPS = ("Attention", "MultiHeadAttention")  # timed each, the faster kept
    VARIANTS = {"attention": OPS, "layer": OPS}  # families whose ops are timed each

    def __init__(self, threads):
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        self.ort, self.helper, self.nh = ort, helper, numpy_helper
        self.F, self.I32, self.F16 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.FLOAT16
        self.threads = threads
        self.version = ort.__version__

    def _session(self, nodes, inputs, outputs, inits=()):
        helper = self.helper
        graph = helper.make_graph(nodes, "peer", inputs, outputs, initializer=list(inits))
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)],
        )
        model.ir_version = 10
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return self.ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )

    def _tensor(self, name, shape, f16=False):
        return self.helper.make_tensor_value_info(name, self.F16 if f16 else self.F, list(shape))

    def _node(self, op, inputs, output, s, layout_3d):
        """The attention node of variant op; layout_3d: inputs [B, S, heads*dh]."""
        if op == "Attention":
            attrs = {"is_causal": int(s["causal"])}
            if layout_3d:
                attrs.update(q_num_heads=s["heads"], kv_num_heads=s["kv_heads"])
            return self.helper.make_node("Attention", inputs, [output], **attrs)
        attrs = {"num_heads": s["heads"]}
        if s["causal"]:
            attrs["unidirectional"] = 1
        return self.helper.make_node(
            "MultiHeadAttention", inputs, [output], domain="com.microsoft", **attrs
        )

    def _no_gqa(self, op, s):
        if op == "MultiHeadAttention" and s["kv_heads"] != s["heads"]:
            return "com.microsoft MultiHeadAttention has no grouped-query attention"
        return None

    def attention(self, s, op):
        if why := self._no_gqa(op, s):
            return why
        if typed(s) == "bf16":
            return "ONNX Runtime's CPU attention ops have no bfloat16 kernels"
        f16 = typed(s) == "f16"
        b, h, _, n, dh, e, _ = dims(s)
        qkv = [lines(x.astype(np.float16)) if f16 else x for x in Inputs(s).qkv()]
        q, k, v = qkv
        if op == "MultiHeadAttention":  # [B, S, H*dh]
            q, k, v = (lines(x.transpose(0, 2, 1, 3).reshape(b, n, -1)) for x in (q, k, v))
        feeds = dict(zip("qkv", (q, k, v)))
        out_shape = (b, n, e) if op == "MultiHeadAttention" else (b, h, n, dh)
        sess = self._session(
            [self._node(op, ["q", "k", "v"], "o", s, op == "MultiHeadAttention")],
            [self._tensor(name, x.shape, f16) for name, x in feeds.items()],
            [self._tensor("o", out_shape, f16)],
        )
        o = sess.run(None, feeds)[0]
        o = o.reshape(b, n, h, dh).transpose(0, 2, 1, 3) if op == "MultiHeadAttention" else o
        self.error = rel_error(o, attention64(*qkv, s["causal"]))
        return lambda: sess.run(None, feeds)

    def layer(self, s, op):
        if why := self._no_gqa(op, s):
            return why
        helper, nh = self.helper, self.nh
        b, _, _, n, _, e, ekv = dims(s)
        x, w_qkv, b_qkv, w_o, b_o = Inputs(s).layer()
        # MatMul takes W^T [in][out].
        inits = [nh.from_array(w_qkv.T.copy(), "w_qkv"), nh.from_array(b_qkv, "b_qkv"),
                 nh.from_array(w_o.T.copy(), "w_o"), nh.from_array(b_o, "b_o"),
                 nh.from_array(np.array([e, ekv, ekv], np.int64), "split")]
        nodes = [
            helper.make_node("MatMul", ["x", "w_qkv"], ["xw"]),
            helper.make_node("Add", ["xw", "b_qkv"], ["qkv"]),
            helper.make_node("Split", ["qkv", "split"], ["q", "k", "v"], axis=2),
            self._node(op, ["q", "k", "v"], "attn", s, True),
            helper.make_node("MatMul", ["attn", "w_o"], ["proj"]),
            helper.make_node("Add", ["proj", "b_o"], ["y"]),
        ]
        sess = self._session(nodes, [self._tensor("x", (b, n, e))], [self._tensor("y", (b, n, e))], inits)
        feeds = {"x": x}
        return lambda: sess.run(None, feeds)

    def _gqa(self, s):
        """GroupQueryAttention on the last seq_q of seq positions, over a shared
        past/present buffer of seq rows, with the case's modifier."""
        ort, helper = self.ort, self.helper
        b, h, hkv, sq, n, dh = case_dims(s)
        kv = typed(s, "kv_type")
        if kv not in ("f32", "f16") or s.get("block_size", 0):
            return ("GroupQueryAttention has no " + kv + " cache" if kv not in ("f32", "f16")
                    else "GroupQueryAttention has no block tables")
        f16 = kv == "f16"  # the op takes q, k, v and the cache in one type

        def cast(x):
            return lines(x.astype(np.float16 if f16 else np.float32))

        inputs = Inputs(s)
        feeds = {"q": cast(inputs.uniform((b, sq, h * dh))), "k": cast(inputs.uniform((b, sq, hkv * dh))),
                 "v": cast(inputs.uniform((b, sq, hkv * dh))),
                 "seqlens_k": np.full(b, n - 1, np.int32), "total": np.array(n, np.int32)}
        attrs = {"num_heads": h, "kv_num_heads": hkv}
        extra = {}
        if s["modifier"] == "window":
            attrs["local_window_size"] = int(s["value"])
        elif s["modifier"] == "softcap":
            attrs["softcap"] = float(s["value"])
        elif s["modifier"] == "alibi":
            extra["bias"] = cast(alibi_bias(s, False))
        elif s["modifier"] == "sinks":
            extra["sinks"] = cast(np.ones(h, np.float32))
        feeds.update(extra)
        names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total", "", "", "",
                 "bias" if "bias" in extra else "", "sinks" if "sinks" in extra else ""]
        while not names[-1]:
            names.pop()
        cache = (b, hkv, n, dh)
        ins = [self._tensor(x, feeds[x].shape, f16) for x in ("q", "k", "v")]
        ins += [self._tensor("past_k", cache, f16), self._tensor("past_v", cache, f16),
                helper.make_tensor_value_info("seqlens_k", self.I32, [b]),
                helper.make_tensor_value_info("total", self.I32, [])]
        ins += [self._tensor(x, y.shape, f16) for x, y in extra.items()]
        node = helper.make_node("GroupQueryAttention", names, ["o", "present_k", "present_v"],
                                domain="com.microsoft", **attrs)
        sess = self._session([node], ins, [self._tensor("o", (b, sq, h * dh), f16),
                                           self._tensor("present_k", cache, f16),
                                           self._tensor("present_v", cache, f16)])
        io = sess.io_binding()
        for name, x in feeds.items():
            io.bind_cpu_input(name, x)
        bufs = [ort.OrtValue.ortvalue_from_numpy(cast(inputs.uniform(cache))) for _ in range(2)]
        for buf, past, present in zip(bufs, ("past_k", "past_v"), ("present_k", "present_v")):
            io.bind_ortvalue_input(past, buf)
            io.bind_ortvalue_output(present, buf)
        io.bind_output("o")
        sess.run_with_iobinding(io)
        if [x.data_ptr() for x in io.get_outputs()[:2]] != [x.data_ptr() for x in bufs]:
            return "GroupQueryAttention did not write present_key/value into the past buffers"
        if s["modifier"] == "none":  # the new rows over the cache as the call left it
            o = io.get_outputs()[2].numpy().reshape(b, sq, h, dh).transpose(0, 2, 1, 3)
            q = feeds["q"].reshape(b, sq, h, dh).transpose(0, 2, 1, 3)
            self.error = rel_error(o, attention64(q, bufs[0].numpy(), bufs[1].numpy(), True))
        return lambda: sess.run_with_iobinding(io)

    decode = prefill = modifier = _gqa


class Torch:
    def __init__(self, threads):
        import torch

        self.torch = torch
        torch.set_num_threads(threads)
        self.version = torch.__version__

    def _error(self, call, q, k, v, causal):
        """The error of call's output against attention64 of q, k and v as torch holds them."""
        self.error = rel_error(call().double().numpy(),
                               attention64(*(x.double().numpy() for x in (q, k, v)), causal))

    def _tensor(self, x, t="f32"):
        y = self.torch.from_numpy(x)
        return y.to({"f16": self.torch.float16, "bf16": self.torch.bfloat16}[t]) if t != "f32" else y

    def attention(self, s):
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        q, k, v = (self._tensor(x, typed(s)) for x in Inputs(s).qkv())
        gqa = s["kv_heads"] != s["heads"]

        def call():
            with torch.inference_mode():
                return sdpa(q, k, v, is_causal=s["causal"], enable_gqa=gqa)

        self._error(call, q, k, v, s["causal"])
        return call

    def _cached(self, s):
        """SDPA of the last seq_q of seq positions: q [B, H, seq_q, dh], k and v
        [B, Hkv, seq, dh], with the case's mask."""
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        b, h, hkv, sq, n, dh = case_dims(s)
        kv = typed(s, "kv_type")
        if kv == "q8_0":
            return "scaled_dot_product_attention has no q8_0 cache"
        if s.get("block_size", 0):
            return "scaled_dot_product_attention has no block tables"
        inputs = Inputs(s)
        # SDPA takes q in the cache's type.
        q = self._tensor(inputs.uniform((b, h, sq, dh)), kv)
        k, v = (self._tensor(inputs.uniform((b, hkv, n, dh)), kv) for _ in range(2))
        kwargs = {"enable_gqa": hkv != h}
        mod = s["modifier"]
        if mod in ("softcap", "sinks"):
            return f"scaled_dot_product_attention has no {mod}"
        # Decode (one row, at the last position) takes no mask: it sees every key, and
        # is_causal would align to the top left.
        if 1 < sq < n:
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(sq, n)
        elif mod == "window":
            i = torch.arange(n)[:, None]
            j = torch.arange(n)[None, :]
            kwargs["attn_mask"] = (j <= i) & (j > i - int(s["value"]))
        elif mod == "alibi":
            kwargs["attn_mask"] = self._tensor(alibi_bias(s, True))
        elif sq == n:
            kwargs["is_causal"] = True

        def call():
            with torch.inference_mode():
                return sdpa(q, k, v, **kwargs)

        if mod == "none":
            self._error(call, q, k, v, True)
        return call

    decode = prefill = modifier = _cached

    def layer(self, s):
        torch = self.torch
        if s["kv_heads"] != s["heads"]:
            return "nn.MultiheadAttention has no grouped-query attention"
        _, h, _, _, _, e, _ = dims(s)
        x, w_qkv, b_qkv, w_o, b_o = Inputs(s).layer()
        mha = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
        with torch.no_grad():
            mha.in_proj_weight.copy_(self._tensor(w_qkv))
            mha.in_proj_bias.copy_(self._tensor(b_qkv))
            mha.out_proj.weight.copy_(self._tensor(w_o))
            mha.out_proj.bias.copy_(self._tensor(b_o))
        xt = self._tensor(x)

        def call():
            with torch.inference_mode():
                mha(xt, xt, xt, need_weights=False)

        return call


class OpenVino:
    def __init__(self, threads):
        import openvino as ov
        import openvino.opset13 as ops

        self.ov, self.ops = ov, ops
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}
        self.version = ov.__version__.split("-")[0]

    def _shape(self, node, shape):
        return self.ops.reshape(node, self.ops.constant(np.array(shape, np.int64)), False)

    def _heads(self, x, s, heads):
        """[B, S, heads*dh] -> [B, heads, S, dh]."""
        b, _, _, n, dh, _, _ = dims(s)
        return self.ops.transpose(self._shape(x, [b, n, heads, dh]),
                                  self.ops.constant(np.array([0, 2, 1, 3], np.int64)))

    def _sdpa(self, q, k, v, s):
        """[B, H, S, dh] from q [B, H, S, dh] and k, v [B, Hkv, S, dh]."""
        b, h, hkv, n, dh, _, _ = dims(s)
        if hkv == h:
            return self.ops.scaled_dot_product_attention(q, k, v, causal=s["causal"])
        q = self._shape(q, [b, hkv, h // hkv, n, dh])
        k, v = (self._shape(x, [b, hkv, 1, n, dh]) for x in (k, v))
        o = self.ops.scaled_dot_product_attention(q, k, v, causal=s["causal"])
        return self._shape(o, [b, h, n, dh])

    def _compile(self, outputs, params, feeds, hint="f32"):
        model = self.ov.Model(outputs, params)
        config = dict(self.config, INFERENCE_PRECISION_HINT=hint)
        request = self.core.compile_model(model, "CPU", config).create_infer_request()
        return lambda: next(iter(request.infer(feeds, share_inputs=True).values()))

    def attention(self, s):
        ops = self.ops
        feeds = list(Inputs(s).qkv())
        params = [ops.parameter(x.shape, np.float32, name=name) for name, x in zip("qkv", feeds)]
        # 16-bit shapes: OpenVINO's own 16-bit path is its precision hint (inputs stay f32).
        hint = {"f16": "f16", "bf16": "bf16"}.get(typed(s), "f32")
        call = self._compile([self._sdpa(*params, s)], params, feeds, hint)
        self.error = rel_error(call(), attention64(*feeds, s["causal"]))
        return call

    def layer(self, s):
        ops = self.ops
        b, h, hkv, n, _, e, ekv = dims(s)
        x, w_qkv, b_qkv, w_o, b_o = Inputs(s).layer()
        xp = ops.parameter(x.shape, np.float32, name="x")
        qkv = ops.add(ops.matmul(xp, ops.constant(w_qkv), False, True), ops.constant(b_qkv))
        q, k, v = ops.variadic_split(qkv, ops.constant(np.int64(2)),
                                     ops.constant(np.array([e, ekv, ekv], np.int64))).outputs()
        o = self._sdpa(self._heads(q, s, h), self._heads(k, s, hkv), self._heads(v, s, hkv), s)
        o = self._shape(ops.transpose(o, ops.constant(np.array([0, 2, 1, 3], np.int64))), [b, n, e])
        y = ops.add(ops.matmul(o, ops.constant(w_o), False, True), ops.constant(b_o))
        return self._compile([y], [xp], [x])


class Ggml:
    """ggml's flash_attn_ext (the kernel of llama.cpp's CPU decode) through
    ggml-python: q f32 [dh, seq_q, H, B], K and V of the cache's type [dh, Skv,
    Hkv, B] (f32, f16 or q8_0; no bf16 on the CPU path of this version, no block
    tables), computed on a thread pool made once, the graph planned once."""

    TYPES = {"f32": 0, "f16": 1, "q8_0": 8}

    def __init__(self, threads):
        import ctypes

        import ggml

        self.ggml, self.ct = ggml, ctypes
        self.threads = threads
        self.version = "ggml-python " + __import__("importlib.metadata").metadata.version("ggml-python")

    def decode(self, s):
        g, ct = self.ggml, self.ct
        b, h, hkv, sq, n, dh = case_dims(s)
        kv = typed(s, "kv_type")
        if kv not in self.TYPES or s.get("block_size", 0):
            return f"flash_attn_ext has no {kv} cache" if kv not in self.TYPES else "no block tables"
        t = self.TYPES[kv]
        nbytes = 2 * g.ggml_row_size(t, dh) * n * hkv * b + 4 * dh * h * b * 2 + (64 << 20)
        ctx = g.ggml_init(g.ggml_init_params(mem_size=nbytes, mem_buffer=None, no_alloc=False))
        q = g.ggml_new_tensor_4d(ctx, 0, dh, sq, h, b)
        k = g.ggml_new_tensor_4d(ctx, t, dh, n, hkv, b)
        v = g.ggml_new_tensor_4d(ctx, t, dh, n, hkv, b)
        inputs = Inputs(s)
        np.copyto(np.ctypeslib.as_array(ct.cast(g.ggml_get_data(q), ct.POINTER(ct.c_float)),
                                        (b * h * sq * dh,)), inputs.uniform(b * h * sq * dh))
        for x in (k, v):  # rows of dh values, stored in the cache's type by ggml itself
            src = inputs.uniform(b * hkv * n * dh)
            if t == 0:
                np.copyto(np.ctypeslib.as_array(ct.cast(g.ggml_get_data(x), ct.POINTER(ct.c_float)),
                                                src.shape), src)
            elif t == 1:
                dst = np.ctypeslib.as_array(ct.cast(g.ggml_get_data(x), ct.POINTER(ct.c_uint16)), src.shape)
                np.copyto(dst, src.astype(np.float16).view(np.uint16))
            else:
                g.ggml_quantize_chunk(t, src.ctypes.data_as(ct.POINTER(ct.c_float)), g.ggml_get_data(x),
                                      0, b * hkv * n, dh, None)
        o = g.ggml_flash_attn_ext(ctx, q, k, v, None, 1.0 / math.sqrt(dh), 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(o, g.GGML_PREC_F32)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, o)
        params = g.ggml_threadpool_params_default(self.threads)
        pool = g.ggml_threadpool_new(ct.byref(params))
        plan = g.ggml_graph_plan(gf, self.threads, pool)
        work = (ct.c_uint8 * max(plan.work_size, 1))()
        plan.work_data = ct.cast(work, ct.POINTER(ct.c_uint8))
        keep = (ctx, pool, work, plan)  # alive as long as the call

        def call():
            g.ggml_graph_compute(gf, ct.byref(keep[3]))

        call()  # o is [dh, H, seq_q, B]; q, K and V as ggml holds them
        o = self._values(o, 0, b * sq * h * dh).reshape(b, sq, h, dh).transpose(0, 2, 1, 3)
        q64 = self._values(q, 0, b * h * sq * dh).reshape(b, h, sq, dh)
        k64, v64 = (self._values(x, t, b * hkv * n * dh).reshape(b, hkv, n, dh) for x in (k, v))
        self.error = rel_error(o, attention64(q64, k64, v64, True))
        return call

    def _values(self, x, t, count):
        """The count values of tensor x of type t (f32, f16 or q8_0: blocks of an
        f16 scale and 32 int8) as float64."""
        g, ct = self.ggml, self.ct
        if t == 0:
            return np.ctypeslib.as_array(ct.cast(g.ggml_get_data(x), ct.POINTER(ct.c_float)),
                                         (count,)).astype(np.float64)
        if t == 1:
            raw = np.ctypeslib.as_array(ct.cast(g.ggml_get_data(x), ct.POINTER(ct.c_uint16)), (count,))
            return raw.view(np.float16).astype(np.float64)
        raw = np.ctypeslib.as_array(ct.cast(g.ggml_get_data(x), ct.POINTER(ct.c_uint8)),
                                    (count // 32 * 34,)).reshape(-1, 34)
        scale = raw[:, :2].copy().view(np.float16).astype(np.float64)
        return (scale * raw[:, 2:].view(np.int8)).reshape(-1)


# peer -> (class, {family: impl}); impl names the report's column.
CACHED = ("decode", "prefill", "modifier")
PEERS = {
    "onnxruntime": (Ort, {"attention": "ort", "layer": "ort", **dict.fromkeys(CACHED, "ort_gqa")}),
    "torch": (Torch, {"attention": "torch_sdpa", "layer": "torch_mha",
                      **dict.fromkeys(CACHED, "torch_sdpa")}),
    "openvino": (OpenVino, {"attention": "openvino", "layer": "openvino"}),
    "ggml": (Ggml, {"decode": "ggml"}),
}


def run(build, args):
    """(seconds per call, calls) of the call that build() returns, or the reason
    (a string) why it cannot run: build's own, or the exception it or the call
    raised (a peer's failure must not stop the run)."""
    try:
        call = build()
        return call if isinstance(call, str) else time_calls(call, args.min_time, args.cold_limit)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def measure(peer, family, s, args):
    """The record's timing fields, or {"skipped": reason}, with the error of the
    output against float64 (attention64) where the builder measured it (dense
    attention, and cached attention without a modifier). ONNX Runtime times each
    of its attention ops and keeps the faster (dense families)."""

    def timed(build):
        peer.error = None
        t = run(build, args)
        return t if isinstance(t, str) else (t[0], t[1], peer.error)

    def fields(t):
        rec = {"seconds": t[0], "calls": t[1]}
        return rec if t[2] is None else {**rec, "error": t[2]}

    ops = getattr(peer, "VARIANTS", {}).get(family)
    if not ops:
        t = timed(lambda: getattr(peer, family)(s))
        return {"skipped": t} if isinstance(t, str) else fields(t)
    times = {op: timed(lambda op=op: getattr(peer, family)(s, op)) for op in ops}
    ran = {op: t for op, t in times.items() if not isinstance(t, str)}
    if not ran:
        return {"skipped": "; ".join(f"{op}: {why}" for op, why in times.items())}
    best = min(ran, key=lambda op: ran[op][0])
    return {**fields(ran[best]), "variant": best,
            "variants": {op: t[0] if op in ran else t for op, t in times.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, choices=sorted(PEERS))
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument(
        "--cold-limit",
        type=float,
        default=2.0,
        help="a first call longer than this many seconds is the measurement",
    )
    ap.add_argument("--unavailable", metavar="REASON",
                    help="the peer is not installed: skip every shape with this reason")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    with open(args.shapes) as f:
        shapes = json.load(f)

    cls, impls = PEERS[args.peer]
    context = {"threads": args.threads, "python": platform.python_version()}
    peer, missing = None, args.unavailable
    if missing is None:
        try:
            peer = cls(args.threads)
            context[args.peer] = peer.version
        except ImportError as exc:
            missing = f"import failed: {exc}"
    if missing is not None:
        log(f"peers: {args.peer} not available: {missing}")
        context[args.peer] = f"not available: {missing}"

    results = []
    for s in shapes:
        for family, impl in impls.items():
            if family not in s["families"]:
                continue
            rec = {"family": family, "shape": s["name"], "impl": impl}
            if peer is None:
                rec["skipped"] = f"{args.peer} not available: {missing}"
            else:
                rec.update(measure(peer, family, s, args))
            if "seconds" in rec:
                variant = f" ({rec['variant']})" if "variant" in rec else ""
                error = f", error {rec['error']:.1e}" if "error" in rec else ""
                log(f"peers: {family}/{s['name']}/{impl}{variant}: "
                    f"{rec['seconds'] * 1e3:.2f} ms x {rec['calls']}{error}")
            else:
                log(f"peers: {family}/{s['name']}/{impl}: skipped ({rec['skipped']})")
            results.append(rec)

    doc = json.dumps({"context": context, "results": results}, indent=1)
    if args.out == "-":
        print(doc)
    else:
        with open(args.out, "w") as f:
            f.write(doc + "\n")


if __name__ == "__main__":
    main()
