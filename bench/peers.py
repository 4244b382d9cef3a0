#!/usr/bin/python3
"""Peers of libmha on the shapes of mha-bench, timed in one process, printed as JSON.

  layer      torch.nn.MultiheadAttention (eval, batch_first, need_weights=False,
             under torch.inference_mode: the native fast path); ONNX Runtime
             graph MatMul x3 -> com.microsoft MultiHeadAttention -> MatMul + Add
  attention  PyTorch matmul-softmax-matmul on [B, H, S, dh] (the scores are
             materialized; grouped-query K/V are repeated per query head, as
             models written in PyTorch do); ONNX Runtime com.microsoft
             MultiHeadAttention on already projected [B, S, H*dh] inputs

torch.nn.MultiheadAttention and ONNX Runtime's MultiHeadAttention need as many
K/V heads as query heads: the GQA shapes have no such peer. The QKV projection's
peer (OpenBLAS) is in the C++ harness.

Usage: peers.py --shapes shapes.json [--threads 2] [--min-time 0.3] [--out peers.json]
shapes.json is what `mha-bench --shapes-json` prints. Each result is the mean
wall time per call over at least --min-time seconds (one untimed warm-up call
first, unless it takes over --cold-limit seconds); report.py turns times into GFLOP/s with the FLOP formulas of main.cc.
Peers of one shape run one after the other, shape after shape. Progress goes to
stderr; a peer that is missing or fails is recorded as skipped with the reason.
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
    the measurement, since calls that long (PyTorch on long sequences allocates
    its score matrix anew on every call) gain nothing from a second one."""
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


def score_bytes(s):
    """Bytes of the B x H x S x S float score matrix that PyTorch materializes."""
    return 4 * s["batch"] * s["heads"] * s["seq"] * s["seq"]


class TorchPeers:
    def __init__(self, threads):
        import torch

        self.torch = torch
        torch.set_num_threads(threads)
        self.version = torch.__version__

    def layer(self, s):
        torch = self.torch
        if s["kv_heads"] != s["heads"]:
            return None, "nn.MultiheadAttention has no grouped-query attention"
        e = s["heads"] * s["head_dim"]
        mha = torch.nn.MultiheadAttention(e, s["heads"], batch_first=True).eval()
        x = torch.rand(s["batch"], s["seq"], e) * 2 - 1

        def call():
            with torch.inference_mode():
                mha(x, x, x, need_weights=False)

        return call, None

    def attention(self, s):
        torch = self.torch
        b, h, hkv, n, dh = s["batch"], s["heads"], s["kv_heads"], s["seq"], s["head_dim"]
        q = torch.rand(b, h, n, dh) * 2 - 1
        k = torch.rand(b, hkv, n, dh) * 2 - 1
        v = torch.rand(b, hkv, n, dh) * 2 - 1
        scale = 1.0 / math.sqrt(dh)
        mask = torch.ones(n, n, dtype=torch.bool).triu(1) if s["causal"] else None

        def call():
            with torch.inference_mode():
                kk, vv = k, v
                if hkv != h:
                    kk = k.repeat_interleave(h // hkv, dim=1)
                    vv = v.repeat_interleave(h // hkv, dim=1)
                scores = (q @ kk.transpose(-2, -1)) * scale
                if mask is not None:
                    scores.masked_fill_(mask, float("-inf"))
                torch.softmax(scores, dim=-1) @ vv

        return call, None


class OrtPeers:
    def __init__(self, threads):
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        self.onnx, self.ort, self.helper, self.nh = onnx, ort, helper, numpy_helper
        self.TensorProto = TensorProto
        self.threads = threads
        self.version = ort.__version__

    def _session(self, graph):
        helper = self.helper
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        )
        model.ir_version = 8
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return self.ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )

    def _mha_node(self, inputs, output, s):
        attrs = {"num_heads": s["heads"]}
        if s["causal"]:
            attrs["unidirectional"] = 1
        return self.helper.make_node(
            "MultiHeadAttention", inputs, [output], domain="com.microsoft", **attrs
        )

    def attention(self, s):
        if s["kv_heads"] != s["heads"]:
            return None, "MultiHeadAttention has no grouped-query attention"
        helper, F = self.helper, self.TensorProto.FLOAT
        b, n, e = s["batch"], s["seq"], s["heads"] * s["head_dim"]
        io = [helper.make_tensor_value_info(name, F, [b, n, e]) for name in ("q", "k", "v", "o")]
        graph = helper.make_graph([self._mha_node(["q", "k", "v"], "o", s)], "attn", io[:3], io[3:])
        sess = self._session(graph)
        rng = np.random.default_rng(0)
        feeds = {name: rng.uniform(-1, 1, (b, n, e)).astype(np.float32) for name in ("q", "k", "v")}
        return (lambda: sess.run(None, feeds)), None

    def layer(self, s):
        if s["kv_heads"] != s["heads"]:
            return None, "MultiHeadAttention has no grouped-query attention"
        helper, nh, F = self.helper, self.nh, self.TensorProto.FLOAT
        b, n, e = s["batch"], s["seq"], s["heads"] * s["head_dim"]
        rng = np.random.default_rng(0)
        bound = 1.0 / math.sqrt(e)

        def weight(name, shape):
            return nh.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name)

        inits = [weight(f"w{p}", [e, e]) for p in "qkvo"]  # W^T: [in][out]
        inits += [weight("b_qkv", [3 * e]), weight("b_o", [e])]
        nodes = [helper.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"]
        nodes.append(self._mha_node(["q", "k", "v", "b_qkv"], "attn", s))
        nodes.append(helper.make_node("MatMul", ["attn", "wo"], ["proj"]))
        nodes.append(helper.make_node("Add", ["proj", "b_o"], ["y"]))
        graph = helper.make_graph(
            nodes,
            "layer",
            [helper.make_tensor_value_info("x", F, [b, n, e])],
            [helper.make_tensor_value_info("y", F, [b, n, e])],
            initializer=inits,
        )
        sess = self._session(graph)
        feeds = {"x": rng.uniform(-1, 1, (b, n, e)).astype(np.float32)}
        return (lambda: sess.run(None, feeds)), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument(
        "--max-score-gib",
        type=float,
        default=4.0,
        help="skip PyTorch where its B*H*S*S score matrix exceeds this many GiB",
    )
    ap.add_argument(
        "--cold-limit",
        type=float,
        default=2.0,
        help="a first call longer than this many seconds is the measurement",
    )
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    with open(args.shapes) as f:
        shapes = json.load(f)

    peers, context = {}, {"threads": args.threads, "python": platform.python_version()}
    for name, cls in (("torch", TorchPeers), ("onnxruntime", OrtPeers)):
        try:
            peers[name] = cls(args.threads)
            context[name] = peers[name].version
        except ImportError as exc:
            log(f"peers: {name} not available: {exc}")
            context[name] = f"not available: {exc}"

    # (family, impl, library, method); impl names the column of the report.
    plan = [
        ("attention", "torch_unfused", "torch", "attention"),
        ("attention", "ort_mha", "onnxruntime", "attention"),
        ("layer", "torch_mha", "torch", "layer"),
        ("layer", "ort_layer", "onnxruntime", "layer"),
    ]
    results = []
    for s in shapes:
        for family, impl, lib, method in plan:
            if family not in s["families"]:
                continue
            rec = {"family": family, "shape": s["name"], "impl": impl}
            if lib not in peers:
                rec["skipped"] = f"{lib} not available"
            elif lib == "torch" and score_bytes(s) > args.max_score_gib * 2**30:
                rec["skipped"] = f"score matrix {score_bytes(s) / 2**30:.1f} GiB > --max-score-gib"
            else:
                try:
                    call, why = getattr(peers[lib], method)(s)
                    if call is None:
                        rec["skipped"] = why
                    else:
                        rec["seconds"], rec["calls"] = time_calls(call, args.min_time, args.cold_limit)
                except Exception as exc:  # a peer's failure must not stop the run
                    rec["skipped"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            if "seconds" in rec:
                log(f"peers: {family}/{s['name']}/{impl}: {rec['seconds'] * 1e3:.2f} ms x {rec['calls']}")
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
