/* The KV-cache API against the float64 reference: mha_attention_cached over the
 * cache layouts of common.h (K and V apart in [B][Hkv][cap][d] or [B][cap][Hkv][d],
 * the MLA latent cache, padded rows with V strides 0), lens 0, lens = capacity,
 * mixed lens per sequence, rows placed before the first key, GQA, dv != dk, every
 * mask kind, both out layouts and lse; split-KV decode over long caches; bitwise
 * determinism over thread counts; mha_kv_append writing exactly its rows;
 * mha_layer_step's prefill + decode against one causal forward pass; every error
 * path with nothing written. Every float of a cache outside rows j < lens is a
 * NaN: nothing hidden may reach a result. The active ISA is checked as the other
 * suites do: scalar against float64 within TOL_REF, the ISA against scalar within
 * TOL_ISA. MHA_TEST_QUICK=1 (used under valgrind) drops the largest shapes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

static mha_isa isa;
static int quick;

static void use(mha_isa i)
{
    assert_int_equal(mha_isa_force(i), MHA_OK);
}

/* One cached attention call: lens has `batch` entries. */
typedef struct shape {
    int32_t batch, heads, kv_heads, dk, dv, capacity, seq_q;
    int32_t lens[4];
} shape;

static int64_t shape_out(const shape *s)
{
    return (int64_t)s->batch * s->heads * s->seq_q * s->dv;
}

static int64_t shape_rows(const shape *s)
{
    return (int64_t)s->batch * s->heads * s->seq_q;
}

/* Quick mode (valgrind) keeps the shapes of at most `flops` multiply-adds per call. */
static int too_big(const shape *s, double flops)
{
    return quick && (double)shape_rows(s) * s->capacity * (s->dk + s->dv) > flops;
}

static void shape_label(const shape *s, char *buf, size_t n)
{
    int len = snprintf(buf, n, "B=%d H=%d Hkv=%d dk=%d dv=%d cap=%d Sq=%d lens=", s->batch,
                       s->heads, s->kv_heads, s->dk, s->dv, s->capacity, s->seq_q);
    for (int32_t b = 0; b < s->batch && len > 0 && (size_t)len < n; b++)
        len += snprintf(buf + len, n - (size_t)len, "%s%d", b ? "," : "", s->lens[b]);
}

/* The masks of a sweep, indexed as named. Per-row lengths and the bias (element
   (b,h,i,j), j < capacity, -inf every 7th) are drawn for the shape. */
enum { M_NONE, M_CAUSAL, M_QKL, M_BIAS, M_BIAS_BERT, M_ALL, M_COUNT };
typedef struct mask_set {
    int32_t *qkl;
    float *bias;
    mha_mask m[M_COUNT];
} mask_set;

static void mask_set_init(mask_set *ms, rng *r, const shape *s)
{
    const int32_t cap = s->capacity;
    ms->qkl = malloc(sizeof(int32_t) * (size_t)(s->batch * s->seq_q));
    for (int32_t i = 0; i < s->batch * s->seq_q; i++)
        ms->qkl[i] = (i * 13 + 5) % (cap + 1);
    const int64_t n = shape_rows(s) * cap, sh = (int64_t)s->seq_q * cap;
    ms->bias = rand_floats(r, n, -2, 2);
    for (int64_t i = 3; i < n; i += 7)
        ms->bias[i] = -INFINITY;
    const mha_mask m[M_COUNT] = {
        [M_NONE] = {0},
        [M_CAUSAL] = {.causal = 1},
        [M_QKL] = {.query_key_lens = ms->qkl},
        [M_BIAS] = {.bias = ms->bias, .bias_stride_b = sh * s->heads, .bias_stride_h = sh,
                    .bias_stride_q = cap},
        [M_BIAS_BERT] = {.bias = ms->bias, .bias_stride_b = cap}, /* [B,1,1,cap] */
        [M_ALL] = {.query_key_lens = ms->qkl, .causal = 1, .bias = ms->bias,
                   .bias_stride_b = sh * s->heads, .bias_stride_h = sh, .bias_stride_q = cap},
    };
    memcpy(ms->m, m, sizeof m);
}

static void mask_set_free(mask_set *ms)
{
    free(ms->qkl);
    free(ms->bias);
}

static const float *out_row_f(const float *out, const shape *s, mha_layout layout, int32_t b,
                              int32_t h, int32_t i)
{
    return layout == MHA_LAYOUT_BHSD
               ? out + (((int64_t)b * s->heads + h) * s->seq_q + i) * s->dv
               : out + (((int64_t)b * s->seq_q + i) * s->heads + h) * s->dv;
}

/* One call on the active ISA and on scalar, lse included: scalar against float64
   within TOL_REF, the ISA against scalar within TOL_ISA, exact zeros where no key
   is visible, and the same output bits when lse is NULL. mask NULL: no mask. */
static void check_cached(const shape *s, const mha_kv_cache *c, const float *q,
                         const mha_mask *mask, mha_layout layout, const char *what)
{
    const int64_t no = shape_out(s), nl = shape_rows(s);
    float *got = malloc(sizeof(float) * (size_t)no), *plain = malloc(sizeof(float) * (size_t)no);
    float *want = malloc(sizeof(float) * (size_t)no);
    float *got_lse = malloc(sizeof(float) * (size_t)nl);
    float *want_lse = malloc(sizeof(float) * (size_t)nl);
    double *ref = malloc(sizeof(double) * (size_t)no);
    double *ref_lse = malloc(sizeof(double) * (size_t)nl);
    const float scale = 1.0f / sqrtf((float)s->dk);
    mha_status st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, got,
                                         layout, got_lse);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    assert_int_equal(mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, plain,
                                          layout, NULL), MHA_OK);
    if (memcmp(got, plain, sizeof(float) * (size_t)no) != 0)
        fail_msg("%s: output differs when lse is NULL", what);
    if (isa != MHA_ISA_SCALAR) {
        use(MHA_ISA_SCALAR);
        st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, want, layout,
                                  want_lse);
        use(isa);
        assert_int_equal(st, MHA_OK);
    } else {
        memcpy(want, got, sizeof(float) * (size_t)no);
        memcpy(want_lse, got_lse, sizeof(float) * (size_t)nl);
    }
    ref_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, ref, layout, ref_lse);
    const double r_out = tol_ratio(want, ref, no, TOL_REF);
    const double r_lse = tol_ratio(want_lse, ref_lse, nl, TOL_REF);
    const double i_out = tol_ratio_f(got, want, no, TOL_ISA);
    const double i_lse = tol_ratio_f(got_lse, want_lse, nl, TOL_ISA);
    if (r_out > 1.0 || r_lse > 1.0)
        fail_msg("%s: scalar vs float64: out %.3g, lse %.3g x tolerance", what, r_out, r_lse);
    if (i_out > 1.0 || i_lse > 1.0)
        fail_msg("%s: %s vs scalar: out %.3g, lse %.3g x tolerance", what, mha_isa_name(isa),
                 i_out, i_lse);
    for (int32_t b = 0; b < s->batch; b++)
        for (int32_t h = 0; h < s->heads; h++)
            for (int32_t i = 0; i < s->seq_q; i++) {
                if (ref_lse[((int64_t)b * s->heads + h) * s->seq_q + i] != -INFINITY)
                    continue;
                const float *o = out_row_f(got, s, layout, b, h, i);
                for (int32_t e = 0; e < s->dv; e++)
                    if (o[e] != 0.0f)
                        fail_msg("%s: b=%d h=%d row %d sees no key but out[%d] = %g", what, b, h,
                                 i, e, (double)o[e]);
            }
    free(got);
    free(plain);
    free(want);
    free(got_lse);
    free(want_lse);
    free(ref);
    free(ref_lse);
}

/* Every cache kind and mask of the set for one shape; the out layout alternates. */
static void sweep_shape(rng *r, const shape *s, const int *masks, int n_masks)
{
    float *q = rand_floats(r, shape_rows(s) * s->dk, -1, 1);
    mask_set ms;
    mask_set_init(&ms, r, s);
    char label[160], what[256];
    shape_label(s, label, sizeof label);
    for (int kind = 0; kind < CACHE_KINDS; kind++) {
        test_cache tc;
        if (!test_cache_init(&tc, (cache_kind)kind, s->batch, s->kv_heads, s->dk,
                             s->dv == s->dk ? 0 : s->dv, s->capacity))
            continue;
        test_cache_fill(&tc, r, s->lens);
        for (int mi = 0; mi < n_masks; mi++) {
            const int m = masks[mi];
            const mha_layout layout = (mha_layout)((kind + m) % 2);
            snprintf(what, sizeof what, "%s cache %s mask %d layout %d", label,
                     cache_kind_name((cache_kind)kind), m, (int)layout);
            /* no mask: a NULL pointer for half the kinds, a zeroed mha_mask for the rest */
            check_cached(s, &tc.c, q, m == M_NONE && kind % 2 ? NULL : &ms.m[m], layout, what);
        }
        test_cache_free(&tc);
    }
    mask_set_free(&ms);
    free(q);
}

static const int all_masks[] = {M_NONE, M_CAUSAL, M_QKL, M_BIAS, M_BIAS_BERT, M_ALL};
#define N_ALL_MASKS ((int)(sizeof all_masks / sizeof *all_masks))

/* Tails of the kernels' tiles (72 keys, 16/48/96 rows, 16/64 value columns), seq_q
   1, 3, 17, 100, GQA groups of 1, 4, 8, dk/dv in {1, 7, 64, 65, 128} and unequal both
   ways; lens 0, lens = capacity, lens < seq_q (causal rows before key 0). */
static const shape sweep[] = {
    {1, 1, 1, 1, 1, 8, 1, {5}},
    {3, 4, 1, 64, 64, 40, 1, {0, 17, 40}},
    {2, 8, 1, 128, 128, 80, 3, {2, 73}},
    {2, 2, 2, 7, 7, 33, 17, {33, 9}},
    {1, 4, 4, 65, 65, 150, 100, {145}},
    {2, 4, 2, 192, 128, 50, 3, {1, 47}},
    {2, 4, 1, 64, 96, 72, 17, {20, 72}},
    {2, 8, 1, 20, 20, 100, 17, {100, 0}},
    {1, 8, 8, 128, 64, 100, 100, {100}},
    {2, 4, 2, 1, 7, 17, 3, {16, 17}},
    {4, 4, 1, 80, 65, 200, 1, {1, 71, 144, 200}},
    {3, 1, 1, 7, 1, 20, 1, {0, 0, 20}},
    {2, 4, 2, 16, 16, 8, 17, {8, 3}}, /* seq_q > capacity */
};

static void cached_vs_float64(void **state)
{
    (void)state;
    rng r = {101};
    for (size_t i = 0; i < sizeof sweep / sizeof *sweep; i++)
        if (!too_big(&sweep[i], 1e6))
            sweep_shape(&r, &sweep[i], all_masks, N_ALL_MASKS);
}

/* Long caches with few (b, kv head) pairs: the library cuts keys into chunks and
   merges their partial results (decode, and a run of 100 rows); M_ALL leaves few
   keys to each row, so most chunks of a row see none. */
static const shape split_kv[] = {
    {1, 8, 1, 128, 128, 20000, 1, {20000}},
    {1, 4, 2, 64, 64, 4100, 1, {4099}},
    {1, 16, 2, 192, 128, 6000, 1, {5003}},
    {1, 1, 1, 65, 65, 2000, 1, {2000}},
    {1, 2, 1, 64, 96, 3000, 3, {2999}},
    {1, 32, 2, 128, 128, 9000, 1, {8191}},
    {2, 4, 1, 64, 64, 8000, 1, {7000, 3}},
    {1, 1, 1, 64, 32, 3000, 100, {2900}},
    {1, 8, 1, 32, 32, 2000, 20, {1990}}, /* blocks of several heads' rows */
};

static void split_kv_vs_float64(void **state)
{
    (void)state;
    rng r = {102};
    const int masks[] = {M_NONE, M_CAUSAL, M_BIAS, M_ALL};
    for (size_t i = 0; i < sizeof split_kv / sizeof *split_kv; i++)
        if (!too_big(&split_kv[i], 2.5e6))
            sweep_shape(&r, &split_kv[i], masks, 4);
}

static const int thread_counts[] = {1, 2, 3, 7};
#define NT (sizeof thread_counts / sizeof *thread_counts)

/* Decode shapes, split-KV ones included: out and lse bitwise equal on 1, 2, 3, 7 threads. */
static void cached_threads_bitwise(void **state)
{
    (void)state;
    rng r = {103};
    const shape shapes[] = {
        {2, 8, 2, 64, 64, 300, 1, {300, 123}},  {1, 8, 1, 128, 128, 20000, 1, {19999}},
        {1, 4, 2, 192, 128, 5000, 1, {4096}},   {1, 4, 1, 64, 64, 3000, 3, {3000}},
        {1, 2, 1, 64, 64, 2000, 1, {1}},        {3, 4, 4, 65, 33, 700, 1, {700, 0, 512}},
        {1, 1, 1, 64, 32, 3000, 100, {2900}},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        if (too_big(s, 2.5e6))
            continue;
        const int64_t no = shape_out(s), nl = shape_rows(s);
        float *q = rand_floats(&r, nl * s->dk, -1, 1);
        mask_set ms;
        mask_set_init(&ms, &r, s);
        test_cache tc;
        assert_true(test_cache_init(&tc, (cache_kind)(si % CACHE_KINDS), s->batch, s->kv_heads,
                                    s->dk, s->dv, s->capacity));
        test_cache_fill(&tc, &r, s->lens);
        float *o[2] = {malloc(sizeof(float) * (size_t)no), malloc(sizeof(float) * (size_t)no)};
        float *l[2] = {malloc(sizeof(float) * (size_t)nl), malloc(sizeof(float) * (size_t)nl)};
        const mha_mask *mask = si % 2 ? &ms.m[M_ALL] : NULL;
        const mha_layout layout = (mha_layout)(si / 2 % 2);
        for (size_t t = 0; t < NT; t++) {
            set_threads(thread_counts[t]);
            const int dst = t > 0;
            assert_int_equal(mha_attention_cached(&tc.c, s->lens, q, s->heads, s->seq_q, 0.1f,
                                                  mask, o[dst], layout, l[dst]), MHA_OK);
            if (t > 0 && (memcmp(o[0], o[1], sizeof(float) * (size_t)no) != 0
                          || memcmp(l[0], l[1], sizeof(float) * (size_t)nl) != 0))
                fail_msg("shape %zu: %d threads differ from 1", si, thread_counts[t]);
        }
        set_threads(2);
        for (int i = 0; i < 2; i++) {
            free(o[i]);
            free(l[i]);
        }
        test_cache_free(&tc);
        mask_set_free(&ms);
        free(q);
    }
}

/* Where p points into the cache, the same float of the images of its allocations. */
static float *image_at(const test_cache *tc, float *img_k, float *img_v, const float *p)
{
    if (p >= tc->kbuf && p < tc->kbuf + tc->kn)
        return img_k + (p - tc->kbuf);
    return img_v + (p - tc->vbuf);
}

static float *copy_floats(const float *src, size_t n)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, src, sizeof(float) * n);
    return p;
}

/* mha_kv_append writes rows lens[b] .. lens[b] + seq_new - 1 and nothing else (guards,
   padding, other rows, lens), K rows first then V rows (the latent cache: v_new wins
   over the first dv floats of each K row). */
static void kv_append_rows(void **state)
{
    (void)state;
    rng r = {104};
    const shape cases[] = {
        /* seq_q is seq_new */
        {3, 0, 2, 8, 8, 10, 3, {0, 3, 7}},   {2, 0, 3, 7, 5, 6, 1, {5, 0}},
        {1, 0, 1, 64, 128, 9, 9, {0}},        {2, 0, 2, 192, 128, 40, 17, {23, 1}},
        {4, 0, 1, 1, 1, 4, 2, {0, 1, 2, 2}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int kind = 0; kind < CACHE_KINDS; kind++) {
            const shape *s = &cases[ci];
            test_cache tc;
            if (!test_cache_init(&tc, (cache_kind)kind, s->batch, s->kv_heads, s->dk, s->dv,
                                 s->capacity))
                continue;
            test_cache_fill(&tc, &r, s->lens);
            const int64_t rows = (int64_t)s->batch * s->kv_heads * s->seq_q;
            float *k_new = rand_floats(&r, rows * s->dk, -1, 1);
            float *v_new = rand_floats(&r, rows * s->dv, -1, 1);
            float *img_k = copy_floats(tc.kbuf, tc.kn);
            float *img_v = tc.vbuf == tc.kbuf ? img_k : copy_floats(tc.vbuf, tc.vn);
            int32_t lens[4];
            memcpy(lens, s->lens, sizeof lens);
            for (int pass = 0; pass < 2; pass++) /* K rows, then V rows */
                for (int32_t b = 0; b < s->batch; b++)
                    for (int32_t g = 0; g < s->kv_heads; g++)
                        for (int32_t t = 0; t < s->seq_q; t++) {
                            const int64_t row = ((int64_t)b * s->kv_heads + g) * s->seq_q + t;
                            const int32_t j = lens[b] + t, n = pass ? s->dv : s->dk;
                            float *dst = image_at(&tc, img_k, img_v,
                                                  pass ? cache_v_row(&tc.c, b, g, j)
                                                       : cache_k_row(&tc.c, b, g, j));
                            memcpy(dst, (pass ? v_new : k_new) + row * n,
                                   sizeof(float) * (size_t)n);
                        }
            assert_int_equal(mha_kv_append(&tc.c, lens, k_new, v_new, s->seq_q), MHA_OK);
            if (memcmp(tc.kbuf, img_k, sizeof(float) * tc.kn) != 0
                || (img_v != img_k && memcmp(tc.vbuf, img_v, sizeof(float) * tc.vn) != 0))
                fail_msg("append case %zu cache %s: the cache is not the expected image", ci,
                         cache_kind_name((cache_kind)kind));
            assert_memory_equal(lens, s->lens, sizeof lens);
            free(k_new);
            free(v_new);
            if (img_v != img_k)
                free(img_v);
            free(img_k);
            test_cache_free(&tc);
        }
}

/* Tolerance of the active ISA against float64, as in test_reference. */
static double tol(void)
{
    return isa == MHA_ISA_SCALAR ? TOL_REF : TOL_REF + TOL_ISA;
}

/* Copies rows [from, from + n) of sequence b of x [..][seq][width] to dst [n][width]. */
static void take_rows(float *dst, const float *x, int32_t b, int32_t seq, int32_t from, int32_t n,
                      int32_t width)
{
    memcpy(dst, x + ((int64_t)b * seq + from) * width, sizeof(float) * (size_t)n * width);
}

/* A decoder layer run step by step: prefill of pre[b] tokens (one call for the batch
   when every pre[b] is equal, else one call per sequence on a batch-1 view of the
   cache), then 20 decode steps of 1 token for the whole batch, causal. Each output
   row matches one causal mha_layer_forward over the sequence (TOL_ISA) and float64
   (the suite's tolerance); lens advance by seq_q per call; a second cache driven
   with a caller workspace gets the same bits; the cache holds the projections of
   mha_qkv_project in rows j < lens and nothing outside them. */
static void layer_step_decode(void **state)
{
    (void)state;
    rng r = {105};
    enum { STEPS = 20 };
    const struct {
        int32_t heads, kv_heads, dh, dv, E, out_dim, bias, B, pre[3];
        cache_kind kind;
    } cases[] = {
        {4, 2, 16, 0, 48, 40, 1, 2, {7, 7}, CACHE_BHSD},
        {8, 1, 24, 40, 64, 0, 0, 2, {7, 7}, CACHE_BSHD},
        {4, 4, 64, 32, 96, 96, 1, 3, {7, 1, 12}, CACHE_PADDED},
        {6, 2, 65, 7, 33, 17, 1, 1, {7}, CACHE_BHSD},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int32_t B = cases[ci].B, E = cases[ci].E, H = cases[ci].heads;
        test_layer t;
        test_layer_init_v(&t, &r, H, cases[ci].kv_heads, cases[ci].dh, cases[ci].dv, E, 0, 0,
                          cases[ci].out_dim, cases[ci].bias);
        const int32_t Hkv = t.kv_heads, dh = cases[ci].dh, dv = t.dv;
        const int32_t W = cases[ci].out_dim ? cases[ci].out_dim : H * dv;
        int32_t S[3], S_max = 0, same = 1;
        for (int32_t b = 0; b < B; b++) {
            S[b] = cases[ci].pre[b] + STEPS;
            S_max = S[b] > S_max ? S[b] : S_max;
            same &= cases[ci].pre[b] == cases[ci].pre[0];
        }
        /* x [B][S_max][E]; sequence b uses its first S[b] rows. */
        float *x = rand_floats(&r, (int64_t)B * S_max * E, -1, 1);
        float *want = malloc(sizeof(float) * (size_t)B * S_max * W);
        double *ref = malloc(sizeof(double) * (size_t)B * S_max * W);
        const mha_mask causal = {.causal = 1};
        for (int32_t b = 0; b < B; b++) {
            const float *xb = x + (int64_t)b * S_max * E;
            assert_int_equal(mha_layer_forward(t.layer, xb, xb, xb, 1, S[b], S[b], &causal,
                                               want + (int64_t)b * S_max * W, NULL, 0), MHA_OK);
            ref_layer(&t.desc, xb, xb, xb, 1, S[b], S[b], &causal, ref + (int64_t)b * S_max * W);
        }
        test_cache tc[2]; /* [0]: library workspace, [1]: caller workspace */
        int32_t lens[2][3] = {{0}};
        for (int i = 0; i < 2; i++)
            assert_true(test_cache_init(&tc[i], cases[ci].kind, B, Hkv, dh, cases[ci].dv,
                                        S_max + 3));
        const int32_t max_pre = S_max - STEPS; /* the longest call */
        float *xs = malloc(sizeof(float) * (size_t)B * max_pre * E);
        float *o[2] = {malloc(sizeof(float) * (size_t)B * max_pre * W),
                       malloc(sizeof(float) * (size_t)B * max_pre * W)};
        char what[128];
        /* calls: -1 the prefill (per sequence when pre differs), then steps 0..STEPS-1 */
        for (int call = -1; call < STEPS; call++)
            for (int32_t part = 0; part < (call < 0 && !same ? B : 1); part++) {
                const int per_seq = call < 0 && !same;
                const int32_t nb = per_seq ? 1 : B, b0 = per_seq ? part : 0;
                const int32_t sq = call < 0 ? cases[ci].pre[b0] : 1;
                for (int32_t b = b0; b < b0 + nb; b++)
                    take_rows(xs + (int64_t)(b - b0) * sq * E, x, b, S_max,
                              call < 0 ? 0 : cases[ci].pre[b] + call, sq, E);
                for (int i = 0; i < 2; i++) {
                    mha_kv_cache view = tc[i].c; /* sequences b0 .. b0 + nb - 1 */
                    view.batch = nb;
                    view.k = cache_k_row(&tc[i].c, b0, 0, 0);
                    view.v = cache_v_row(&tc[i].c, b0, 0, 0);
                    const size_t ws_bytes = i ? mha_layer_step_workspace_size(t.layer, nb, sq) : 0;
                    void *ws = i ? malloc(ws_bytes) : NULL;
                    if (i)
                        assert_true(ws_bytes > 0);
                    const mha_status st = mha_layer_step(t.layer, xs, sq, &view, lens[i] + b0,
                                                         &causal, o[i], ws, ws_bytes);
                    free(ws);
                    if (st != MHA_OK)
                        fail_msg("step case %zu call %d: %s", ci, call, mha_status_str(st));
                }
                snprintf(what, sizeof what, "step case %zu call %d part %d", ci, call, part);
                if (memcmp(o[0], o[1], sizeof(float) * (size_t)nb * sq * W) != 0)
                    fail_msg("%s: a caller workspace changes the output", what);
                for (int32_t b = b0; b < b0 + nb; b++) {
                    const int32_t row0 = call < 0 ? 0 : cases[ci].pre[b] + call;
                    const int64_t at = ((int64_t)b * S_max + row0) * W, n = (int64_t)sq * W;
                    const float *got = o[0] + (int64_t)(b - b0) * sq * W;
                    const double rf = tol_ratio(got, ref + at, n, tol());
                    const double rw = tol_ratio_f(got, want + at, n, TOL_ISA);
                    if (rf > 1.0 || rw > 1.0)
                        fail_msg("%s b=%d: vs float64 %.3g, vs forward %.3g x tolerance", what,
                                 b, rf, rw);
                    if (lens[0][b] != row0 + sq || lens[1][b] != row0 + sq)
                        fail_msg("%s b=%d: lens %d, want %d", what, b, lens[0][b], row0 + sq);
                }
            }
        assert_memory_equal(tc[0].kbuf, tc[1].kbuf, sizeof(float) * tc[0].kn);
        assert_memory_equal(tc[0].vbuf, tc[1].vbuf, sizeof(float) * tc[0].vn);

        /* Rows j < lens hold the projections; every other float is as filled. */
        float *img_k = malloc(sizeof(float) * tc[0].kn), *img_v = malloc(sizeof(float) * tc[0].vn);
        memset(img_k, CACHE_FILL, sizeof(float) * tc[0].kn);
        memset(img_v, CACHE_FILL, sizeof(float) * tc[0].vn);
        for (int32_t b = 0; b < B; b++) {
            const float *xb = x + (int64_t)b * S_max * E;
            float *pq = malloc(sizeof(float) * (size_t)H * S[b] * dh);
            float *pk = malloc(sizeof(float) * (size_t)Hkv * S[b] * dh);
            float *pv = malloc(sizeof(float) * (size_t)Hkv * S[b] * dv);
            assert_int_equal(mha_qkv_project(t.layer, xb, xb, xb, 1, S[b], S[b], pq, pk, pv),
                             MHA_OK);
            for (int32_t g = 0; g < Hkv; g++)
                for (int32_t j = 0; j < S[b]; j++) {
                    const float *kr = cache_k_row(&tc[0].c, b, g, j);
                    const float *vr = cache_v_row(&tc[0].c, b, g, j);
                    if (tol_ratio_f(kr, pk + ((int64_t)g * S[b] + j) * dh, dh, TOL_ISA) > 1.0
                        || tol_ratio_f(vr, pv + ((int64_t)g * S[b] + j) * dv, dv, TOL_ISA) > 1.0)
                        fail_msg("step case %zu: cache row b=%d g=%d j=%d is not the projection",
                                 ci, b, g, j);
                    memcpy(image_at(&tc[0], img_k, img_v, kr), kr, sizeof(float) * (size_t)dh);
                    memcpy(image_at(&tc[0], img_k, img_v, vr), vr, sizeof(float) * (size_t)dv);
                }
            free(pq);
            free(pk);
            free(pv);
        }
        if (memcmp(img_k, tc[0].kbuf, sizeof(float) * tc[0].kn) != 0
            || memcmp(img_v, tc[0].vbuf, sizeof(float) * tc[0].vn) != 0)
            fail_msg("step case %zu: the cache changed outside rows j < lens", ci);
        free(img_k);
        free(img_v);
        for (int i = 0; i < 2; i++) {
            free(o[i]);
            test_cache_free(&tc[i]);
        }
        free(xs);
        free(x);
        free(want);
        free(ref);
        test_layer_free(&t);
    }
}

/* The reference's own pieces on cases worked by hand or by equivalence, so that the
   sweeps rest on it: a window is a -inf bias below the band, ALiBi an additive bias
   (slopes and offsets exact in float), softcap and a sink on two keys, and the cached
   reference over a dense cache equals ref_attention (causal rows line up). */
static void reference_self_check(void **state)
{
    (void)state;
    rng r = {106};
    const mha_attn_dims d = {2, 4, 2, 5, 9, 8, 6, MHA_F32};
    const int64_t nq = 2 * 4 * 5 * 8, nk = 2 * 2 * 9 * 8, nv = 2 * 2 * 9 * 6, no = 2 * 4 * 5 * 6;
    float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nk, -1, 1);
    float *v = rand_floats(&r, nv, -1, 1);
    float *bias = filled_floats(2 * 4 * 5 * 9, 0.0f);
    double *a = malloc(sizeof(double) * no), *b = malloc(sizeof(double) * no);
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 1.0f};
    for (int32_t bb = 0; bb < 2; bb++)
        for (int32_t h = 0; h < 4; h++)
            for (int32_t i = 0; i < 5; i++)
                for (int32_t j = 0; j < 9; j++) {
                    const int32_t p = i + 9 - 5;
                    bias[((bb * 4 + h) * 5 + i) * 9 + j] = j <= p - 3 ? -INFINITY
                                                                    : slopes[h] * (float)(j - p);
                }
    const mha_mask modified = {.causal = 1, .window = 3, .alibi_slopes = slopes};
    const mha_mask biased = {.causal = 1, .bias = bias, .bias_stride_b = 4 * 5 * 9,
                             .bias_stride_h = 5 * 9, .bias_stride_q = 9};
    ref_attention(&d, q, k, v, 0.3, &modified, a, MHA_LAYOUT_BSHD);
    ref_attention(&d, q, k, v, 0.3, &biased, b, MHA_LAYOUT_BSHD);
    assert_memory_equal(a, b, sizeof(double) * no);

    /* Two keys, dh 1, q 1, k {0, 2}, softcap 1: scores 0 and tanh 2; a sink of
       score ln 2 adds 2 to the denominator exp(0) + exp(tanh 2), not to lse. */
    const mha_attn_dims two = {1, 1, 1, 1, 2, 1, 1, MHA_F32};
    const float q1 = 1.0f, k2[2] = {0.0f, 2.0f}, v2[2] = {1.0f, 3.0f}, sink = logf(2.0f);
    const mha_mask capped = {.softcap = 1.0f}, sunk = {.softcap = 1.0f, .sinks = &sink};
    const double e1 = exp(tanh(2.0)), want = (1.0 + 3.0 * e1) / (1.0 + e1);
    double o;
    ref_attention(&two, &q1, k2, v2, 1.0, &capped, &o, MHA_LAYOUT_BHSD);
    assert_true(fabs(o - want) < 1e-12);
    ref_attention(&two, &q1, k2, v2, 1.0, &sunk, &o, MHA_LAYOUT_BHSD);
    assert_true(fabs(o - (1.0 + 3.0 * e1) / (1.0 + e1 + 2.0)) < 1e-7);
    /* The cached reference: lse excludes the sink; a row with no key gets 0, -inf. */
    const mha_kv_cache c2 = {.k = (float *)k2, .v = (float *)v2, .batch = 1, .kv_heads = 1,
                             .head_dim = 1, .capacity = 2, .stride_s = 1};
    const int32_t lens2 = 2, lens0 = 0;
    double lse;
    ref_attention_cached(&c2, &lens2, &q1, 1, 1, 1.0, &sunk, &o, MHA_LAYOUT_BHSD, &lse);
    assert_true(fabs(lse - log(1.0 + e1)) < 1e-12);
    ref_attention_cached(&c2, &lens0, &q1, 1, 1, 1.0, &sunk, &o, MHA_LAYOUT_BHSD, &lse);
    assert_true(o == 0.0 && lse == -INFINITY);

    /* A dense cache holding k and v: the cached reference equals ref_attention. */
    const mha_kv_cache dense = {.k = k, .v = v, .batch = 2, .kv_heads = 2, .head_dim = 8,
                                .capacity = 9, .stride_b = 2 * 9 * 8, .stride_h = 9 * 8,
                                .stride_s = 8, .v_head_dim = 6, .v_stride_b = 2 * 9 * 6,
                                .v_stride_h = 9 * 6, .v_stride_s = 6};
    const int32_t full[2] = {9, 9};
    ref_attention_cached(&dense, full, q, 4, 5, 0.3, &biased, a, MHA_LAYOUT_BHSD, NULL);
    ref_attention(&d, q, k, v, 0.3, &biased, b, MHA_LAYOUT_BHSD);
    assert_memory_equal(a, b, sizeof(double) * no);
    free(q);
    free(k);
    free(v);
    free(bias);
    free(a);
    free(b);
}

/* ---- error paths: the documented status, and cache, lens, out, lse untouched ---- */

#define CODE(s) (1u << (s))
#define CANARY 0x5a
enum { EB = 2, EH = 4, EHKV = 2, ESQ = 2, EDK = 8, EDV = 6, ECAP = 5, EE = 16, EOUT = 12 };

/* Buffers every error call may reach, with their bytes before the call. */
typedef struct snapshot {
    test_cache tc;
    float *k, *v; /* copies of the cache's allocations */
    int32_t lens[EB], lens0[EB];
    float out[EB * ESQ * EH * EDV * 2], lse[EB * EH * ESQ];
} snapshot;

static void snapshot_init(snapshot *s, rng *r, const int32_t lens[EB])
{
    assert_true(test_cache_init(&s->tc, CACHE_BHSD, EB, EHKV, EDK, EDV, ECAP));
    test_cache_fill(&s->tc, r, lens);
    s->k = copy_floats(s->tc.kbuf, s->tc.kn);
    s->v = copy_floats(s->tc.vbuf, s->tc.vn);
    memcpy(s->lens, lens, sizeof s->lens);
    memcpy(s->lens0, lens, sizeof s->lens0);
    memset(s->out, CANARY, sizeof s->out);
    memset(s->lse, CANARY, sizeof s->lse);
}

/* Fails unless st is one of the codes in want and nothing changed. */
static void expect_refused(const snapshot *s, mha_status st, unsigned want, const char *what,
                           size_t i)
{
    if (st >= 32 || !(CODE(st) & want))
        fail_msg("%s case %zu: got %s", what, i, mha_status_str(st));
    if (memcmp(s->tc.kbuf, s->k, sizeof(float) * s->tc.kn) != 0
        || memcmp(s->tc.vbuf, s->v, sizeof(float) * s->tc.vn) != 0)
        fail_msg("%s case %zu: the cache changed", what, i);
    if (memcmp(s->lens, s->lens0, sizeof s->lens) != 0)
        fail_msg("%s case %zu: lens changed", what, i);
    for (size_t j = 0; j < sizeof s->out; j++)
        if (((const unsigned char *)s->out)[j] != CANARY)
            fail_msg("%s case %zu: out written", what, i);
    for (size_t j = 0; j < sizeof s->lse; j++)
        if (((const unsigned char *)s->lse)[j] != CANARY)
            fail_msg("%s case %zu: lse written", what, i);
}

static void snapshot_free(snapshot *s)
{
    free(s->k);
    free(s->v);
    test_cache_free(&s->tc);
}

/* Cache descriptors broken in one field each, with the status each calls for. The
   header asks for strides >= 0 without naming the status: ARG ("a value out of
   range") or SHAPE is accepted there. A stride that overflows a row's offset is a
   size that overflows: SHAPE. */
typedef struct bad_cache {
    mha_kv_cache c;
    unsigned want;
} bad_cache;

static int bad_caches(const mha_kv_cache *good, bad_cache *out)
{
    const unsigned shape = CODE(MHA_ERR_SHAPE), arg = CODE(MHA_ERR_ARG), stride = arg | shape;
    int n = 0;
    for (int i = 0; i < 17; i++)
        out[i].c = *good;
    out[n].c.k = NULL, out[n++].want = arg;
    out[n].c.v = NULL, out[n++].want = arg;
    out[n].c.batch = 0, out[n++].want = shape;
    out[n].c.kv_heads = 0, out[n++].want = shape;
    out[n].c.kv_heads = -2, out[n++].want = shape;
    out[n].c.head_dim = 0, out[n++].want = shape;
    out[n].c.v_head_dim = -1, out[n++].want = shape;
    out[n].c.capacity = -1, out[n++].want = shape;
    out[n].c.stride_b = -1, out[n++].want = stride;
    out[n].c.stride_h = -8, out[n++].want = stride;
    out[n].c.stride_s = -8, out[n++].want = stride;
    out[n].c.v_stride_b = -1, out[n++].want = stride;
    out[n].c.v_stride_h = -1, out[n++].want = stride;
    out[n].c.v_stride_s = -6, out[n++].want = stride;
    out[n].c.stride_s = INT64_MAX / 2, out[n++].want = shape;
    out[n].c.stride_b = INT64_MAX, out[n++].want = shape;
    out[n].c.v_stride_h = INT64_MAX / 3 * 2, out[n++].want = shape;
    return n;
}

static void kv_append_errors(void **state)
{
    (void)state;
    rng r = {107};
    const int32_t good_lens[EB] = {3, 2}; /* + seq_new 2: rows up to 5 = capacity */
    snapshot s;
    snapshot_init(&s, &r, good_lens);
    float *k_new = rand_floats(&r, EB * EHKV * 2 * EDK, -1, 1);
    float *v_new = rand_floats(&r, EB * EHKV * 2 * EDV, -1, 1);
    const unsigned arg = CODE(MHA_ERR_ARG), shape = CODE(MHA_ERR_SHAPE);
    const mha_kv_cache *c = &s.tc.c;
    const struct {
        const mha_kv_cache *c;
        int32_t lens[EB];
        int nul; /* 1: lens NULL, 2: k_new NULL, 3: v_new NULL */
        int32_t seq_new;
        unsigned want;
    } cases[] = {
        {NULL, {3, 2}, 0, 2, arg},  {c, {3, 2}, 1, 2, arg},   {c, {3, 2}, 2, 2, arg},
        {c, {3, 2}, 3, 2, arg},     {c, {-1, 2}, 0, 2, shape}, {c, {4, 2}, 0, 2, shape},
        {c, {3, 6}, 0, 1, shape},   {c, {5, 5}, 0, 1, shape}, {c, {3, 2}, 0, -1, shape},
        {c, {3, 2}, 0, 0, shape},   {c, {0, 0}, 0, ECAP + 1, shape},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(s.lens, cases[i].lens, sizeof s.lens);
        memcpy(s.lens0, cases[i].lens, sizeof s.lens0);
        const mha_status st = mha_kv_append(cases[i].c, cases[i].nul == 1 ? NULL : s.lens,
                                            cases[i].nul == 2 ? NULL : k_new,
                                            cases[i].nul == 3 ? NULL : v_new, cases[i].seq_new);
        expect_refused(&s, st, cases[i].want, "kv_append", i);
    }
    bad_cache bad[17];
    const int nbad = bad_caches(c, bad);
    memcpy(s.lens, good_lens, sizeof s.lens);
    memcpy(s.lens0, good_lens, sizeof s.lens0);
    for (int i = 0; i < nbad; i++)
        expect_refused(&s, mha_kv_append(&bad[i].c, s.lens, k_new, v_new, 2), bad[i].want,
                       "kv_append bad cache", (size_t)i);
    free(k_new);
    free(v_new);
    snapshot_free(&s);
}

static void attention_cached_errors(void **state)
{
    (void)state;
    rng r = {108};
    const int32_t good_lens[EB] = {3, 5};
    snapshot s;
    snapshot_init(&s, &r, good_lens);
    float *q = rand_floats(&r, EB * EH * ESQ * EDK, -1, 1);
    const unsigned arg = CODE(MHA_ERR_ARG), shape = CODE(MHA_ERR_SHAPE), maskc = CODE(MHA_ERR_MASK);
    const int32_t kl[EB] = {1, 1}, qkl_neg[EB * ESQ] = {0, 1, -1, 2};
    const int32_t qkl_big[EB * ESQ] = {ECAP, ECAP + 1, 0, 0};
    const float bias[ECAP] = {0};
    const mha_mask m_kl = {.key_lens = kl}, m_qneg = {.query_key_lens = qkl_neg};
    const mha_mask m_qbig = {.query_key_lens = qkl_big};
    const mha_mask m_bneg = {.bias = bias, .bias_stride_q = -1};
    const mha_mask m_bbig = {.bias = bias, .bias_stride_b = INT64_MAX / 2};
    const mha_kv_cache *c = &s.tc.c;
    const struct {
        const mha_kv_cache *c;
        int32_t lens[EB];
        int nul; /* 1: lens NULL, 2: q NULL, 3: out NULL */
        int32_t heads, seq_q;
        const mha_mask *mask;
        int layout;
        unsigned want;
    } cases[] = {
        {NULL, {3, 5}, 0, EH, ESQ, NULL, 0, arg},
        {c, {3, 5}, 1, EH, ESQ, NULL, 0, arg},
        {c, {3, 5}, 2, EH, ESQ, NULL, 0, arg},
        {c, {3, 5}, 3, EH, ESQ, NULL, 0, arg},
        {c, {3, 5}, 0, EH, ESQ, NULL, 2, arg},
        {c, {3, 5}, 0, EH, ESQ, NULL, -1, arg},
        {c, {-1, 5}, 0, EH, ESQ, NULL, 0, shape},
        {c, {3, ECAP + 1}, 0, EH, ESQ, NULL, 0, shape},
        {c, {3, 5}, 0, 0, ESQ, NULL, 0, shape},
        {c, {3, 5}, 0, -EH, ESQ, NULL, 0, shape},
        {c, {3, 5}, 0, 3, ESQ, NULL, 0, shape},  /* heads % kv_heads */
        {c, {3, 5}, 0, 1, ESQ, NULL, 0, shape},  /* heads < kv_heads */
        {c, {3, 5}, 0, EH, 0, NULL, 0, shape},
        {c, {3, 5}, 0, EH, -1, NULL, 0, shape},
        {c, {3, 5}, 0, EH, ESQ, &m_kl, 0, maskc}, /* key_lens must be NULL */
        {c, {3, 5}, 0, EH, ESQ, &m_qneg, 0, maskc},
        {c, {3, 5}, 0, EH, ESQ, &m_qbig, 1, maskc},
        {c, {3, 5}, 0, EH, ESQ, &m_bneg, 0, maskc},
        {c, {3, 5}, 0, EH, ESQ, &m_bbig, 0, maskc},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(s.lens, cases[i].lens, sizeof s.lens);
        memcpy(s.lens0, cases[i].lens, sizeof s.lens0);
        const mha_status st = mha_attention_cached(
            cases[i].c, cases[i].nul == 1 ? NULL : s.lens, cases[i].nul == 2 ? NULL : q,
            cases[i].heads, cases[i].seq_q, 0.5f, cases[i].mask,
            cases[i].nul == 3 ? NULL : s.out, (mha_layout)cases[i].layout, s.lse);
        expect_refused(&s, st, cases[i].want, "attention_cached", i);
    }
    bad_cache bad[17];
    const int nbad = bad_caches(c, bad);
    memcpy(s.lens, good_lens, sizeof s.lens);
    memcpy(s.lens0, good_lens, sizeof s.lens0);
    for (int i = 0; i < nbad; i++)
        expect_refused(&s, mha_attention_cached(&bad[i].c, s.lens, q, EH, ESQ, 0.5f, NULL, s.out,
                                                MHA_LAYOUT_BHSD, s.lse),
                       bad[i].want, "attention_cached bad cache", (size_t)i);
    /* Each refusal above is its one broken field's: the unbroken call works. */
    assert_int_equal(mha_attention_cached(c, s.lens, q, EH, ESQ, 0.5f, NULL, s.out,
                                          MHA_LAYOUT_BHSD, s.lse), MHA_OK);
    free(q);
    snapshot_free(&s);
}

static void layer_step_errors(void **state)
{
    (void)state;
    rng r = {109};
    const int32_t good_lens[EB] = {3, 2}; /* + seq_q 2: rows up to 5 = capacity */
    snapshot s;
    snapshot_init(&s, &r, good_lens);
    test_layer t, cross;
    test_layer_init_v(&t, &r, EH, EHKV, EDK, EDV, EE, 0, 0, EOUT, 1);
    test_layer_init_v(&cross, &r, EH, EHKV, EDK, EDV, EE, EE + 1, 0, EOUT, 1);
    float *x = rand_floats(&r, EB * ESQ * EE, -1, 1);
    const size_t ws_need = mha_layer_step_workspace_size(t.layer, EB, ESQ);
    assert_true(ws_need > 0);
    char *ws = malloc(ws_need);
    memset(ws, CANARY, ws_need);
    const unsigned arg = CODE(MHA_ERR_ARG), shape = CODE(MHA_ERR_SHAPE), maskc = CODE(MHA_ERR_MASK);
    const int32_t kl[EB] = {1, 1}, qkl_big[EB * ESQ] = {ECAP + 1, 0, 0, 0};
    const float bias[ECAP] = {0};
    const mha_mask m_kl = {.key_lens = kl, .causal = 1}, m_qbig = {.query_key_lens = qkl_big};
    const mha_mask m_bneg = {.bias = bias, .bias_stride_h = -1};
    const mha_kv_cache *c = &s.tc.c;
    mha_kv_cache kvh = *c, hd = *c, dv0 = *c, dv7 = *c;
    kvh.kv_heads = 1, hd.head_dim = EDK - 1, dv0.v_head_dim = 0, dv7.v_head_dim = EDV + 1;
    const struct {
        const mha_layer *layer;
        const mha_kv_cache *c;
        int32_t lens[EB];
        int nul; /* 1: x NULL, 2: lens NULL, 3: out NULL */
        int32_t seq_q;
        const mha_mask *mask;
        size_t ws_size;
        unsigned want;
    } cases[] = {
        {NULL, c, {3, 2}, 0, ESQ, NULL, 0, arg},
        {t.layer, NULL, {3, 2}, 0, ESQ, NULL, 0, arg},
        {t.layer, c, {3, 2}, 1, ESQ, NULL, 0, arg},
        {t.layer, c, {3, 2}, 2, ESQ, NULL, 0, arg},
        {t.layer, c, {3, 2}, 3, ESQ, NULL, 0, arg},
        {t.layer, c, {3, 2}, 0, 0, NULL, 0, shape},
        {t.layer, c, {3, 2}, 0, -1, NULL, 0, shape},
        {t.layer, &kvh, {3, 2}, 0, ESQ, NULL, 0, shape},
        {t.layer, &hd, {3, 2}, 0, ESQ, NULL, 0, shape},
        {t.layer, &dv0, {3, 2}, 0, ESQ, NULL, 0, shape}, /* 0 means head_dim 8, not 6 */
        {t.layer, &dv7, {3, 2}, 0, ESQ, NULL, 0, shape},
        {t.layer, c, {-1, 2}, 0, ESQ, NULL, 0, shape},
        {t.layer, c, {4, 2}, 0, ESQ, NULL, 0, shape}, /* lens + seq_q > capacity */
        {t.layer, c, {3, ECAP + 1}, 0, 1, NULL, 0, shape},
        {t.layer, c, {3, 2}, 0, ECAP + 1, NULL, 0, shape},
        {t.layer, c, {3, 2}, 0, ESQ, &m_kl, 0, maskc},
        {t.layer, c, {3, 2}, 0, ESQ, &m_qbig, 0, maskc},
        {t.layer, c, {3, 2}, 0, ESQ, &m_bneg, 0, maskc},
        {t.layer, c, {3, 2}, 0, ESQ, NULL, ws_need - 1, arg},
        {t.layer, c, {3, 2}, 0, ESQ, NULL, 1, arg},
        /* q_in != k_in: not a self-attention layer; the header names no status */
        {cross.layer, c, {3, 2}, 0, ESQ, NULL, 0, arg | shape},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(s.lens, cases[i].lens, sizeof s.lens);
        memcpy(s.lens0, cases[i].lens, sizeof s.lens0);
        const mha_status st = mha_layer_step(
            cases[i].layer, cases[i].nul == 1 ? NULL : x, cases[i].seq_q, cases[i].c,
            cases[i].nul == 2 ? NULL : s.lens, cases[i].mask, cases[i].nul == 3 ? NULL : s.out,
            cases[i].ws_size ? ws : NULL, cases[i].ws_size);
        expect_refused(&s, st, cases[i].want, "layer_step", i);
    }
    for (size_t i = 0; i < ws_need; i++)
        assert_int_equal((unsigned char)ws[i], CANARY);
    bad_cache bad[17];
    const int nbad = bad_caches(c, bad);
    memcpy(s.lens, good_lens, sizeof s.lens);
    memcpy(s.lens0, good_lens, sizeof s.lens0);
    for (int i = 0; i < nbad; i++)
        expect_refused(&s, mha_layer_step(t.layer, x, ESQ, &bad[i].c, s.lens, NULL, s.out, NULL, 0),
                       bad[i].want, "layer_step bad cache", (size_t)i);
    assert_int_equal(mha_layer_step_workspace_size(NULL, EB, ESQ), 0);
    assert_int_equal(mha_layer_step_workspace_size(t.layer, 0, ESQ), 0);
    assert_int_equal(mha_layer_step_workspace_size(t.layer, EB, 0), 0);
    assert_int_equal(mha_layer_step_workspace_size(t.layer, -1, ESQ), 0);
    assert_int_equal(mha_layer_step_workspace_size(t.layer, INT32_MAX, INT32_MAX), 0);
    /* The valid call with the workspace works and advances lens. */
    assert_int_equal(mha_layer_step(t.layer, x, ESQ, c, s.lens, NULL, s.out, ws, ws_need), MHA_OK);
    assert_int_equal(s.lens[0], 5);
    assert_int_equal(s.lens[1], 4);
    free(ws);
    free(x);
    test_layer_free(&t);
    test_layer_free(&cross);
    snapshot_free(&s);
}

int main(void)
{
    require_env_isa();
    isa = mha_isa_active();
    quick = getenv("MHA_TEST_QUICK") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reference_self_check),    cmocka_unit_test(cached_vs_float64),
        cmocka_unit_test(split_kv_vs_float64),     cmocka_unit_test(cached_threads_bitwise),
        cmocka_unit_test(kv_append_rows),          cmocka_unit_test(layer_step_decode),
        cmocka_unit_test(kv_append_errors),        cmocka_unit_test(attention_cached_errors),
        cmocka_unit_test(layer_step_errors),
    };
    return cmocka_run_group_tests_name(mha_isa_name(isa), tests, NULL, NULL);
}
