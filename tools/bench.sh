#!/bin/sh
# The libmha benchmark comparison, in one command:
#
#   tools/bench.sh [--quick] [--threads N] [--rounds R] [--build-dir DIR] [--out DIR]
#                  [-- MESON_OPTIONS...]
#
# MESON_OPTIONS go to `meson setup` when DIR is first configured (e.g.
# -Davx2=disabled).
#
# 1. installs what is missing (apt-get): the build tools, Google Benchmark,
#    OpenBLAS, PyTorch and matplotlib from Debian;
# 2. creates a venv (--system-site-packages, so it sees Debian's torch and numpy)
#    with onnxruntime and onnx from PyPI, unless it already has them;
# 3. builds mha-bench (meson -Dbench=true) in DIR (default build-bench);
# 4. runs R rounds of mha-bench (libmha per ISA, OpenBLAS) then peers.py
#    (PyTorch, ONNX Runtime), same shapes and thread count, alternating;
# 5. writes the report with bench/report.py.
#
# Output, in --out (default bench/out): mha-bench-<r>.json (Google Benchmark
# JSON), peers-<r>.json, shapes.json, results.json, table.md, attention.png,
# layer_seq.png, layer.png.
#
# --quick: 4 small shapes, short runs, 1 round (CI smoke test, under a minute
# once built). Full: every shape, 1 round, about 5-10 minutes on 2 cores;
# --rounds 2 or more alternates mha-bench and peers.py again, each entry
# keeping its best time. --threads defaults to the number of CPUs and
# sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the peers' thread pools.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
quick=0
threads=$(nproc)
rounds=
build="$root/build-bench"
out="$root/bench/out"
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --out) out=$2; shift ;;
    --) shift; break ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$quick" = 1 ]; then
    rounds=${rounds:-1} min_time=0.02 mode=--quick
else
    rounds=${rounds:-1} min_time=0.3 mode=
fi
start=$(date +%s)
step() { echo "==> [$(($(date +%s) - start))s] $*" >&2; }

step "checking packages"
need=
for p in meson ninja-build g++ pkg-config python3-venv libbenchmark-dev libopenblas-dev \
    python3-torch python3-matplotlib; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
    sudo=
    [ "$(id -u)" = 0 ] || sudo=sudo
    step "installing:$need"
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
fi

venv="$build/venv"
if ! "$venv/bin/python" -c 'import onnxruntime, onnx' 2>/dev/null; then
    step "creating $venv with onnxruntime and onnx from PyPI"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    # Keep Debian's numpy: python3-torch is built against it.
    numpy=$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')
    "$venv/bin/pip" install -q onnxruntime onnx "numpy==$numpy" ||
        echo "bench.sh: pip failed; the ONNX Runtime peer will be skipped" >&2
fi

step "building mha-bench in $build"
[ -f "$build/build.ninja" ] ||
    meson setup "$build" "$root" -Dbench=true -Dtests=false --buildtype=release "$@" >&2
ninja -C "$build" bench/mha-bench >&2
bench="$build/bench/mha-bench"

# OpenBLAS workers otherwise spin long after each call and take a core from
# the libmha call that follows. (No OMP_PROC_BIND: it would pin the main
# thread, and with it every OpenBLAS worker, to one core.)
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" OPENBLAS_THREAD_TIMEOUT=4
mkdir -p "$out"
rm -f "$out"/mha-bench-*.json "$out"/peers-*.json
"$bench" $mode --shapes-json >"$out/shapes.json"
bench_args='' peer_args=''
r=1
while [ "$r" -le "$rounds" ]; do
    step "round $r/$rounds: mha-bench (libmha per ISA, OpenBLAS), $threads threads"
    "$bench" $mode --benchmark_out="$out/mha-bench-$r.json" --benchmark_out_format=json
    step "round $r/$rounds: peers.py (PyTorch, ONNX Runtime), $threads threads"
    "$venv/bin/python" "$root/bench/peers.py" --shapes "$out/shapes.json" --threads "$threads" \
        --min-time "$min_time" --out "$out/peers-$r.json"
    bench_args="$bench_args --bench $out/mha-bench-$r.json"
    peer_args="$peer_args --peers $out/peers-$r.json"
    r=$((r + 1))
done

step "writing the report"
# shellcheck disable=SC2086
"$venv/bin/python" "$root/bench/report.py" --shapes "$out/shapes.json" $bench_args $peer_args \
    --out-dir "$out"
cat "$out/table.md"
step "done: $out/{results.json,table.md,attention.png,layer_seq.png,layer.png}"
