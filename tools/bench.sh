#!/bin/sh
# The libmha benchmark comparison, in one command:
#
#   tools/bench.sh [--quick] [--threads N] [--rounds R] [--shapes A,B,...]
#                  [--build-dir DIR] [--out DIR] [-- MESON_OPTIONS...]
#
# MESON_OPTIONS go to `meson setup` when DIR is first configured (e.g.
# -Davx2=disabled).
#
# 1. installs what is missing (apt-get): the build tools, Google Benchmark,
#    OpenBLAS and matplotlib from Debian;
# 2. creates DIR/venv (its own site-packages: Debian's torch 1.13, whose
#    OpenBLAS falls back to a pre-AVX2 core on some CPUs, and numpy 1.24 stay
#    out) and installs each peer from PyPI that it lacks: onnxruntime and onnx;
#    in full mode also torch, openvino and ggml-python (ggml, built from
#    source with cmake). A peer that pip cannot install is
#    reported as unavailable, with pip's error, in the table's notes;
# 3. builds mha-bench (meson -Dbench=true) in DIR (default build-bench);
# 4. sets OPENBLAS_CORETYPE when the core OpenBLAS would run (the caller's
#    OPENBLAS_CORETYPE, else the one it detects) is older than the CPU's widest
#    vectors: to the detected core if that one is not, else to SkylakeX
#    (AVX-512) or Haswell (AVX2); it says so when it overrides the caller's;
# 5. runs R rounds of mha-bench (libmha per ISA, OpenBLAS; the dense shapes,
#    then the decode, chunked-prefill, score-modifier and layer-step cases,
#    each next to its reference, and the 64-key cached call, timed per call)
#    then peers.py once per peer, each in its own process, same shapes and
#    thread count;
# 6. writes the report with bench/report.py (Debian's python3 and matplotlib).
#
# Output, in --out (default bench/out): mha-bench-<r>.json (Google Benchmark
# JSON), peers-<r>-<peer>.json, shapes.json, results.json, table.md (every
# shape, ISA and peer), headline.md (a row per family: libmha's fastest ISA
# against the fastest peer), attention.png, layer_seq.png, layer.png,
# decode.png. tools/publish_bench.sh [DIR] then puts the table and plots in
# docs/bench/ and the headline in README.md.
#
# --quick: 4 small shapes and one decode case, short runs, 1 round, ONNX
# Runtime the only peer (CI smoke test, well under 2 minutes once built). Full:
# every shape, every peer, 1 round, about 4-6.5 minutes on 2 cores, of which
# the decode, prefill, modifier, step and call cases take about 1.5 (the first run also
# downloads torch and its CUDA wheels, about 2.5 GB; up to 1 GiB of KV cache
# per process); --rounds 2 or more alternates mha-bench
# and the peers again, each entry keeping its best time. --shapes runs only the
# shapes of these names (bench/main.cc), for development. --threads defaults
# to the number of CPUs and sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the
# peers' thread pools.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
quick=0
threads=$(nproc)
rounds=
shapes=
build="$root/build-bench"
out="$root/bench/out"
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --shapes) shapes=--shapes=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --out) out=$2; shift ;;
    --) shift; break ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
rounds=${rounds:-1}
if [ "$quick" = 1 ]; then
    min_time=0.02 mode=--quick peers=onnxruntime
else
    min_time=0.3 mode= peers="onnxruntime torch openvino ggml"
fi
start=$(date +%s)
step() { echo "==> [$(($(date +%s) - start))s] $*" >&2; }

step "checking packages"
need=
for p in meson ninja-build g++ pkg-config python3-venv libbenchmark-dev libopenblas-dev \
    python3-matplotlib cmake; do
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
# A venv of an older bench.sh saw Debian's site-packages: start anew.
if grep -qs '^include-system-site-packages = true' "$venv/pyvenv.cfg"; then
    rm -rf "$venv"
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
# Installs peer $1 (modules $2, PyPI packages after; numpy, which peers.py
# needs, too) unless it imports; when pip fails, $venv/unavailable-$1 holds why,
# for peers.py --unavailable.
install_peer() {
    peer=$1 modules=$2
    shift 2
    rm -f "$venv/unavailable-$peer"
    "$venv/bin/python" -c "import numpy, $modules" 2>/dev/null && return
    step "installing $peer from PyPI: $*"
    if ! "$venv/bin/pip" install -q --disable-pip-version-check numpy "$@" \
        >"$venv/pip-$peer.log" 2>&1; then
        echo "pip install $* failed: $(grep -v '^ *$' "$venv/pip-$peer.log" | tail -n 1)" \
            >"$venv/unavailable-$peer"
        echo "bench.sh: $(cat "$venv/unavailable-$peer"); the $peer peer is skipped" >&2
    fi
}
for peer in $peers; do
    case $peer in
    onnxruntime) install_peer onnxruntime "onnxruntime, onnx" onnxruntime onnx ;;
    torch) install_peer torch torch torch ;;
    openvino) install_peer openvino openvino openvino ;;
    # ggml-python builds ggml from source (cmake, about two minutes on 2 cores).
    ggml) install_peer ggml ggml ggml-python==0.0.45 ;;
    esac
done

step "building mha-bench in $build"
[ -f "$build/build.ninja" ] ||
    meson setup "$build" "$root" -Dbench=true -Dtests=false --buildtype=release "$@" >&2
ninja -C "$build" bench/mha-bench >&2
bench="$build/bench/mha-bench"

# OpenBLAS (DYNAMIC_ARCH) picks its kernels when it loads; on CPUs it does not
# know it may fall back to a pre-AVX2 core and run at a fraction of the FMA
# peak, which would flatter libmha. OPENBLAS_CORETYPE names the core instead,
# read at load time: so it is decided here, before the runs. A value set by the
# caller is kept unless its core is older than the CPU (some environments export
# OPENBLAS_CORETYPE=Haswell machine-wide: AVX2 kernels on an AVX-512 CPU).
#
# openblas_core DETECTED RUNNING FLAGS: the core to set, or nothing to keep
# RUNNING, the core OpenBLAS runs now (as openblas_get_corename names it; an
# unknown OPENBLAS_CORETYPE runs the detected one), on a CPU of these
# /proc/cpuinfo flags. Says why on stderr when it overrides the caller's value.
openblas_core() {
    cpu_flags=" $3 "
    has() { for f; do case $cpu_flags in *" $f "*) ;; *) return 1 ;; esac; done; }
    # The vectors of a core: 3 AVX-512, 2 AVX2, 1 older; and their names.
    tier() { case $1 in SkylakeX | Cooperlake | SapphireRapids) echo 3 ;; Haswell | Zen) echo 2 ;;
             *) echo 1 ;; esac; }
    vectors() { case $1 in 3) echo AVX-512 ;; 2) echo AVX2 ;; *) echo pre-AVX2 ;; esac; }
    if has avx512f avx512bw avx512dq avx512vl; then
        cpu=3 want=SkylakeX
    elif has avx2 fma; then
        cpu=2 want=Haswell
    else
        return 0
    fi
    running=$(tier "$2")
    [ -n "$1" ] && [ "$running" -lt "$cpu" ] || return 0 # no OpenBLAS, or not older
    [ "$(tier "$1")" -lt "$cpu" ] || want=$1
    [ -z "${OPENBLAS_CORETYPE:-}" ] ||
        echo "bench.sh: the caller's OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE runs OpenBLAS's" \
            "$(vectors "$running") kernels ($2) on this $(vectors "$cpu") CPU: overridden with" \
            "$want (OpenBLAS detects $1)" >&2
    echo "$want"
}
openblas_detected=$(env -u OPENBLAS_CORETYPE "$bench" --openblas-core)
core=$(openblas_core "$openblas_detected" "$("$bench" --openblas-core)" \
    "$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)")
[ -z "$core" ] || export OPENBLAS_CORETYPE="$core"
[ -z "$openblas_detected" ] ||
    step "OpenBLAS core: $("$bench" --openblas-core) (detected $openblas_detected," \
        "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"

# OpenBLAS workers otherwise spin long after each call and take a core from
# the libmha call that follows. (No OMP_PROC_BIND: it would pin the main
# thread, and with it every OpenBLAS worker, to one core.)
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" OPENBLAS_THREAD_TIMEOUT=4
mkdir -p "$out"
rm -f "$out"/mha-bench-*.json "$out"/peers-*.json
# shellcheck disable=SC2086
"$bench" $mode $shapes --shapes-json >"$out/shapes.json"
bench_args='' peer_args=''
r=1
while [ "$r" -le "$rounds" ]; do
    step "round $r/$rounds: mha-bench (libmha per ISA, OpenBLAS), $threads threads"
    # shellcheck disable=SC2086
    "$bench" $mode $shapes --benchmark_out="$out/mha-bench-$r.json" --benchmark_out_format=json
    bench_args="$bench_args --bench $out/mha-bench-$r.json"
    for peer in $peers; do
        step "round $r/$rounds: peers.py --peer $peer, $threads threads"
        set -- --peer "$peer" --shapes "$out/shapes.json" --threads "$threads" \
            --min-time "$min_time" --out "$out/peers-$r-$peer.json"
        [ -f "$venv/unavailable-$peer" ] && set -- "$@" --unavailable "$(cat "$venv/unavailable-$peer")"
        # A runtime that crashes loses its own column only.
        if "$venv/bin/python" "$root/bench/peers.py" "$@"; then
            peer_args="$peer_args --peers $out/peers-$r-$peer.json"
        else
            echo "bench.sh: peers.py --peer $peer failed; its column stays empty" >&2
        fi
    done
    r=$((r + 1))
done

step "writing the report"
# shellcheck disable=SC2086
/usr/bin/python3 "$root/bench/report.py" --shapes "$out/shapes.json" $bench_args $peer_args \
    --openblas-detected "$openblas_detected" --out-dir "$out"
cat "$out/table.md"
step "done: $out/{results.json,table.md,headline.md,attention.png,layer_seq.png,layer.png,decode.png}"
