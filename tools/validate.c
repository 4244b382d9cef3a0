/* mha-validate: runs every ISA this CPU has against the scalar reference (and
 * the scalar reference against float64) and prints, per kernel family and ISA,
 * the max absolute and relative error and the worst error as a fraction of
 * mha.h's tolerance. Exits 1 when any is beyond it.
 *
 *   mha-validate                    sweep of shapes that hit tile tails, all masks
 *   mha-validate --shape B,Sq,Skv,H,Hkv,dh,E   one shape (E = model width)
 *   mha-validate --report           BERT-base (B=8, S=128, 768, 12 heads): CPU, ISAs,
 *                                   errors and the layer's time per ISA, then a
 *                                   decode step's time per ISA
 * Every mode also checks mha_attention_cached (decode and chunked prefill over a
 * token-major cache, GQA, split keys, every mask kind and score modifier) on a
 * cache of every element type (f32, f16, bf16, q8_0, written by mha_kv_append) and,
 * where a shape is checked against float64, mha_attention on f16 and bf16 q, k, v and
 * out on every ISA against float64 over the rounded inputs (the AVX512-BF16 scores
 * where the CPU has them); --report times a decode step per ISA and cache type.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "internal.h"
#include "isa_list.h"
#include "mha.h"
#include "ref64.h"

#define TOL_ISA 1e-5 /* optimized ISA vs scalar */
#define TOL_REF 2e-5 /* scalar vs float64 */

/* The kernel families, cached attention once per cache type of the list, then
   mha_attention on 16-bit q, k, v and out (every ISA against float64). */
#define CACHED_NAME_(name, value, bytes, values, io) "cached " #name,
#define PLUS_ONE_(name, value, bytes, values, io) +1
enum { KERNEL_QKV, KERNEL_ATTN, KERNEL_SPLIT, KERNEL_LAYER, KERNEL_CACHED,
       KERNEL_ATTN_F16 = KERNEL_CACHED MHA_DTYPE_LIST(PLUS_ONE_), KERNEL_ATTN_BF16, NKERNEL };
static const char *kernel_names[NKERNEL] = {"qkv_project", "attention", "heads_split", "layer",
                                            MHA_DTYPE_LIST(CACHED_NAME_) "attention f16",
                                            "attention bf16"};

typedef struct stat_cell {
    double abs_err, rel_err, ratio;
    long checks;
} stat_cell;
static stat_cell stats[NKERNEL][MHA_ISA_COUNT]; /* [kernel][isa] */
static stat_cell stats_ref[NKERNEL]; /* scalar vs float64 */

typedef struct shape {
    int32_t B, Sq, Skv, H, Hkv, dh, E;
} shape;

static uint64_t rng_state = 42;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static float *alloc_floats(int64_t n, float scale)
{
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        fprintf(stderr, "mha-validate: out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < n; i++)
        p[i] = scale * uniform();
    return p;
}

/* Relative error counts only where |r| >= 1e-3, so that tiny references do not
   swamp it; the tolerance ratio covers every element. */
static void record(stat_cell *c, const float *a, const double *r, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - r[i]);
        double ratio = e / (tol + tol * fabs(r[i]));
        if (isnan(a[i]) != isnan(r[i]) || isinf(ratio))
            ratio = INFINITY;
        if (ratio > c->ratio || isnan(ratio))
            c->ratio = isnan(ratio) ? INFINITY : ratio;
        if (e > c->abs_err)
            c->abs_err = e;
        if (fabs(r[i]) >= 1e-3 && e / fabs(r[i]) > c->rel_err)
            c->rel_err = e / fabs(r[i]);
    }
    c->checks++;
}

static double *to_double(const float *a, int64_t n)
{
    double *d = malloc((size_t)n * sizeof(double));
    if (!d) {
        fprintf(stderr, "mha-validate: out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < n; i++)
        d[i] = a[i];
    return d;
}

static int check(mha_status st, const char *what)
{
    if (st != MHA_OK) {
        fprintf(stderr, "mha-validate: %s failed: %s\n", what, mha_status_str(st));
        exit(2);
    }
    return 0;
}

/* record for n values of type t at a: an output rounded once to t may differ from r
   by half an ulp of t on top of tol. */
static void record_typed(stat_cell *c, mha_dtype t, const void *a, const double *r, int64_t n,
                         double tol)
{
    for (int64_t i = 0; i < n; i++) {
        const double x = mha_load_value(t, a, i), e = fabs(x - r[i]);
        double ratio = e / (0.5 * ref_ulp(t, r[i]) + tol + tol * fabs(r[i]));
        if (isnan(x) != isnan(r[i]) || isinf(ratio) || isnan(ratio))
            ratio = INFINITY;
        c->ratio = ratio > c->ratio ? ratio : c->ratio;
        c->abs_err = e > c->abs_err ? e : c->abs_err;
        if (fabs(r[i]) >= 1e-3 && e / fabs(r[i]) > c->rel_err)
            c->rel_err = e / fabs(r[i]);
    }
    c->checks++;
}

/* mha_attention on q, k, v (nq + 2 nkv floats) rounded to the 16-bit type t, every
   ISA against float64 over the rounded values (the AVX512-BF16 scores among them). */
static void validate_attention_16bit(const shape *s, const float *qkv_in, const mha_mask *mask,
                                     mha_dtype t, int kernel)
{
    const int64_t nq = (int64_t)s->B * s->Sq * s->H * s->dh;
    const int64_t nkv = (int64_t)s->B * s->Skv * s->Hkv * s->dh;
    uint16_t *in = malloc(sizeof(uint16_t) * (size_t)(nq + 2 * nkv));
    uint16_t *out = malloc(sizeof(uint16_t) * (size_t)nq);
    double *r64 = malloc(sizeof(double) * (size_t)nq);
    if (!in || !out || !r64) {
        fprintf(stderr, "mha-validate: out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < nq + 2 * nkv; i++)
        in[i] = t == MHA_F16 ? mha_f32_to_f16(qkv_in[i]) : mha_f32_to_bf16(qkv_in[i]);
    const float *q = (const float *)in, *k = (const float *)(in + nq);
    const float *v = (const float *)(in + nq + nkv);
    const mha_attn_dims d = {s->B, s->H, s->Hkv, s->Sq, s->Skv, s->dh, 0, t};
    ref_attention(&d, q, k, v, 1.0 / sqrt((double)s->dh), mask, r64, MHA_LAYOUT_BSHD);
    for (int isa = MHA_ISA_SCALAR; isa < MHA_ISA_COUNT; isa++) {
        if (!mha_isa_available((mha_isa)isa))
            continue;
        check(mha_isa_force((mha_isa)isa), "mha_isa_force");
        check(mha_attention(&d, q, k, v, 1.0f / sqrtf((float)s->dh), mask, (float *)out,
                            MHA_LAYOUT_BSHD), "mha_attention");
        record_typed(isa == MHA_ISA_SCALAR ? &stats_ref[kernel] : &stats[kernel][isa], t, out, r64,
                     nq, TOL_REF);
    }
    free(in), free(out), free(r64);
}

/* Outputs of one ISA for one shape and mask. */
typedef struct outputs {
    float *qkv, *attn, *split, *layer;
} outputs;

static void run_isa(mha_isa isa, const shape *s, const mha_layer *L, const float *x,
                    const float *qkv_in, const mha_mask *mask, outputs *o)
{
    check(mha_isa_force(isa), "mha_isa_force");
    const int64_t nq = (int64_t)s->B * s->Sq * s->H * s->dh;
    const int64_t nkv = (int64_t)s->B * s->Skv * s->Hkv * s->dh;
    check(mha_qkv_project(L, x, x, x, s->B, s->Sq, s->Sq, o->qkv, o->qkv + nq, o->qkv + 2 * nq),
          "mha_qkv_project");
    const mha_attn_dims d = {s->B, s->H, s->Hkv, s->Sq, s->Skv, s->dh, 0, MHA_F32};
    check(mha_attention(&d, qkv_in, qkv_in + nq, qkv_in + nq + nkv, 1.0f / sqrtf((float)s->dh),
                        mask, o->attn, MHA_LAYOUT_BSHD), "mha_attention");
    memcpy(o->split, qkv_in, (size_t)nq * sizeof(float));
    check(mha_heads_split(o->split, s->B, s->Sq, s->H, s->dh), "mha_heads_split");
    if (s->Sq == s->Skv)
        check(mha_layer_forward(L, x, x, x, s->B, s->Sq, s->Sq, mask, o->layer, NULL, 0),
              "mha_layer_forward");
}

static void validate_shape(const shape *s, int with_float64)
{
    const int64_t nq = (int64_t)s->B * s->Sq * s->H * s->dh;
    const int64_t nkv = (int64_t)s->B * s->Skv * s->Hkv * s->dh;
    const int64_t nx = (int64_t)s->B * s->Sq * s->E, nout = (int64_t)s->B * s->Sq * s->E;
    const int32_t nh = s->H * s->dh, nkvh = s->Hkv * s->dh;
    float *wq = alloc_floats((int64_t)nh * s->E, 1.0f / sqrtf((float)s->E));
    float *wk = alloc_floats((int64_t)nkvh * s->E, 1.0f / sqrtf((float)s->E));
    float *wv = alloc_floats((int64_t)nkvh * s->E, 1.0f / sqrtf((float)s->E));
    float *wo = alloc_floats((int64_t)s->E * nh, 1.0f / sqrtf((float)nh));
    float *bq = alloc_floats(nh, 0.1f), *bk = alloc_floats(nkvh, 0.1f);
    float *bv = alloc_floats(nkvh, 0.1f), *bo = alloc_floats(s->E, 0.1f);
    const mha_layer_desc desc = {.heads = s->H, .kv_heads = s->Hkv, .head_dim = s->dh,
                                 .q_in = s->E, .out_dim = s->E, .w_q = wq, .w_k = wk, .w_v = wv,
                                 .b_q = bq, .b_k = bk, .b_v = bv, .w_o = wo, .b_o = bo};
    mha_layer *L;
    check(mha_layer_create(&desc, &L), "mha_layer_create");
    float *x = alloc_floats(nx, 1.0f);
    float *qkv_in = alloc_floats(nq + 2 * nkv, 1.0f);

    int32_t *key_lens = malloc(sizeof(int32_t) * (size_t)s->B);
    for (int32_t b = 0; b < s->B; b++)
        key_lens[b] = s->Skv - (b * 7) % s->Skv;
    float *bias = alloc_floats((int64_t)s->B * s->Skv, 2.0f);
    bias[0] = -INFINITY;
    const mha_mask masks[] = {{0},
                              {.key_lens = key_lens},
                              {.causal = 1},
                              {.bias = bias, .bias_stride_b = s->Skv},
                              {.key_lens = key_lens, .causal = 1, .bias = bias,
                               .bias_stride_b = s->Skv}};
    const int nmasks = (int)(sizeof masks / sizeof *masks);

    outputs ref = {alloc_floats(3 * nq, 0), alloc_floats(nq, 0), alloc_floats(nq, 0),
                   alloc_floats(nout, 0)};
    outputs got = {alloc_floats(3 * nq, 0), alloc_floats(nq, 0), alloc_floats(nq, 0),
                   alloc_floats(nout, 0)};
    for (int m = 0; m < nmasks; m++) {
        run_isa(MHA_ISA_SCALAR, s, L, x, qkv_in, &masks[m], &ref);
        if (with_float64 && s->Sq == s->Skv && m % 2 == 0) {
            double *r64 = malloc(sizeof(double) * (size_t)(nout > nq ? nout : nq));
            ref_layer(&desc, x, x, x, s->B, s->Sq, s->Sq, &masks[m], r64);
            record(&stats_ref[KERNEL_LAYER], ref.layer, r64, nout, TOL_REF);
            const mha_attn_dims d = {s->B, s->H, s->Hkv, s->Sq, s->Skv, s->dh, 0, MHA_F32};
            ref_attention(&d, qkv_in, qkv_in + nq, qkv_in + nq + nkv, 1.0 / sqrt((double)s->dh),
                          &masks[m], r64, MHA_LAYOUT_BSHD);
            record(&stats_ref[KERNEL_ATTN], ref.attn, r64, nq, TOL_REF);
            free(r64);
            validate_attention_16bit(s, qkv_in, &masks[m], MHA_F16, KERNEL_ATTN_F16);
            validate_attention_16bit(s, qkv_in, &masks[m], MHA_BF16, KERNEL_ATTN_BF16);
        }
        double *r[NKERNEL] = {to_double(ref.qkv, 3 * nq), to_double(ref.attn, nq),
                              to_double(ref.split, nq),
                              s->Sq == s->Skv ? to_double(ref.layer, nout) : NULL};
        for (int isa = MHA_ISA_SCALAR + 1; isa < MHA_ISA_COUNT; isa++) {
            if (!mha_isa_available((mha_isa)isa))
                continue;
            run_isa((mha_isa)isa, s, L, x, qkv_in, &masks[m], &got);
            if (m == 0) {
                record(&stats[KERNEL_QKV][isa], got.qkv, r[KERNEL_QKV], 3 * nq, TOL_ISA);
                /* the transpose moves bits: any difference is a failure */
                record(&stats[KERNEL_SPLIT][isa], got.split, r[KERNEL_SPLIT], nq, 0x1p-1000);
            }
            record(&stats[KERNEL_ATTN][isa], got.attn, r[KERNEL_ATTN], nq, TOL_ISA);
            if (r[KERNEL_LAYER])
                record(&stats[KERNEL_LAYER][isa], got.layer, r[KERNEL_LAYER], nout, TOL_ISA);
        }
        for (int k = 0; k < NKERNEL; k++)
            free(r[k]);
    }
    mha_layer_destroy(L);
    float *bufs[] = {wq, wk, wv, wo, bq, bk, bv, bo, x, qkv_in, bias, ref.qkv, ref.attn,
                     ref.split, ref.layer, got.qkv, got.attn, got.split, got.layer};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(key_lens);
}

/* A cache [B][cap][Hkv][dh] holding random K and V, for decode shapes. */
typedef struct decode_shape {
    int32_t B, H, Hkv, dh, dv, cap, seq_q;
} decode_shape;

/* A cache [B][cap][Hkv][dh] of type t holding k and v (rows [B][Hkv][cap][d]),
   written by mha_kv_append; NULL data when the dims do not suit t. */
static mha_kv_cache typed_cache(const decode_shape *s, mha_dtype t, const float *k, const float *v)
{
    const int32_t per = t == MHA_Q8_0 ? 32 : 1;
    mha_kv_cache c = {.batch = s->B, .kv_heads = s->Hkv, .head_dim = s->dh, .capacity = s->cap,
                      .stride_b = (int64_t)s->cap * s->Hkv * s->dh / per, .stride_h = s->dh / per,
                      .stride_s = (int64_t)s->Hkv * s->dh / per, .v_head_dim = s->dv,
                      .v_stride_b = (int64_t)s->cap * s->Hkv * s->dv / per,
                      .v_stride_h = s->dv / per, .v_stride_s = (int64_t)s->Hkv * s->dv / per,
                      .dtype = t};
    if (s->dh % per || s->dv % per)
        return c;
    const int64_t unit = t == MHA_Q8_0 ? 34 : t == MHA_F32 ? 4 : 2;
    c.k = malloc((size_t)(c.stride_b * s->B * unit));
    c.v = malloc((size_t)(c.v_stride_b * s->B * unit));
    if (!c.k || !c.v) {
        fprintf(stderr, "mha-validate: out of memory\n");
        exit(2);
    }
    int32_t *zero = calloc((size_t)s->B, sizeof(int32_t));
    check(mha_kv_append(&c, zero, k, v, s->cap), "mha_kv_append");
    free(zero);
    return c;
}

static void validate_cached(const decode_shape *s, mha_dtype t)
{
    const int64_t nk = (int64_t)s->B * s->cap * s->Hkv * s->dh;
    const int64_t nv = (int64_t)s->B * s->cap * s->Hkv * s->dv;
    const int64_t nq = (int64_t)s->B * s->H * s->seq_q * s->dh;
    const int64_t nout = (int64_t)s->B * s->H * s->seq_q * s->dv, nlse = nout / s->dv;
    float *k = alloc_floats(nk, 1.0f), *v = alloc_floats(nv, 1.0f), *q = alloc_floats(nq, 1.0f);
    float *slopes = alloc_floats(s->H, 0.0f), *sinks = alloc_floats(s->H, 2.0f);
    for (int32_t h = 0; h < s->H; h++)
        slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)s->H);
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)s->B);
    for (int32_t b = 0; b < s->B; b++)
        lens[b] = s->cap - (b * 37) % s->cap;
    const mha_kv_cache cache = typed_cache(s, t, k, v);
    const mha_mask masks[] = {{0},
                              {.causal = 1, .window = 200},
                              {.causal = 1, .softcap = 30.0f, .alibi_slopes = slopes,
                               .sinks = sinks}};
    float *ref = alloc_floats(nout + nlse, 0), *got = alloc_floats(nout + nlse, 0);
    const float scale = 1.0f / sqrtf((float)s->dh);
    for (size_t m = 0; cache.k && m < sizeof masks / sizeof *masks; m++) {
        check(mha_isa_force(MHA_ISA_SCALAR), "mha_isa_force");
        check(mha_attention_cached(&cache, lens, q, s->H, s->seq_q, scale, &masks[m], ref,
                                   MHA_LAYOUT_BHSD, ref + nout), "mha_attention_cached");
        double *r = to_double(ref, nout + nlse);
        for (int isa = MHA_ISA_SCALAR + 1; isa < MHA_ISA_COUNT; isa++) {
            if (!mha_isa_available((mha_isa)isa))
                continue;
            check(mha_isa_force((mha_isa)isa), "mha_isa_force");
            check(mha_attention_cached(&cache, lens, q, s->H, s->seq_q, scale, &masks[m], got,
                                       MHA_LAYOUT_BHSD, got + nout), "mha_attention_cached");
            record(&stats[KERNEL_CACHED + t][isa], got, r, nout + nlse, TOL_ISA);
        }
        free(r);
    }
    float *bufs[] = {k, v, q, slopes, sinks, ref, got};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(cache.k);
    free(cache.v);
    free(lens);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of mha_layer_forward (self-attention, no mask) per ISA. */
static void time_layer(const shape *s)
{
    const int32_t nh = s->H * s->dh;
    float *w = alloc_floats((int64_t)4 * nh * s->E, 1.0f / sqrtf((float)s->E));
    const mha_layer_desc desc = {.heads = s->H, .head_dim = s->dh, .q_in = s->E, .out_dim = s->E,
                                 .w_q = w, .w_k = w + (int64_t)nh * s->E,
                                 .w_v = w + 2 * (int64_t)nh * s->E, .w_o = w + 3 * (int64_t)nh * s->E};
    mha_layer *L;
    check(mha_layer_create(&desc, &L), "mha_layer_create");
    float *x = alloc_floats((int64_t)s->B * s->Sq * s->E, 1.0f);
    float *out = alloc_floats((int64_t)s->B * s->Sq * s->E, 0.0f);
    const size_t ws_bytes = mha_layer_workspace_size(L, s->B, s->Sq, s->Sq);
    void *ws = malloc(ws_bytes);
    /* FLOPs: 2*M*K*N for the QKV and output GEMMs, 4*B*H*S*S*dh for attention */
    const double M = (double)s->B * s->Sq;
    const double flops = 2 * M * s->E * 3 * nh + 2 * M * nh * s->E
                         + 4.0 * s->B * s->H * (double)s->Sq * s->Sq * s->dh;
    double scalar_ms = 0;
    printf("\nlayer forward, B=%d S=%d d_model=%d heads=%d (median of runs):\n", s->B, s->Sq,
           s->E, s->H);
    for (int isa = 0; isa < MHA_ISA_COUNT; isa++) {
        if (!mha_isa_available((mha_isa)isa))
            continue;
        check(mha_isa_force((mha_isa)isa), "mha_isa_force");
        double times[15];
        int runs = 0;
        const double start = now();
        check(mha_layer_forward(L, x, x, x, s->B, s->Sq, s->Sq, NULL, out, ws, ws_bytes), "warm-up");
        while (runs < 15 && (runs < 3 || now() - start < 3.0)) {
            const double t0 = now();
            check(mha_layer_forward(L, x, x, x, s->B, s->Sq, s->Sq, NULL, out, ws, ws_bytes),
                  "mha_layer_forward");
            times[runs++] = now() - t0;
        }
        qsort(times, (size_t)runs, sizeof *times, cmp_double);
        const double ms = 1e3 * times[runs / 2];
        if (isa == MHA_ISA_SCALAR)
            scalar_ms = ms;
        printf("  %-6s %9.2f ms  %7.1f GFLOP/s  %5.1fx scalar  (%d runs)\n",
               mha_isa_name((mha_isa)isa), ms, flops / (ms * 1e6), scalar_ms / ms, runs);
    }
    mha_layer_destroy(L);
    free(w);
    free(x);
    free(out);
    free(ws);
}

/* Median milliseconds per ISA of one decode step (mha_attention_cached, seq_q 1) on a
   cache of type t. */
static void time_decode(const decode_shape *s, mha_dtype t)
{
    const int64_t n = (int64_t)s->B * s->cap * s->Hkv * s->dh;
    float *k = alloc_floats(n, 1.0f), *v = alloc_floats(n, 1.0f);
    const int64_t bytes = 2 * n / (t == MHA_Q8_0 ? 32 : 1) * (t == MHA_Q8_0 ? 34 : t == MHA_F32 ? 4 : 2);
    float *q = alloc_floats((int64_t)s->B * s->H * s->dh, 1.0f);
    float *out = alloc_floats((int64_t)s->B * s->H * s->dh, 0.0f);
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)s->B);
    for (int32_t b = 0; b < s->B; b++)
        lens[b] = s->cap;
    const mha_kv_cache cache = typed_cache(s, t, k, v);
    const mha_mask causal = {.causal = 1};
    printf("\ndecode step, B=%d heads=%d kv_heads=%d head_dim=%d, %d cached keys, %s cache "
           "(median):\n", s->B, s->H, s->Hkv, s->dh, s->cap, mha_dtype_name(t));
    for (int isa = 0; isa < MHA_ISA_COUNT; isa++) {
        if (!mha_isa_available((mha_isa)isa))
            continue;
        check(mha_isa_force((mha_isa)isa), "mha_isa_force");
        double times[31];
        int runs = 0;
        const double start = now();
        while (runs < 31 && (runs < 3 || now() - start < 1.0)) {
            const double t0 = now();
            check(mha_attention_cached(&cache, lens, q, s->H, 1, 1.0f / sqrtf((float)s->dh),
                                       &causal, out, MHA_LAYOUT_BHSD, NULL),
                  "mha_attention_cached");
            times[runs++] = now() - t0;
        }
        qsort(times, (size_t)runs, sizeof *times, cmp_double);
        const double ms = 1e3 * times[runs / 2];
        printf("  %-6s %9.3f ms  %7.1f GB/s of K and V  (%d runs)\n", mha_isa_name((mha_isa)isa),
               ms, (double)bytes / (ms * 1e6), runs);
    }
    free(k);
    free(v);
    free(cache.k);
    free(cache.v);
    free(q);
    free(out);
    free(lens);
}

static void print_cpu(void)
{
    char line[512], model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0) {
            const char *colon = strchr(line, ':');
            if (colon) {
                snprintf(model, sizeof model, "%s", colon + 2);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        }
    if (f)
        fclose(f);
    printf("libmha %s\nCPU: %s\nISAs:", mha_version(), model);
    for (int isa = 0; isa < MHA_ISA_COUNT; isa++)
        printf(" %s=%s", mha_isa_name((mha_isa)isa),
               mha_isa_available((mha_isa)isa) ? "yes" : "no");
    printf("; active: %s\n", mha_isa_name(mha_isa_active()));
    if (mha_isa_available(MHA_ISA_AVX512)) /* what the avx512 kernels take bf16 scores with */
        printf("avx512 extensions: AVX512-BF16=%s AMX-BF16=%s%s\n",
               mha_cpu_avx512_bf16() ? "yes" : "no", mha_cpu_amx_bf16() ? "yes" : "no",
               getenv("MHA_AMX") && strcmp(getenv("MHA_AMX"), "0") == 0 ? " (MHA_AMX=0)" : "");
    const char *env = getenv("MHA_ISA");
    if (env && strcmp(env, mha_isa_name(mha_isa_active())) != 0)
        printf("note: MHA_ISA=%s ignored (unknown or unavailable here)\n", env);
}

static int print_table(void)
{
    int failed = 0;
    printf("\n%-14s %-7s %7s %12s %12s %10s  %s\n", "kernel", "isa", "checks", "max abs err",
           "max rel err", "err/tol", "result");
    for (int k = 0; k < NKERNEL; k++) {
        const int typed = k == KERNEL_ATTN_F16 || k == KERNEL_ATTN_BF16;
        const stat_cell *c = &stats_ref[k];
        if (c->checks) {
            const int ok = c->ratio <= 1.0;
            failed |= !ok;
            printf("%-14s %-7s %7ld %12.3g %12.3g %10.3f  %s (scalar vs float64, tol %g%s)\n",
                   kernel_names[k], "scalar", c->checks, c->abs_err, c->rel_err, c->ratio,
                   ok ? "ok" : "FAIL", TOL_REF, typed ? " + half an ulp of the type" : "");
        }
        for (int isa = MHA_ISA_SCALAR + 1; isa < MHA_ISA_COUNT; isa++) {
            c = &stats[k][isa];
            if (!c->checks)
                continue;
            const int ok = c->ratio <= 1.0;
            failed |= !ok;
            printf("%-14s %-7s %7ld %12.3g %12.3g %10.3f  %s (%s)\n", kernel_names[k],
                   mha_isa_name((mha_isa)isa), c->checks, c->abs_err, c->rel_err,
                   k == KERNEL_SPLIT ? (c->abs_err == 0 ? 0.0 : INFINITY) : c->ratio,
                   ok ? "ok" : "FAIL",
                   k == KERNEL_SPLIT ? "vs scalar, tol exact"
                   : typed           ? "vs float64, tol 2e-05 + half an ulp of the type"
                                     : "vs scalar, tol 1e-05");
        }
    }
    return failed;
}

int main(int argc, char **argv)
{
    const shape bert = {8, 128, 128, 12, 12, 64, 768};
    const shape sweep[] = {
        {1, 1, 1, 1, 1, 8, 8},        {2, 5, 5, 3, 3, 20, 60},     {1, 7, 7, 4, 2, 80, 100},
        {3, 13, 13, 2, 1, 64, 33},    {1, 33, 33, 5, 5, 128, 640}, {2, 31, 31, 12, 12, 64, 768},
        {1, 65, 65, 8, 2, 20, 130},   {1, 70, 70, 2, 2, 128, 1500}, {1, 300, 300, 4, 4, 64, 256},
    };
    shape one;
    const shape *shapes = sweep;
    size_t nshapes = sizeof sweep / sizeof *sweep;
    int report = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--report") == 0) {
            report = 1;
            shapes = &bert;
            nshapes = 1;
        } else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc
                   && sscanf(argv[++i], "%d,%d,%d,%d,%d,%d,%d", &one.B, &one.Sq, &one.Skv, &one.H,
                             &one.Hkv, &one.dh, &one.E) == 7) {
            shapes = &one;
            nshapes = 1;
        } else {
            fprintf(stderr, "usage: %s [--report] [--shape B,Sq,Skv,H,Hkv,dh,E]\n", argv[0]);
            return 2;
        }
    }
    const mha_isa start = mha_isa_active();
    print_cpu();
    for (size_t i = 0; i < nshapes; i++) {
        const shape *s = &shapes[i];
        if (s->B <= 0 || s->Sq <= 0 || s->Skv <= 0 || s->H <= 0 || s->Hkv <= 0 || s->dh <= 0
            || s->E <= 0 || s->H % s->Hkv) {
            fprintf(stderr, "mha-validate: invalid shape\n");
            return 2;
        }
        printf("validating B=%d Sq=%d Skv=%d heads=%d kv_heads=%d head_dim=%d d_model=%d\n", s->B,
               s->Sq, s->Skv, s->H, s->Hkv, s->dh, s->E);
        fflush(stdout);
        validate_shape(s, (int64_t)s->B * s->Sq * s->Sq * s->E <= (int64_t)1 << 28);
    }
    const decode_shape decodes[] = {
        {1, 8, 2, 128, 128, 3000, 1}, {2, 4, 4, 64, 64, 700, 1}, {2, 8, 2, 64, 48, 900, 5},
        {1, 6, 3, 40, 72, 300, 17},
    };
    printf("validating mha_attention_cached on %zu decode and prefill shapes\n",
           sizeof decodes / sizeof *decodes);
    for (int t = 0; t < MHA_DTYPE_COUNT; t++)
        for (size_t i = 0; i < sizeof decodes / sizeof *decodes; i++)
            validate_cached(&decodes[i], (mha_dtype)t);
    const int failed = print_table();
    if (report) {
        time_layer(&bert);
        for (int t = 0; t < MHA_DTYPE_COUNT; t++)
            time_decode(&(decode_shape){1, 32, 8, 128, 128, 4096, 1}, (mha_dtype)t);
    }
    mha_isa_force(start);
    printf("\n%s\n", failed ? "FAILED: errors beyond tolerance" : "all ISAs within tolerance");
    return failed;
}
