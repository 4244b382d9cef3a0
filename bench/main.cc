// mha-bench: Google Benchmark harness for libmha.
//
// Every kernel family (fused QKV projection, attention, head transpose) and the
// whole layer run on each named shape for every ISA that mha_isa_available()
// reports (scalar included, so the SIMD gain shows), next to OpenBLAS
// cblas_sgemm on the QKV projection's M, N, K. Benchmarks of one shape are
// registered together so that libmha and its peer run back to back.
//
// Cached and modified attention run on the cases of kCases, each next to its
// reference (the implementation <isa>-ref), always causal:
//   decode     one query row per sequence on a KV cache [B][Hkv][cap = Skv][dh]
//              (mha_attention_cached); reference, at Skv = 4096: mha_attention
//              with seq_q = 1 over the same K, V as contiguous tensors
//   prefill    a chunk of seq_q rows onto a cache that then holds seq_kv rows
//              (mha_attention_cached, lens = seq_kv); reference: mha_attention
//              over all seq_kv rows
//   modifier   mha_attention with a sliding window, softcap, ALiBi slopes or
//              sinks; reference: the same call without it (ALiBi: as a dense
//              bias [1][H][S][S])
//   step       a decode step of a whole layer (mha_layer_step: projections, the
//              new K, V row appended at position seq_kv - 1, attention over
//              seq_kv keys, output projection) on a paged cache; reference: the
//              same cache contiguous
//   call       decode's call (mha_attention_cached, one row) on a cache so small
//              (64 keys, K+V 64 KiB) that the call's fixed costs set its time: no
//              reference and no plain read, the time per call against its target
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
//   decode: GB/s       K and V bytes per call (2*B*Hkv*Skv*dh*4) / seconds / 1e9
//           read_GB/s  the same bytes read by the widest ISA's plain vector read
//                      (bench/peak_<isa>.c), split over the same threads by
//                      (b, kv head) slab (paged: by block, in the order of the
//                      block tables), timed right before each call
//           %read      GB/s over read_GB/s
//   prefill, modifier: GFLOP/s, %peak, %isa_peak with the FLOP that the mask
//              leaves: 4*dh per (row, visible key) per (b, h)
//   step       the same, plus the GEMM FLOP of the three projections
//   call       the same as prefill; the time per call is Google Benchmark's
//              real_time, in us
//
// The peaks are measured before the benchmarks (for the counters above) and run
// again as benchmarks peak/fma/<isa> and peak/memcpy/64MiB at the start and the
// end; report.py divides by the best of all these measurements.
//
// Own flags (the rest go to Google Benchmark):
//   --quick            a few small shapes and short runs, for CI smoke tests
//   --shapes-json      print the shapes of this mode as JSON, with the work (FLOP or
//                      bytes) of a call of each family (read by peers.py, report.py)
//   --shapes=A,B,...   only the shapes of these names (kShapes), quick or not
//   --openblas-core    print the core OpenBLAS chose (openblas_get_corename;
//                      nothing without OpenBLAS): tools/bench.sh sets
//                      OPENBLAS_CORETYPE when it is older than the CPU's vectors
//   --scalar-cap=G     skip the scalar ISA on calls above G GFLOP (default 4,
//                      1 with --quick): it is 10-100x slower than SIMD
//
// Environment: MHA_BENCH_HUGEPAGES=1 puts every allocation of 2 MiB or more (inputs,
// caches, pools, their references alike) on transparent huge pages (madvise), as an
// engine may for its KV pool; the context's "pages" says which were used. Peers keep
// their own allocations: compare paged with contiguous in such a run, not with peers.
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
#include <new>
#include <string>
#include <vector>

#if __has_include(<unistd.h>)
#include <sys/mman.h> // madvise: MHA_BENCH_HUGEPAGES
#include <unistd.h>     // sysconf: the L3 size where sysfs has none
#endif

#include "isa_list.h"
#include "mha.h"
#include "peak.h"
extern "C" {
#include "ref64.h"
}

#ifdef MHA_BENCH_HAVE_BLAS
#include <cblas.h>
#endif

// Every allocation of the bench starts on a 64-byte cache line, as engines' tensors do
// (PyTorch's, ggml's): glibc's malloc puts a large block 16 bytes off a line, where each
// row load of the kernels straddles two lines (decode on an f16 cache 9% slower).
// With MHA_BENCH_HUGEPAGES=1, those of 2 MiB or more start on a 2 MiB boundary and are
// advised onto huge pages: a shuffled pool of 4 KiB blocks otherwise pays a page walk per
// block, which the paged cases would measure as much as their block tables. The flag is
// read at static initialization; the few allocations before it are small.
static const bool g_huge_pages = [] {
    const char *e = std::getenv("MHA_BENCH_HUGEPAGES");
    return e && std::strcmp(e, "1") == 0;
}();

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// n bytes from a 2 MiB boundary, advised onto huge pages; NULL if out of memory.
__attribute__((noinline)) static void *huge_alloc(std::size_t n)
{
    const std::size_t bytes = (n + kHugePage - 1) / kHugePage * kHugePage;
    void *p = std::aligned_alloc(kHugePage, bytes);
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

void *operator new(std::size_t n)
{
    if (void *p = g_huge_pages && n >= kHugePage
                      ? huge_alloc(n)
                      : std::aligned_alloc(64, (n + 63) / 64 * 64 + (n == 0) * 64))
        return p;
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

namespace {

// The FMA-throughput loop and the plain read of every ISA built
// (bench/peak_<isa>.c), in mha_isa order.
struct PeakLoop {
    mha_isa isa;
    double (*loop)(int64_t);
    double (*read)(const float *, const float *, const int64_t *, int64_t, int64_t);
};
#define MHA_BENCH_PEAK_LOOP_(name, value) {value, mha_peak_fma__##name, mha_peak_read__##name},
const PeakLoop kPeakLoops[] = {MHA_ISA_BUILT(MHA_BENCH_PEAK_LOOP_)};
#undef MHA_BENCH_PEAK_LOOP_

// Kernel families, as named in benchmark names: <family>/<shape>/<implementation>.
// ALL: the four of the dense shapes (kShapes); the last five run on kCases.
enum Family { QKV = 1, ATTENTION = 2, TRANSPOSE = 4, LAYER = 8, ALL = 15, DECODE = 16,
              PREFILL = 32, MODIFIER = 64, STEP = 128, CALL = 256 };
const char *const kFamilyNames[] = {"qkv",     "attention", "transpose", "layer", "decode",
                                    "prefill", "modifier",  "step",      "call"};

// d_model = heads * head_dim is both the input width and the output width.
struct Shape {
    const char *name;
    const char *group; // bert, long, gqa, ...: rows of the table, series of the plots
    int32_t batch, seq, heads, kv_heads, head_dim;
    bool causal;     // attention only
    unsigned runs;   // Family bits
    bool quick;      // also run with --quick
    mha_dtype dtype = MHA_F32; // of q, k, v and out (attention only)
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
    // Attention on 16-bit activations, against the peers in the same type.
    {"bert-b8-f16", "f16", 8, 128, 12, 12, 64, false, ATTENTION, false, MHA_F16},
    {"long-s2048-f16", "f16", 1, 2048, 12, 12, 64, false, ATTENTION, false, MHA_F16},
    {"gqa-s2048-f16", "f16", 1, 2048, 32, 8, 128, false, ATTENTION, false, MHA_F16},
    {"bert-b8-bf16", "bf16", 8, 128, 12, 12, 64, false, ATTENTION, false, MHA_BF16},
    {"long-s2048-bf16", "bf16", 1, 2048, 12, 12, 64, false, ATTENTION, true, MHA_BF16},
    {"gqa-s2048-bf16", "bf16", 1, 2048, 32, 8, 128, false, ATTENTION, false, MHA_BF16},
};

// The name of a family (one bit).
const char *family_name(Family f)
{
    int bit = 0;
    while (!((unsigned)f & (1u << bit)))
        bit++;
    return kFamilyNames[bit];
}

enum Modifier { NO_MODIFIER, WINDOW, SOFTCAP, ALIBI, SINKS };
const char *const kModifierNames[] = {"none", "window", "softcap", "alibi", "sinks"};
// What <isa>-ref runs (see the top of this file).
enum Reference { NO_REF, REF_ATTENTION, REF_FULL, REF_PLAIN, REF_DENSE, REF_F32, REF_CONTIG };
const char *const kReferenceNames[] = {"none", "attention", "full",  "plain",
                                       "dense", "f32",       "contiguous"};

// A case of cached or modified attention: the last seq_q rows of seq_kv
// positions, causal. target: the stated goal for libmha's speed over its
// reference, as report.py checks it (decode, modifier: time ratio; prefill:
// GFLOP/s ratio; call: the most microseconds a call may take); 0 when none is stated.
struct Case {
    const char *name, *group;
    Family family;
    int32_t batch, heads, kv_heads, head_dim, seq_q, seq_kv;
    Modifier modifier;
    float value; // window size, softcap; ALiBi slopes are 2^(-8(h+1)/H), sinks 1.0
    Reference ref;
    double target;
    bool quick;
    mha_dtype kv_type = MHA_F32; // the cache's type (decode, prefill)
    int32_t block_size = 0;      // > 0: a paged cache of blocks of this many rows, shuffled
};

// Llama-3-8B-like GQA decode (32 heads on 8 kv heads of 128); the modifiers on BERT-size heads.
const Case kCases[] = {
    {"decode-b1-s512", "decode", DECODE, 1, 32, 8, 128, 1, 512, NO_MODIFIER, 0, NO_REF, 0, true},
    {"decode-b1-s1024", "decode", DECODE, 1, 32, 8, 128, 1, 1024, NO_MODIFIER, 0, NO_REF, 0, false},
    {"decode-b1-s4096", "decode", DECODE, 1, 32, 8, 128, 1, 4096, NO_MODIFIER, 0, REF_ATTENTION, 0,
     false},
    {"decode-b1-s16384", "decode", DECODE, 1, 32, 8, 128, 1, 16384, NO_MODIFIER, 0, NO_REF, 0,
     false},
    {"decode-b8-s512", "decode", DECODE, 8, 32, 8, 128, 1, 512, NO_MODIFIER, 0, NO_REF, 0, false},
    {"decode-b8-s1024", "decode", DECODE, 8, 32, 8, 128, 1, 1024, NO_MODIFIER, 0, NO_REF, 0, false},
    {"decode-b8-s4096", "decode", DECODE, 8, 32, 8, 128, 1, 4096, NO_MODIFIER, 0, REF_ATTENTION, 0,
     false},
    {"decode-b8-s16384", "decode", DECODE, 8, 32, 8, 128, 1, 16384, NO_MODIFIER, 0, NO_REF, 0,
     false},
#define TYPED_DECODE_(t, name)                                                                       \
    {"decode-b1-s4096-" name, "decode-" name, DECODE, 1, 32, 8, 128, 1, 4096, NO_MODIFIER, 0, REF_F32, \
     0, t == MHA_BF16, t},                                                                           \
    {"decode-b1-s16384-" name, "decode-" name, DECODE, 1, 32, 8, 128, 1, 16384, NO_MODIFIER, 0,       \
     NO_REF, 0, false, t},                                                                           \
    {"decode-b8-s4096-" name, "decode-" name, DECODE, 8, 32, 8, 128, 1, 4096, NO_MODIFIER, 0, REF_F32, \
     0, false, t},                                                                                   \
    {"decode-b8-s16384-" name, "decode-" name, DECODE, 8, 32, 8, 128, 1, 16384, NO_MODIFIER, 0,       \
     NO_REF, 0, false, t},
    TYPED_DECODE_(MHA_F16, "f16") TYPED_DECODE_(MHA_BF16, "bf16") TYPED_DECODE_(MHA_Q8_0, "q8_0")
#undef TYPED_DECODE_
    // Paged caches (blocks shuffled in the pool) against the same cache contiguous.
#define PAGED_DECODE_(b, t, name, bs)                                                               \
    {"decode-b" #b "-s4096-" name "-paged" #bs, "paged", DECODE, b, 32, 8, 128, 1, 4096,             \
     NO_MODIFIER, 0, REF_CONTIG, 0.95, false, t, bs},
    PAGED_DECODE_(1, MHA_F32, "f32", 16) PAGED_DECODE_(1, MHA_F32, "f32", 64)
    PAGED_DECODE_(1, MHA_F32, "f32", 256) PAGED_DECODE_(8, MHA_F32, "f32", 16)
    PAGED_DECODE_(8, MHA_F32, "f32", 64) PAGED_DECODE_(8, MHA_F32, "f32", 256)
    PAGED_DECODE_(1, MHA_F16, "f16", 16) PAGED_DECODE_(1, MHA_F16, "f16", 64)
    PAGED_DECODE_(1, MHA_F16, "f16", 256) PAGED_DECODE_(8, MHA_F16, "f16", 16)
    PAGED_DECODE_(8, MHA_F16, "f16", 64) PAGED_DECODE_(8, MHA_F16, "f16", 256)
#undef PAGED_DECODE_
    // 512 new rows onto 3584 cached ones, against the whole 4096-row causal attention.
    {"prefill-c512-s4096", "prefill", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER, 0, REF_FULL,
     0.9, false},
    {"prefill-c512-s4096-f16", "prefill-typed", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER, 0,
     REF_F32, 0.9, false, MHA_F16},
    {"prefill-c512-s4096-bf16", "prefill-typed", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER, 0,
     REF_F32, 0.9, false, MHA_BF16},
    {"prefill-c512-s4096-q8_0", "prefill-typed", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER, 0,
     REF_F32, 0.9, false, MHA_Q8_0},
    {"prefill-c512-s4096-paged16", "prefill-paged", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER,
     0, REF_CONTIG, 0.95, false, MHA_F32, 16},
    {"prefill-c512-s4096-paged256", "prefill-paged", PREFILL, 1, 32, 8, 128, 512, 4096, NO_MODIFIER,
     0, REF_CONTIG, 0.95, false, MHA_F32, 256},
    // A Llama-3-8B-like layer's decode step (d_model 4096), paged against contiguous.
#define PAGED_STEP_(b, t, name, bs)                                                                 \
    {"step-b" #b "-s4096-" name "-paged" #bs, "step-paged", STEP, b, 32, 8, 128, 1, 4096,           \
     NO_MODIFIER, 0, REF_CONTIG, 0.95, false, t, bs},
    PAGED_STEP_(8, MHA_F32, "f32", 16) PAGED_STEP_(8, MHA_F16, "f16", 16)
#undef PAGED_STEP_
    // The smallest decode call (one row over 64 keys, 8 heads on 2 kv heads of 64):
    // its time is the library's fixed cost per call, with a target of 3 us.
    {"call-b1-s64", "call", CALL, 1, 8, 2, 64, 1, 64, NO_MODIFIER, 0, NO_REF, 3, false},
    {"window1024-s8192", "window", MODIFIER, 1, 12, 12, 64, 8192, 8192, WINDOW, 1024, REF_PLAIN, 3,
     false},
    {"softcap50-s2048", "softcap", MODIFIER, 1, 12, 12, 64, 2048, 2048, SOFTCAP, 50, REF_PLAIN, 0.8,
     false},
    {"alibi-s2048", "alibi", MODIFIER, 1, 12, 12, 64, 2048, 2048, ALIBI, 0, REF_DENSE, 1, false},
    {"sinks-s2048", "sinks", MODIFIER, 1, 12, 12, 64, 2048, 2048, SINKS, 0, REF_PLAIN, 0, false},
};

// The shapes and cases that run: those named by --shapes, else every one (--quick:
// the quick ones).
std::vector<std::string> g_only_shapes;

template <class S> bool selected(const S &s, bool quick)
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

// Bytes of n values of type t (q8_0: 34 bytes per 32 values).
double type_bytes(mha_dtype t, double n)
{
    return t == MHA_Q8_0 ? n / 32 * 34 : t == MHA_F32 ? n * 4 : n * 2;
}

// K and V bytes that a decode step (its reference when ref) reads, in the cache's
// type: f32 for the references on f32 K and V.
double kv_bytes(const Case &c, bool ref)
{
    const bool f32 = ref && (c.ref == REF_ATTENTION || c.ref == REF_F32);
    return type_bytes(f32 ? MHA_F32 : c.kv_type,
                      2.0 * c.batch * c.kv_heads * (double)c.seq_kv * c.head_dim);
}

// 4*dh FLOP per (b, h, row, visible key): row i sits at position seq_kv - seq_q + i and
// sees keys up to it, the last `window` of them with a window.
double case_flops(const Case &c, bool ref)
{
    const int32_t sq = ref && c.ref == REF_FULL ? c.seq_kv : c.seq_q;
    const bool windowed = c.modifier == WINDOW && !ref;
    double keys = 0;
    for (int32_t i = 0; i < sq; i++) {
        const double seen = (double)(c.seq_kv - sq + i + 1);
        keys += windowed ? std::min(seen, (double)c.value) : seen;
    }
    const double attention = 4.0 * c.batch * c.heads * c.head_dim * keys;
    if (c.family != STEP)
        return attention;
    const double e = (double)c.heads * c.head_dim, rows = (double)c.batch * c.seq_q;
    return attention + gemm_flops(rows, (double)(c.heads + 2 * c.kv_heads) * c.head_dim, e)
           + gemm_flops(rows, e, e);
}

// What a case's rate counts per call: K and V bytes for decode, FLOP otherwise.
double case_work(const Case &c, bool ref)
{
    return c.family == DECODE ? kv_bytes(c, ref) : case_flops(c, ref);
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
    // The plain read of the ISA with the best FMA peak (the widest), for %read.
    double (*read)(const float *, const float *, const int64_t *, int64_t, int64_t) = nullptr;
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
    std::vector<uint16_t> q16, k16, v16; // the same in the shape's 16-bit type
    ~ShapeData() { mha_layer_destroy(layer); }
};

// x rounded to a 16-bit type through the library's own conversion.
std::vector<uint16_t> to_16bit(const std::vector<float> &x, mha_dtype t)
{
    std::vector<uint16_t> y(x.size());
    mha_kv_cache c = {};
    c.k = c.v = y.data();
    c.batch = c.kv_heads = c.head_dim = 1;
    c.capacity = (int32_t)x.size();
    c.stride_s = 1;
    c.dtype = t;
    const int32_t zero = 0;
    mha_kv_append(&c, &zero, x.data(), x.data(), (int32_t)x.size());
    return y;
}

// A layer of d_model = heads * head_dim in and out, GQA on kv_heads, with
// nn.Linear-like random weights and biases; nullptr when creation fails.
mha_layer *make_layer(int32_t heads, int32_t kv_heads, int32_t head_dim)
{
    const int64_t e = (int64_t)heads * head_dim, ekv = (int64_t)kv_heads * head_dim;
    const float w_scale = 1.0f / std::sqrt((float)e); // nn.Linear's init range
    std::vector<float> wq = uniform(e * e, w_scale, 1), wk = uniform(ekv * e, w_scale, 2);
    std::vector<float> wv = uniform(ekv * e, w_scale, 3), wo = uniform(e * e, w_scale, 4);
    std::vector<float> bq = uniform(e, w_scale, 5), bk = uniform(ekv, w_scale, 6);
    std::vector<float> bv = uniform(ekv, w_scale, 7), bo = uniform(e, w_scale, 8);
    mha_layer_desc desc = {};
    desc.heads = heads;
    desc.kv_heads = kv_heads;
    desc.head_dim = head_dim;
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
    mha_layer *layer = nullptr;
    return mha_layer_create(&desc, &layer) == MHA_OK ? layer : nullptr;
}

ShapeData &shape_data(const Shape &s)
{
    static std::map<std::string, std::unique_ptr<ShapeData>> cache;
    std::unique_ptr<ShapeData> &slot = cache[s.name];
    if (slot)
        return *slot;
    slot = std::make_unique<ShapeData>();
    ShapeData &d = *slot;
    const int64_t e = d_model(s), ekv = (int64_t)s.kv_heads * s.head_dim;
    d.layer = make_layer(s.heads, s.kv_heads, s.head_dim);
    d.x = uniform(tokens(s) * e, 1.0f, 9);
    d.q = uniform(tokens(s) * e, 1.0f, 10);
    d.k = uniform(tokens(s) * ekv, 1.0f, 11);
    d.v = uniform(tokens(s) * ekv, 1.0f, 12);
    if (s.dtype != MHA_F32) {
        d.q16 = to_16bit(d.q, s.dtype);
        d.k16 = to_16bit(d.k, s.dtype);
        d.v16 = to_16bit(d.v, s.dtype);
    }
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
    const mha_attn_dims dims = {s->batch, s->heads, s->kv_heads, s->seq, s->seq, s->head_dim, 0, s->dtype};
    mha_mask mask = {};
    mask.causal = s->causal;
    std::vector<float> out(d.q.size());
    const float scale = 1.0f / std::sqrt((float)s->head_dim);
    const bool f32 = s->dtype == MHA_F32;
    double secs = run_timed(state, [&] {
        return mha_attention(&dims, f32 ? d.q.data() : (const float *)d.q16.data(),
                             f32 ? d.k.data() : (const float *)d.k16.data(),
                             f32 ? d.v.data() : (const float *)d.v16.data(), scale, &mask,
                             out.data(), MHA_LAYOUT_BHSD);
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

// Inputs of the case that runs now: its benchmarks are registered together, so
// one case's buffers (up to 1 GiB of K and V at B=8, Skv=16384) are kept at a time.
struct CaseData {
    std::string name;
    std::vector<float> q, k, v; // q [B][H][seq_q][dh]; k, v [B][Hkv][seq_kv][dh]: cap = seq_kv
    std::vector<float> q_full;  // REF_FULL: [B][H][seq_kv][dh]
    std::vector<float> per_head; // [H]: ALiBi slopes or sinks
    std::vector<float> bias;     // REF_DENSE: the ALiBi bias [1][H][S][S]
    // STEP: the layer, its input x [B][seq_q][H*dh] and its workspace.
    std::unique_ptr<mha_layer, void (*)(mha_layer *)> layer{nullptr, mha_layer_destroy};
    std::vector<float> x;
    std::vector<unsigned char> ws;
    // The case's cache (its type, paged or not) and its reference's (f32, or the
    // same type contiguous), each over its own buffers.
    struct Cache {
        std::vector<unsigned char> k, v;
        std::vector<int32_t> table;
        mha_kv_cache c = {};
    } cache, ref_cache;
    std::vector<double> out64; // DECODE: the call's output in float64 (ref_attention_cached)
};

// A cache of c's shape holding the K and V of d, of type t: [B][Hkv][cap][dh] rows,
// or with block_size > 0 a pool of B*cap/block_size blocks [Hkv][block_size][dh] in
// an order shuffled by a fixed seed; written by mha_kv_append.
void build_cache(const Case &c, const CaseData &d, mha_dtype t, int32_t block_size,
                 CaseData::Cache &out)
{
    const int64_t per = t == MHA_Q8_0 ? 32 : 1, row = c.head_dim / per;
    const int64_t unit = (int64_t)type_bytes(t, per);
    const int32_t rows = block_size > 0 ? block_size : c.seq_kv;
    const int32_t slabs = block_size > 0 ? c.batch * (c.seq_kv / block_size) : c.batch;
    const int64_t units = (int64_t)slabs * c.kv_heads * rows * row;
    out.k.assign((size_t)(units * unit), 0);
    out.v.assign((size_t)(units * unit), 0);
    mha_kv_cache &kc = out.c;
    kc = {};
    kc.k = out.k.data(), kc.v = out.v.data(), kc.batch = c.batch, kc.kv_heads = c.kv_heads;
    kc.head_dim = c.head_dim, kc.capacity = c.seq_kv, kc.dtype = t;
    kc.stride_b = (int64_t)c.kv_heads * rows * row, kc.stride_h = (int64_t)rows * row, kc.stride_s = row;
    if (block_size > 0) {
        out.table.resize((size_t)slabs);
        for (int32_t i = 0; i < slabs; i++)
            out.table[(size_t)i] = i;
        uint64_t st = 12345;
        for (int32_t i = slabs - 1; i > 0; i--) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            std::swap(out.table[(size_t)i], out.table[(size_t)((st >> 33) % (uint64_t)(i + 1))]);
        }
        kc.block_table = out.table.data(), kc.block_size = block_size;
        kc.max_blocks = c.seq_kv / block_size, kc.num_blocks = slabs;
    }
    const std::vector<int32_t> zero((size_t)c.batch, 0);
    if (mha_kv_append(&kc, zero.data(), d.k.data(), d.v.data(), c.seq_kv) != MHA_OK)
        kc.k = nullptr;
}

CaseData &case_data(const Case &c)
{
    static CaseData d;
    if (d.name == c.name)
        return d;
    d = CaseData();
    d.name = c.name;
    const int64_t kv = (int64_t)c.batch * c.kv_heads * c.seq_kv * c.head_dim;
    d.q = uniform((int64_t)c.batch * c.heads * c.seq_q * c.head_dim, 1.0f, 20);
    d.k = uniform(kv, 1.0f, 21);
    d.v = uniform(kv, 1.0f, 22);
    if (c.ref == REF_FULL)
        d.q_full = uniform((int64_t)c.batch * c.heads * c.seq_kv * c.head_dim, 1.0f, 23);
    for (int32_t h = 0; h < c.heads; h++)
        d.per_head.push_back(c.modifier == ALIBI ? std::exp2(-8.0f * (float)(h + 1) / c.heads) : 1.0f);
    if (c.family != MODIFIER) {
        build_cache(c, d, c.kv_type, c.block_size, d.cache);
        if (c.ref == REF_F32)
            build_cache(c, d, MHA_F32, 0, d.ref_cache);
        if (c.ref == REF_CONTIG)
            build_cache(c, d, c.kv_type, 0, d.ref_cache);
    }
    if (c.family == STEP) {
        d.layer.reset(make_layer(c.heads, c.kv_heads, c.head_dim));
        d.x = uniform((int64_t)c.batch * c.seq_q * c.heads * c.head_dim, 1.0f, 24);
        d.ws.resize(mha_layer_step_workspace_size(d.layer.get(), c.batch, c.seq_q));
    }
    if (c.ref == REF_DENSE) {
        const int64_t n = c.seq_kv;
        d.bias.resize((size_t)(c.heads * n * n));
        for (int32_t h = 0; h < c.heads; h++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < n; j++)
                    d.bias[(size_t)((h * n + i) * n + j)] = d.per_head[h] * (float)(j - i);
    }
    return d;
}

// One call of case c (its reference when ref), writing out.
mha_status case_call(const Case &c, CaseData &d, bool ref, std::vector<float> &out)
{
    const float scale = 1.0f / std::sqrt((float)c.head_dim);
    mha_mask mask = {};
    mask.causal = 1;
    if (c.family == MODIFIER) {
        if (c.modifier == WINDOW && !ref)
            mask.window = (int32_t)c.value;
        if (c.modifier == SOFTCAP && !ref)
            mask.softcap = c.value;
        if (c.modifier == SINKS && !ref)
            mask.sinks = d.per_head.data();
        if (c.modifier == ALIBI && !ref)
            mask.alibi_slopes = d.per_head.data();
        if (c.modifier == ALIBI && ref) {
            mask.bias = d.bias.data();
            mask.bias_stride_h = (int64_t)c.seq_kv * c.seq_kv;
            mask.bias_stride_q = c.seq_kv;
        }
    }
    if (c.family == MODIFIER || (ref && (c.ref == REF_ATTENTION || c.ref == REF_FULL))) {
        const int32_t sq = c.ref == REF_FULL ? c.seq_kv : c.seq_q;
        const mha_attn_dims dims = {c.batch, c.heads, c.kv_heads, sq, c.seq_kv, c.head_dim, 0, MHA_F32};
        return mha_attention(&dims, (c.ref == REF_FULL ? d.q_full : d.q).data(), d.k.data(),
                             d.v.data(), scale, &mask, out.data(), MHA_LAYOUT_BHSD);
    }
    const mha_kv_cache &cache = ref ? d.ref_cache.c : d.cache.c;
    if (!cache.k)
        return MHA_ERR_NOMEM;
    if (c.family == STEP) {
        std::vector<int32_t> lens((size_t)c.batch, c.seq_kv - c.seq_q);
        return mha_layer_step(d.layer.get(), d.x.data(), c.seq_q, &cache, lens.data(), &mask,
                              out.data(), d.ws.data(), d.ws.size());
    }
    const std::vector<int32_t> lens((size_t)c.batch, c.seq_kv);
    return mha_attention_cached(&cache, lens.data(), d.q.data(), c.heads, c.seq_q, scale, &mask,
                                out.data(), MHA_LAYOUT_BHSD, nullptr);
}

// The error of a decode call's output: max |out - ref| / max |ref|, ref the same
// attention in float64 over the cache as the library holds it (tools/ref64.c), the
// measure peers.py takes of each peer. The reference is computed once per case.
double decode_error(const Case &c, CaseData &d, const std::vector<float> &out)
{
    if (d.out64.empty()) {
        d.out64.resize(out.size());
        const std::vector<int32_t> lens((size_t)c.batch, c.seq_kv);
        mha_mask mask = {};
        mask.causal = 1;
        ref_attention_cached(&d.cache.c, lens.data(), d.q.data(), c.heads, c.seq_q,
                             1.0 / std::sqrt((double)c.head_dim), &mask, d.out64.data(),
                             MHA_LAYOUT_BHSD, nullptr);
    }
    double err = 0, top = 0;
    for (size_t i = 0; i < out.size(); i++) {
        err = std::max(err, std::fabs((double)out[i] - d.out64[i]));
        top = std::max(top, std::fabs(d.out64[i]));
    }
    return top > 0 ? err / top : err;
}

// Decode is timed against the plain read of the same K, V right before each call
// (the read's time is not the iteration's): both find the buffers as the other
// left them, in cache when they fit, so the ratio favours neither side.
void bm_case(benchmark::State &state, const Case *c, mha_isa isa, bool ref)
{
    if (!force(state, isa))
        return;
    CaseData &d = case_data(*c);
    const int32_t sq = ref && c->ref == REF_FULL ? c->seq_kv : c->seq_q;
    std::vector<float> out((size_t)c->batch * c->heads * sq * c->head_dim);
    if (c->family != DECODE) {
        double secs = run_timed(state, [&] { return case_call(*c, d, ref, out); });
        set_flop_counters(state, case_flops(*c, ref), secs, isa);
        return;
    }
    /* The plain read covers the bytes of the cache the call reads, in slabs of
       (b, kv head), or for a paged cache in its blocks' slabs of one kv head, in
       the order of the block tables: sequence by sequence, head by head, as the
       call reads them (the hardware's prefetchers follow neither across blocks). */
    const CaseData::Cache &cc = ref && (c->ref == REF_F32 || c->ref == REF_CONTIG) ? d.ref_cache : d.cache;
    const float *rk = ref && c->ref == REF_ATTENTION ? d.k.data() : (const float *)cc.k.data();
    const float *rv = ref && c->ref == REF_ATTENTION ? d.v.data() : (const float *)cc.v.data();
    const double bytes = ref && c->ref == REF_ATTENTION ? 2.0 * d.k.size() * sizeof(float)
                                                        : 2.0 * (double)cc.k.size();
    const mha_kv_cache &kc = cc.c;
    const bool paged = kc.block_table && !(ref && c->ref == REF_ATTENTION);
    const int32_t per_seq = paged ? kc.max_blocks : 1;
    const int64_t slabs = (int64_t)c->batch * c->kv_heads * per_seq;
    const int64_t slab = (int64_t)(bytes / 2 / sizeof(float)) / slabs;
    std::vector<int64_t> order;
    for (int32_t b = 0; paged && b < c->batch; b++)
        for (int32_t g = 0; g < c->kv_heads; g++)
            for (int32_t i = 0; i < per_seq; i++)
                order.push_back((int64_t)kc.block_table[(int64_t)b * per_seq + i] * c->kv_heads + g);
    mha_status st = case_call(*c, d, ref, out);
    if (st != MHA_OK) {
        state.SkipWithError(mha_status_str(st));
        return;
    }
    double call_secs = 0, read_secs = 0;
    for (auto _ : state) {
        Clock::time_point t0 = Clock::now();
        g_peaks.read(rk, rv, order.empty() ? nullptr : order.data(), slabs, slab);
        Clock::time_point t1 = Clock::now();
        case_call(*c, d, ref, out);
        const double dt = std::chrono::duration<double>(Clock::now() - t1).count();
        state.SetIterationTime(dt);
        call_secs += dt;
        read_secs += std::chrono::duration<double>(t1 - t0).count();
    }
    const double n = (double)state.iterations();
    if (!ref)
        state.counters["error"] = decode_error(*c, d, out);
    state.counters["GB/s"] = bytes * n / call_secs / 1e9;
    state.counters["read_GB/s"] = bytes * n / read_secs / 1e9;
    state.counters["%read"] = 100.0 * read_secs / call_secs;
    /* The roofline: the longer of the plain read of these bytes and the FLOP at the
       widest FMA's peak, over the call's time. */
    const double roof = std::max(read_secs / n, case_flops(*c, ref) / (g_peaks.best_gflops * 1e9));
    state.counters["roofline_ms"] = 1e3 * roof;
    state.counters["%roofline"] = 100.0 * roof / (call_secs / n);
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

// Linux's transparent huge page mode (always, madvise or never: the bracketed word of
// sysfs), "unknown" elsewhere.
std::string thp_mode()
{
    FILE *f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = {0};
    const bool got = f && std::fgets(line, sizeof line, f);
    if (f)
        std::fclose(f);
    const char *open = got ? std::strchr(line, '[') : nullptr;
    const char *close = open ? std::strchr(open, ']') : nullptr;
    return close ? std::string(open + 1, close) : "unknown";
}

// The size of the L3 that CPU 0 shares, from sysfs (a virtual machine's sysconf may
// report the whole socket's: 64 MiB on an EPYC whose 2 vCPUs share 8), else sysconf.
long l3_bytes()
{
    for (int i = 0; i < 8; i++) {
        const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
        FILE *level = std::fopen((dir + "level").c_str(), "r");
        if (!level)
            break;
        int lv = 0;
        const bool l3 = std::fscanf(level, "%d", &lv) == 1 && lv == 3;
        std::fclose(level);
        FILE *size = l3 ? std::fopen((dir + "size").c_str(), "r") : nullptr;
        if (!size)
            continue;
        long n = 0;
        char unit = 0;
        const int got = std::fscanf(size, "%ld%c", &n, &unit);
        std::fclose(size);
        if (got >= 1 && n > 0)
            return n << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    return sysconf(_SC_LEVEL3_CACHE_SIZE);
#else
    return 0;
#endif
}

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
    for (const PeakLoop &p : kPeakLoops)
        if (g_peaks.fma_gflops[p.isa] > g_peaks.best_gflops) {
            g_peaks.best_gflops = g_peaks.fma_gflops[p.isa];
            g_peaks.read = p.read;
        }
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
    for (const PeakLoop &p : kPeakLoops)
        if (p.read == g_peaks.read)
            benchmark::AddCustomContext("read_isa", mha_isa_name(p.isa));
    // The L3 that CPU 0 shares (0 when unknown): report.py marks the decode cases that fit.
    benchmark::AddCustomContext("l3_bytes", std::to_string(l3_bytes()));
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
                    "\"dtype\": \"%s\", \"families\": [",
                    first ? "" : ",\n", s.name, s.group, s.batch, s.seq, s.heads, s.kv_heads,
                    s.head_dim, s.causal ? "true" : "false", mha_dtype_name(s.dtype));
        const char *sep = "";
        for (int f = 0; f < 4; f++)
            if (s.runs & (1u << f)) {
                std::printf("%s\"%s\"", sep, kFamilyNames[f]);
                sep = ", ";
            }
        // The work of a call of each family, report.py's only FLOP and byte counts.
        const double work[4] = {qkv_flops(s), attention_flops(s), transpose_bytes(s),
                                layer_flops(s)};
        std::printf("], \"work\": {");
        sep = "";
        for (int f = 0; f < 4; f++)
            if (s.runs & (1u << f)) {
                std::printf("%s\"%s\": %.17g", sep, kFamilyNames[f], work[f]);
                sep = ", ";
            }
        std::printf("}}");
        first = false;
    }
    for (const Case &c : kCases) {
        if (!selected(c, quick))
            continue;
        std::printf("%s  {\"name\": \"%s\", \"group\": \"%s\", \"batch\": %d, \"seq\": %d, "
                    "\"seq_q\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
                    "\"causal\": true, \"modifier\": \"%s\", \"value\": %g, "
                    "\"reference\": \"%s\", \"target\": %g, \"families\": [\"%s\"], "
                    "\"work\": %.17g, \"ref_work\": %.17g, \"kv_type\": \"%s\", "
                    "\"block_size\": %d}",
                    first ? "" : ",\n", c.name, c.group, c.batch, c.seq_kv, c.seq_q, c.heads,
                    c.kv_heads, c.head_dim, kModifierNames[c.modifier], c.value,
                    kReferenceNames[c.ref], c.target, family_name(c.family), case_work(c, false),
                    case_work(c, true), mha_dtype_name(c.kv_type), c.block_size);
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
    // Each ISA's call and its reference back to back (the reference's FLOP decide
    // whether scalar runs it).
    for (const Case &c : kCases) {
        if (!selected(c, quick))
            continue;
        const std::string prefix = std::string(family_name(c.family)) + "/" + c.name + "/";
        for (mha_isa isa : isas)
            for (bool ref : {false, true}) {
                if ((ref && c.ref == NO_REF)
                    || (isa == MHA_ISA_SCALAR && case_flops(c, ref) > scalar_cap_gflop * 1e9))
                    continue;
                const std::string name = prefix + mha_isa_name(isa) + (ref ? "-ref" : "");
                benchmark::RegisterBenchmark(name.c_str(), bm_case, &c, isa, ref)
                    ->UseManualTime()
                    ->MinTime(min_time)
                    ->Unit(c.family == CALL ? benchmark::kMicrosecond : benchmark::kMillisecond);
            }
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
    benchmark::AddCustomContext("pages", g_huge_pages ? "huge (MADV_HUGEPAGE, THP " + thp_mode() + ")"
                                                      : "4 KiB");
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
