"""python -m libmha validate [--report | --shape B,Sq,Skv,H,Hkv,dh,E]
       python -m libmha bench [--shape B,Sq,Skv,H,Hkv,dh,E ...] [--runs N]

validate runs the mha-validate installed in this package (default --report): the
same report as the C tool, from its float64 reference, rather than a second
implementation of it that could drift. bench times attention() and a Layer on each
shape for every available ISA and prints a table (median of --runs calls)."""
import argparse
import os
import statistics
import sys
import time

import numpy as np

from . import Layer, attention, isa_available


def _shape(text):
    try:
        shape = tuple(int(n) for n in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 7 or min(shape) <= 0 or shape[3] % shape[4]:
        raise argparse.ArgumentTypeError(f"expected B,Sq,Skv,H,Hkv,dh,E with H % Hkv == 0, "
                                         f"got {text!r}")
    return shape


def _median_ms(fn, runs):
    fn()  # warm-up: first-touch of buffers, lazy repacking
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def bench(shapes, runs):
    rng = np.random.default_rng(0)
    print(f"{'shape B,Sq,Skv,H,Hkv,dh,E':<28} {'isa':<7} {'attention ms':>12} {'GFLOP/s':>8} "
          f"{'layer ms':>10} {'GFLOP/s':>8}")
    for B, Sq, Skv, H, Hkv, dh, E in shapes:
        def rand(*shape, scale=1.0):
            return (scale * rng.uniform(-1, 1, shape)).astype(np.float32)

        q, k, v = rand(B, H, Sq, dh), rand(B, Hkv, Skv, dh), rand(B, Hkv, Skv, dh)
        out = np.empty_like(q)
        w = 1 / np.sqrt(E)
        layer = Layer(H, rand(H * dh, E, scale=w), rand(Hkv * dh, E, scale=w),
                      rand(Hkv * dh, E, scale=w), w_o=rand(E, H * dh, scale=w))
        xq = rand(B, Sq, E)
        xkv = xq if Sq == Skv else rand(B, Skv, E)  # self-attention when the lengths agree
        # FLOPs: 4 B H Sq Skv dh for attention; 2 M N K for the projections
        attn_flop = 4.0 * B * H * Sq * Skv * dh
        layer_flop = (attn_flop + 2.0 * B * Sq * E * H * dh * 2
                      + 2.0 * B * Skv * E * Hkv * dh * 2)
        for isa in isa_available():
            a_ms = _median_ms(lambda: attention(q, k, v, out=out, isa=isa), runs)
            l_ms = _median_ms(lambda: layer(xq, xkv, xkv, isa=isa), runs)
            print(f"{','.join(map(str, (B, Sq, Skv, H, Hkv, dh, E))):<28} {isa:<7} "
                  f"{a_ms:12.4g} {attn_flop / a_ms / 1e6:8.3g} {l_ms:10.4g} "
                  f"{layer_flop / l_ms / 1e6:8.3g}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m libmha", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="mha-validate's report (arguments go to mha-validate)",
                   add_help=False)
    b = sub.add_parser("bench", help="time attention and the layer per ISA")
    b.add_argument("--shape", type=_shape, action="append",
                   help="B,Sq,Skv,H,Hkv,dh,E (repeatable; default BERT-base 1,128,128,12,12,64,768)")
    b.add_argument("--runs", type=int, default=10, help="timed calls per entry (default 10)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["validate"]:
        tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mha-validate")
        os.execv(tool, [tool, *(argv[1:] or ["--report"])])
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    bench(args.shape or [(1, 128, 128, 12, 12, 64, 768)], args.runs)


if __name__ == "__main__":
    main()
