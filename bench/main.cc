// mha-bench: Google Benchmark harness for libmha.
//
// Every kernel family (fused QKV projection, attention, head transpose) and the
// whole layer run on each named shape for every ISA that mha_isa_available()
// reports (scalar included, so the SIMD gain shows), next to OpenBLAS
// cblas_sgemm on the QKV projection's M, N, K. Benchmarks of one shape are
// registered together so that libmha and its peer run back to back.
//
// Counters (Google Benchmark JSON, one entry per benchmark):
//   GFLOP/s    FLOP per call x calls / seconds / 1e9, FLOP counted as
//                GEMM       2*M*N*K
//                attention  4*B*H*Sq*Skv*dh (QK^T and PV, 2*Sq*Skv*dh each per
//                           (b, h)), halved when causal; the softmax is not counted
//                layer      QKV projection + attention + output projection
//   %peak      GFLOP/s over the machine's peak: the best FMA-throughput loop of
//              the ISAs built and on this CPU (bench/peak*.c), i.e. of its
//              widest FMA, same OpenMP thread count
//   %isa_peak  GFLOP/s over the FMA peak of the ISA the kernel ran on
//   GB/s       head transpose: 2 * tensor bytes per call (read once, written
//              once) / seconds / 1e9
//   %memcpy    GB/s over memcpy bandwidth measured the same way (2 * bytes)
//
// The peaks are measured before the benchmarks (for the counters above) and run
// again as benchmarks peak/fma/<isa> and peak/memcpy/64MiB at the start and the
// end; report.py divides by the best of all these measurements.
//
// Own flags (the rest go to Google Benchmark):
//   --quick            a few small shapes and short runs, for CI smoke tests
//   --shapes-json      print the shapes of this mode as JSON (read by peers.py)
//   --shapes=A,B,...   only the shapes of these names (kShapes), quick or not
//   --openblas-core    print the core OpenBLAS chose (openblas_get_corename;
//                      nothing without OpenBLAS): tools/bench.sh sets
//                      OPENBLAS_CORETYPE when it is a pre-AVX2 fallback
//   --scalar-cap=G     skip the scalar ISA on calls above G GFLOP (default 4,
//                      1 with --quick): it is 10-100x slower than SIMD
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "isa_list.h"
#include "mha.h"
#include "peak.h"

#ifdef MHA_BENCH_HAVE_BLAS
#include <cblas.h>
#endif

namespace {

// The FMA-throughput loop of every ISA built (bench/peak_<isa>.c), in mha_isa order.
struct PeakLoop {
    mha_isa isa;
    double (*loop)(int64_t);
};
#define MHA_BENCH_PEAK_LOOP_(name, value) {value, mha_peak_fma__##name},
const PeakLoop kPeakLoops[] = {MHA_ISA_BUILT(MHA_BENCH_PEAK_LOOP_)};
#undef MHA_BENCH_PEAK_LOOP_

// Kernel families, as named in benchmark names: <family>/<shape>/<implementation>.
enum Family { QKV = 1, ATTENTION = 2, TRANSPOSE = 4, LAYER = 8, ALL = 15 };
const char *const kFamilyNames[] = {"qkv", "attention", "transpose", "layer"};

// d_model = heads * head_dim is both the input width and the output width.
struct Shape {
    const char *name;
    const char *group; // bert, long, gqa, ...: rows of the table, series of the plots
    int32_t batch, seq, heads, kv_heads, head_dim;
    bool causal;   // attention only
    unsigned runs; // Family bits
    bool quick;    // also run with --quick
};

const Shape kShapes[] = {
    {"bert-b1", "bert", 1, 128, 12, 12, 64, false, ALL, true},
    {"bert-b8", "bert", 8, 128, 12, 12, 64, false, ALL, false},
    {"bert-b32", "bert", 32, 128, 12, 12, 64, false, ALL, false},
    {"long-s512", "long", 1, 512, 12, 12, 64, false, ALL, true},
    {"long-s2048", "long", 1, 2048, 12, 12, 64, false, ALL, false},
    {"long-s8192", "long", 1, 8192, 12, 12, 64, false, ALL, false},
    {"long-s2048-causal", "long-causal", 1, 2048, 12, 12, 64, true, ATTENTION, false},
    {"gqa-s512", "gqa", 1, 512, 32, 8, 128, false, ALL, true},
    {"gqa-s2048", "gqa", 1, 2048, 32, 8, 128, false, ALL, false},
    // The head transpose on a 64 MiB tensor, far beyond the caches (the spec's target).
    {"transpose-64MiB", "transpose", 1, 16384, 16, 16, 64, false, TRANSPOSE, true},
};

// The shapes that run: those named by --shapes, else every one (--quick: the quick ones).
std::vector<std::string> g_only_shapes;

bool selected(const Shape &s, bool quick)
{
    if (!g_only_shapes.empty())
        return std::find(g_only_shapes.begin(), g_only_shapes.end(), s.name)
               != g_only_shapes.end();
    return !quick || s.quick;
}

int64_t d_model(const Shape &s) { return (int64_t)s.heads * s.head_dim; }
int64_t tokens(const Shape &s) { return (int64_t)s.batch * s.seq; }

double gemm_flops(double m, double n, double k) { return 2.0 * m * n * k; }

// Q, K, V in one GEMM: M = B*S tokens, N = (H + 2*Hkv)*dh outputs, K = d_model.
double qkv_flops(const Shape &s)
{
    return gemm_flops((double)tokens(s), (double)(s.heads + 2 * s.kv_heads) * s.head_dim,
                      (double)d_model(s));
}

double attention_flops(const Shape &s)
{
    double f = 4.0 * s.batch * s.heads * (double)s.seq * s.seq * s.head_dim;
    return s.causal ? f / 2.0 : f;
}

double layer_flops(const Shape &s)
{
    return qkv_flops(s) + attention_flops(s)
           + gemm_flops((double)tokens(s), (double)d_model(s), (double)d_model(s));
}

// Bytes that an in-place split of the [B][S][H][dh] tensor reads plus writes.
double transpose_bytes(const Shape &s)
{
    return 2.0 * (double)tokens(s) * (double)d_model(s) * sizeof(float);
}

struct Peaks {
    double fma_gflops[MHA_ISA_COUNT] = {}; // per mha_isa; 0: not measured
    double best_gflops = 0;
    double memcpy_gbps = 0;
    int threads = 1;
};
Peaks g_peaks;

// Uniform in [-1, 1), from a fixed seed: inputs like PyTorch's tests use.
void fill_uniform(std::vector<float> &x, float scale, uint64_t seed)
{
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    for (float &v : x) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        v = scale * ((float)(st >> 40) / (float)(1ull << 23) - 1.0f);
    }
}

std::vector<float> uniform(int64_t n, float scale, uint64_t seed)
{
    std::vector<float> x((size_t)n);
    fill_uniform(x, scale, seed);
    return x;
}

// Inputs and the packed layer of one shape, built on first use and kept, so that
// Google Benchmark's repeated calls of a benchmark do not repack the weights.
struct ShapeData {
    mha_layer *layer = nullptr;
    std::vector<float> x;       // [B][S][d_model]
    std::vector<float> q, k, v; // [B][H][S][dh], [B][Hkv][S][dh]
    ~ShapeData() { mha_layer_destroy(layer); }
};

ShapeData &shape_data(const Shape &s)
{
    static std::map<std::string, std::unique_ptr<ShapeData>> cache;
    std::unique_ptr<ShapeData> &slot = cache[s.name];
    if (slot)
        return *slot;
    slot = std::make_unique<ShapeData>();
    ShapeData &d = *slot;
    const int64_t e = d_model(s), ekv = (int64_t)s.kv_heads * s.head_dim;
    const float w_scale = 1.0f / std::sqrt((float)e); // nn.Linear's init range
    std::vector<float> wq = uniform(e * e, w_scale, 1), wk = uniform(ekv * e, w_scale, 2);
    std::vector<float> wv = uniform(ekv * e, w_scale, 3), wo = uniform(e * e, w_scale, 4);
    std::vector<float> bq = uniform(e, w_scale, 5), bk = uniform(ekv, w_scale, 6);
    std::vector<float> bv = uniform(ekv, w_scale, 7), bo = uniform(e, w_scale, 8);
    mha_layer_desc desc = {};
    desc.heads = s.heads;
    desc.kv_heads = s.kv_heads;
    desc.head_dim = s.head_dim;
    desc.q_in = (int32_t)e;
    desc.out_dim = (int32_t)e;
    desc.w_q = wq.data();
    desc.w_k = wk.data();
    desc.w_v = wv.data();
    desc.b_q = bq.data();
    desc.b_k = bk.data();
    desc.b_v = bv.data();
    desc.w_o = wo.data();
    desc.b_o = bo.data();
    mha_status st = mha_layer_create(&desc, &d.layer);
    if (st != MHA_OK)
        d.layer = nullptr;
    d.x = uniform(tokens(s) * e, 1.0f, 9);
    d.q = uniform(tokens(s) * e, 1.0f, 10);
    d.k = uniform(tokens(s) * ekv, 1.0f, 11);
    d.v = uniform(tokens(s) * ekv, 1.0f, 12);
    return d;
}

using Clock = std::chrono::steady_clock;

// Runs call() once untimed (first touch of the outputs, OpenMP pool start),
// then once per iteration, timed by wall clock (the kernels are multi-threaded).
// Returns the total timed seconds; 0 after SkipWithError.
template <class Call> double run_timed(benchmark::State &state, Call call)
{
    mha_status st = call();
    if (st != MHA_OK) {
        state.SkipWithError(mha_status_str(st));
        return 0;
    }
    double total = 0;
    for (auto _ : state) {
        Clock::time_point t0 = Clock::now();
        call();
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(dt);
        total += dt;
    }
    return total;
}

// isa < 0: not a libmha kernel (a peer), no %isa_peak.
void set_flop_counters(benchmark::State &state, double flops_per_call, double seconds, int isa)
{
    if (seconds <= 0)
        return;
    const double gflops = flops_per_call * (double)state.iterations() / seconds / 1e9;
    state.counters["GFLOP/s"] = gflops;
    state.counters["%peak"] = 100.0 * gflops / g_peaks.best_gflops;
    if (isa >= 0 && g_peaks.fma_gflops[isa] > 0)
        state.counters["%isa_peak"] = 100.0 * gflops / g_peaks.fma_gflops[isa];
}

bool force(benchmark::State &state, mha_isa isa)
{
    mha_status st = mha_isa_force(isa);
    if (st != MHA_OK)
        state.SkipWithError(mha_status_str(st));
    return st == MHA_OK;
}

void bm_qkv(benchmark::State &state, const Shape *s, mha_isa isa)
{
    if (!force(state, isa))
        return;
    ShapeData &d = shape_data(*s);
    const int64_t nq = tokens(*s) * d_model(*s), nkv = tokens(*s) * s->kv_heads * s->head_dim;
    std::vector<float> q((size_t)nq), k((size_t)nkv), v((size_t)nkv);
    double secs = run_timed(state, [&] {
        return mha_qkv_project(d.layer, d.x.data(), d.x.data(), d.x.data(), s->batch, s->seq,
                               s->seq, q.data(), k.data(), v.data());
    });
    set_flop_counters(state, qkv_flops(*s), secs, isa);
}

void bm_attention(benchmark::State &state, const Shape *s, mha_isa isa)
{
    if (!force(state, isa))
        return;
    ShapeData &d = shape_data(*s);
    const mha_attn_dims dims = {s->batch, s->heads, s->kv_heads, s->seq, s->seq, s->head_dim, 0};
    mha_mask mask = {};
    mask.causal = s->causal;
    std::vector<float> out(d.q.size());
    const float scale = 1.0f / std::sqrt((float)s->head_dim);
    double secs = run_timed(state, [&] {
        return mha_attention(&dims, d.q.data(), d.k.data(), d.v.data(), scale, &mask, out.data(),
                             MHA_LAYOUT_BHSD);
    });
    set_flop_counters(state, attention_flops(*s), secs, isa);
}

// A tensor beyond the caches is copied with the parallel memcpy before each
// split (only the split is the iteration's time): %memcpy is then memcpy's time
// over the split's for the same bytes in the same moments, a ratio that holds
// while the machine's memory bandwidth drifts. Cache-resident tensors are timed
// alone, against the run's memcpy peak.
void bm_transpose(benchmark::State &state, const Shape *s, mha_isa isa)
{
    if (!force(state, isa))
        return;
    std::vector<float> x = uniform(tokens(*s) * d_model(*s), 1.0f, 14);
    const size_t bytes = x.size() * sizeof(float);
    const bool side_by_side = bytes >= ((size_t)64 << 20);
    std::vector<float> copy(side_by_side ? x.size() : 0);
    mha_status st = mha_heads_split(x.data(), s->batch, s->seq, s->heads, s->head_dim);
    if (st != MHA_OK) {
        state.SkipWithError(mha_status_str(st));
        return;
    }
    double split_secs = 0, copy_secs = 0;
    for (auto _ : state) {
        Clock::time_point t0 = Clock::now();
        if (side_by_side)
            mha_peak_memcpy(copy.data(), x.data(), bytes);
        Clock::time_point t1 = Clock::now();
        mha_heads_split(x.data(), s->batch, s->seq, s->heads, s->head_dim);
        const double dt = std::chrono::duration<double>(Clock::now() - t1).count();
        state.SetIterationTime(dt);
        split_secs += dt;
        copy_secs += std::chrono::duration<double>(t1 - t0).count();
    }
    const double n = (double)state.iterations(), gbps = transpose_bytes(*s) * n / split_secs / 1e9;
    state.counters["GB/s"] = gbps;
    if (side_by_side) {
        state.counters["memcpy_s"] = copy_secs / n;
        state.counters["%memcpy"] = 100.0 * copy_secs / split_secs;
    } else {
        state.counters["%memcpy"] = 100.0 * gbps / g_peaks.memcpy_gbps;
    }
}

void bm_layer(benchmark::State &state, const Shape *s, mha_isa isa)
{
    if (!force(state, isa))
        return;
    ShapeData &d = shape_data(*s);
    std::vector<float> out((size_t)(tokens(*s) * d_model(*s)));
    const size_t ws_bytes = mha_layer_workspace_size(d.layer, s->batch, s->seq, s->seq);
    std::vector<unsigned char> ws(ws_bytes);
    double secs = run_timed(state, [&] {
        return mha_layer_forward(d.layer, d.x.data(), d.x.data(), d.x.data(), s->batch, s->seq,
                                 s->seq, nullptr, out.data(), ws.data(), ws_bytes);
    });
    set_flop_counters(state, layer_flops(*s), secs, isa);
}

#ifdef MHA_BENCH_HAVE_BLAS
// The QKV projection as one plain GEMM: C [M][N] = X [M][K] W^T, W [N][K] in
// nn.Linear's layout (no bias, no head-major scatter).
void bm_sgemm(benchmark::State &state, const Shape *s)
{
    const int m = (int)tokens(*s), n = (s->heads + 2 * s->kv_heads) * s->head_dim;
    const int k = (int)d_model(*s);
    const std::vector<float> &x = shape_data(*s).x;
    std::vector<float> w = uniform((int64_t)n * k, 1.0f / std::sqrt((float)k), 13);
    std::vector<float> c((size_t)m * n);
    double secs = run_timed(state, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k,
                    w.data(), k, 0.0f, c.data(), n);
        return MHA_OK;
    });
    set_flop_counters(state, qkv_flops(*s), secs, -1);
}
#endif

// The peaks again as benchmarks, first and last in the run, so that the report
// can take the best of the measurements that bracket the kernels' (a shared
// machine's load moves both). One call: 2^20 iterations of the loop.
void bm_peak_fma(benchmark::State &state, double (*loop)(int64_t))
{
    double flops = 0;
    double secs = run_timed(state, [&] {
        flops = loop(1 << 20);
        return MHA_OK;
    });
    if (secs > 0)
        state.counters["GFLOP/s"] = flops * (double)state.iterations() / secs / 1e9;
}

void bm_peak_memcpy(benchmark::State &state)
{
    const size_t bytes = (size_t)64 << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    double moved = 0;
    double secs = run_timed(state, [&] {
        moved = mha_peak_memcpy(dst.data(), src.data(), bytes);
        return MHA_OK;
    });
    if (secs > 0)
        state.counters["GB/s"] = moved * (double)state.iterations() / secs / 1e9;
}

void register_peaks(double min_time)
{
    auto add = [&](const char *name, double (*loop)(int64_t)) {
        benchmark::RegisterBenchmark(name, bm_peak_fma, loop)
            ->UseManualTime()
            ->MinTime(min_time)
            ->Unit(benchmark::kMillisecond);
    };
    for (const PeakLoop &p : kPeakLoops)
        if (mha_isa_available(p.isa))
            add((std::string("peak/fma/") + mha_isa_name(p.isa)).c_str(), p.loop);
    benchmark::RegisterBenchmark("peak/memcpy/64MiB", bm_peak_memcpy)
        ->UseManualTime()
        ->MinTime(min_time)
        ->Unit(benchmark::kMillisecond);
}

// Best of `reps` runs of an FMA loop, its iteration count grown until one run
// takes at least `seconds`.
double measure_fma(double (*loop)(int64_t), double seconds, int reps)
{
    int64_t iters = 1 << 16;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double dt, flops;
        do {
            Clock::time_point t0 = Clock::now();
            flops = loop(iters);
            dt = std::chrono::duration<double>(Clock::now() - t0).count();
            if (dt < seconds)
                iters *= 2;
        } while (dt < seconds / 2);
        best = std::max(best, flops / dt / 1e9);
    }
    return best;
}

// Best of `reps` parallel memcpy of 64 MiB (far beyond the caches), in GB/s.
double measure_memcpy(int reps)
{
    const size_t bytes = (size_t)64 << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        Clock::time_point t0 = Clock::now();
        double moved = mha_peak_memcpy(dst.data(), src.data(), bytes);
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        best = std::max(best, moved / dt / 1e9);
    }
    return best;
}

void measure_peaks(bool quick)
{
    g_peaks.threads = mha_peak_threads();
    const double secs = quick ? 0.05 : 0.2;
    const int reps = quick ? 3 : 5;
    // Only the loops this CPU can run: the widest of them is the peak.
    for (const PeakLoop &p : kPeakLoops)
        if (mha_isa_available(p.isa))
            g_peaks.fma_gflops[p.isa] = measure_fma(p.loop, secs, reps);
    for (double g : g_peaks.fma_gflops)
        g_peaks.best_gflops = std::max(g_peaks.best_gflops, g);
    g_peaks.memcpy_gbps = measure_memcpy(reps * 2);

    char buf[64];
    for (int i = 0; i < MHA_ISA_COUNT; i++) {
        if (g_peaks.fma_gflops[i] <= 0)
            continue;
        std::snprintf(buf, sizeof buf, "%.3f", g_peaks.fma_gflops[i]);
        benchmark::AddCustomContext(std::string("peak_gflops_") + mha_isa_name((mha_isa)i), buf);
        std::fprintf(stderr, "peak: %-6s FMA loop %8.1f GFLOP/s on %d threads\n",
                     mha_isa_name((mha_isa)i), g_peaks.fma_gflops[i], g_peaks.threads);
    }
    std::snprintf(buf, sizeof buf, "%.3f", g_peaks.best_gflops);
    benchmark::AddCustomContext("peak_gflops", buf);
    std::snprintf(buf, sizeof buf, "%.3f", g_peaks.memcpy_gbps);
    benchmark::AddCustomContext("memcpy_gbps", buf);
    std::fprintf(stderr, "peak: memcpy 64 MiB  %8.1f GB/s (2 x bytes) on %d threads\n",
                 g_peaks.memcpy_gbps, g_peaks.threads);
}

void print_shapes_json(bool quick)
{
    std::printf("[\n");
    bool first = true;
    for (const Shape &s : kShapes) {
        if (!selected(s, quick))
            continue;
        std::printf("%s  {\"name\": \"%s\", \"group\": \"%s\", \"batch\": %d, \"seq\": %d, "
                    "\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"causal\": %s, "
                    "\"families\": [",
                    first ? "" : ",\n", s.name, s.group, s.batch, s.seq, s.heads, s.kv_heads,
                    s.head_dim, s.causal ? "true" : "false");
        const char *sep = "";
        for (int f = 0; f < 4; f++)
            if (s.runs & (1u << f)) {
                std::printf("%s\"%s\"", sep, kFamilyNames[f]);
                sep = ", ";
            }
        std::printf("]}");
        first = false;
    }
    std::printf("\n]\n");
}

void register_all(bool quick, double scalar_cap_gflop)
{
    const double min_time = quick ? 0.02 : 0.3;
    register_peaks(min_time);
    std::vector<mha_isa> isas;
    std::string names;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        if (mha_isa_available((mha_isa)i)) {
            isas.push_back((mha_isa)i);
            names += (names.empty() ? "" : ",") + std::string(mha_isa_name((mha_isa)i));
        }
    benchmark::AddCustomContext("isas", names); // those this build and CPU have, report.py's rows

    for (const Shape &s : kShapes) {
        if (!selected(s, quick))
            continue;
        const std::string sn = s.name;
        // Scalar only where a call stays under the cap.
        auto runs = [&](mha_isa isa, double flops) {
            return isa != MHA_ISA_SCALAR || flops <= scalar_cap_gflop * 1e9;
        };
        auto add = [&](const std::string &name, void (*fn)(benchmark::State &, const Shape *,
                                                           mha_isa),
                       mha_isa isa) {
            benchmark::RegisterBenchmark(name.c_str(), fn, &s, isa)
                ->UseManualTime()
                ->MinTime(min_time)
                ->Unit(benchmark::kMillisecond);
        };
        for (mha_isa isa : isas)
            if ((s.runs & QKV) && runs(isa, qkv_flops(s)))
                add("qkv/" + sn + "/" + mha_isa_name(isa), bm_qkv, isa);
#ifdef MHA_BENCH_HAVE_BLAS
        if (s.runs & QKV)
            benchmark::RegisterBenchmark(("qkv/" + sn + "/openblas").c_str(), bm_sgemm, &s)
                ->UseManualTime()
                ->MinTime(min_time)
                ->Unit(benchmark::kMillisecond);
#endif
        for (mha_isa isa : isas)
            if ((s.runs & ATTENTION) && runs(isa, attention_flops(s)))
                add("attention/" + sn + "/" + mha_isa_name(isa), bm_attention, isa);
        for (mha_isa isa : isas)
            if (s.runs & TRANSPOSE)
                add("transpose/" + sn + "/" + mha_isa_name(isa), bm_transpose, isa);
        for (mha_isa isa : isas)
            if ((s.runs & LAYER) && runs(isa, layer_flops(s)))
                add("layer/" + sn + "/" + mha_isa_name(isa), bm_layer, isa);
    }
    register_peaks(min_time);
}

} // namespace

int main(int argc, char **argv)
{
    bool quick = false, shapes_json = false, openblas_core = false;
    double scalar_cap = -1;
    int kept = 1;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (std::strcmp(argv[i], "--shapes-json") == 0)
            shapes_json = true;
        else if (std::strcmp(argv[i], "--openblas-core") == 0)
            openblas_core = true;
        else if (std::strncmp(argv[i], "--shapes=", 9) == 0)
            for (const char *p = argv[i] + 9; *p;) {
                const char *end = std::strchr(p, ',');
                size_t len = end ? (size_t)(end - p) : std::strlen(p);
                g_only_shapes.emplace_back(p, len);
                p += end ? len + 1 : len;
            }
        else if (std::strncmp(argv[i], "--scalar-cap=", 13) == 0)
            scalar_cap = std::atof(argv[i] + 13);
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    if (shapes_json) {
        print_shapes_json(quick);
        return 0;
    }
    if (openblas_core) {
#ifdef MHA_BENCH_HAVE_BLAS
        std::printf("%s\n", openblas_get_corename());
#endif
        return 0;
    }
    if (scalar_cap < 0)
        scalar_cap = quick ? 1.0 : 4.0;

    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
        return 1;

    measure_peaks(quick);
    benchmark::AddCustomContext("mha_version", mha_version());
    benchmark::AddCustomContext("omp_threads", std::to_string(g_peaks.threads));
    benchmark::AddCustomContext("mode", quick ? "quick" : "full");
    char cap[32];
    std::snprintf(cap, sizeof cap, "%g", scalar_cap);
    benchmark::AddCustomContext("scalar_cap_gflop", cap);
#ifdef MHA_BENCH_HAVE_BLAS
    openblas_set_num_threads(g_peaks.threads);
    benchmark::AddCustomContext("openblas", openblas_get_config());
    benchmark::AddCustomContext("openblas_core", openblas_get_corename());
    if (const char *forced = std::getenv("OPENBLAS_CORETYPE"))
        benchmark::AddCustomContext("openblas_coretype", forced);
    benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
#endif

    register_all(quick, scalar_cap);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
