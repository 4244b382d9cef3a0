/* The element types and paged caches through the public API, each combination
 * covered once where it matters (the f32, contiguous cases are the other suites'):
 *   - mha_attention_cached over f16, bf16 and q8_0 caches (and f32 ones through a
 *     block table) of every layout of common.h, contiguous or paged (block sizes 1,
 *     7, 16, 64, 256 and more than the rows, blocks shuffled in the pool, spare
 *     blocks poisoned), GQA, dv != dk, split-KV, every mask kind and modifier, f32
 *     and 16-bit q and out: against float64 over the values the cache holds (f32 out
 *     within TOL_REF, 16-bit out within one unit in its last place plus TOL_REF) and
 *     against scalar;
 *   - mha_attention on 16-bit q, k, v and out;
 *   - bitwise results on 1, 2, 3 and 7 threads per type, paged and split;
 *   - mha_kv_append from every io type into every cache type: the bytes of mha.h's
 *     conversions and nothing else; q8_0 rows byte for byte those of a plain-C port
 *     of ggml's reference quantizer, on random rows and the edge cases;
 *   - mha_layer_step on typed and paged caches: the new rows are the step's f32 rows
 *     converted, the output that of mha_attention_cached over the cache;
 *   - the non-finite rule per type; the errors of types and block tables, with
 *     nothing written. */
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

typedef struct shape {
    int32_t batch, heads, kv_heads, dk, dv, capacity, seq_q;
    int32_t lens[3];
} shape;

/* Masks of a sweep: none, causal, window + softcap + ALiBi + sinks, a bias with
   -INFINITY, and left padding (key_starts) with top-left rows (q_offsets). */
enum { M_NONE, M_CAUSAL, M_MODS, M_BIAS, M_STARTS, M_COUNT };
typedef struct masks {
    mha_mask m[M_COUNT];
    float *bias, *slopes, *sinks;
    int32_t starts[3], offsets[3];
} masks;

static void masks_init(masks *ms, rng *r, const shape *s)
{
    memset(ms, 0, sizeof *ms);
    const int64_t nb = (int64_t)s->batch * s->heads * s->seq_q * s->capacity;
    ms->bias = rand_floats(r, nb, -2, 2);
    for (int64_t i = 5; i < nb; i += 11)
        ms->bias[i] = -INFINITY;
    ms->slopes = rand_floats(r, s->heads, 0.0f, 0.3f);
    ms->sinks = rand_floats(r, s->heads, -2.0f, 2.0f);
    for (int32_t b = 0; b < s->batch; b++) {
        ms->starts[b] = s->lens[b] / 3;
        ms->offsets[b] = s->lens[b] - s->seq_q - 2 * b;
    }
    ms->m[M_CAUSAL] = (mha_mask){.causal = 1};
    ms->m[M_MODS] = (mha_mask){.causal = 1, .window = 37, .softcap = 5.0f,
                               .alibi_slopes = ms->slopes, .sinks = ms->sinks};
    ms->m[M_BIAS] = (mha_mask){.bias = ms->bias, .bias_stride_b = (int64_t)s->heads * s->seq_q * s->capacity,
                               .bias_stride_h = (int64_t)s->seq_q * s->capacity,
                               .bias_stride_q = s->capacity};
    ms->m[M_STARTS] = (mha_mask){.causal = 1, .key_starts = ms->starts, .q_offsets = ms->offsets};
}

static void masks_free(masks *ms)
{
    free(ms->bias), free(ms->slopes), free(ms->sinks);
}

/* One cached call on the active ISA and on scalar: scalar against float64, the ISA
   against scalar, zeros where no key is visible. */
static void check_typed(const shape *s, const mha_kv_cache *c, const void *q, const mha_mask *mask,
                        mha_layout layout, const char *what)
{
    const int64_t nl = (int64_t)s->batch * s->heads * s->seq_q, no = nl * s->dv;
    const mha_dtype io = c->io_dtype;
    const size_t ob = (size_t)mha_row_bytes(io, no);
    void *got = xcalloc(ob), *want = xcalloc(ob);
    float *got_lse = xcalloc(sizeof(float) * (size_t)nl), *want_lse = xcalloc(sizeof(float) * (size_t)nl);
    double *ref = xcalloc(sizeof(double) * (size_t)no), *ref_lse = xcalloc(sizeof(double) * (size_t)nl);
    const float scale = 1.0f / sqrtf((float)s->dk);
    mha_status st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, got,
                                         layout, got_lse);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    use(MHA_ISA_SCALAR);
    st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, want, layout, want_lse);
    use(isa);
    assert_int_equal(st, MHA_OK);
    ref_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, mask, ref, layout, ref_lse);
    double *g = typed_decode(io, got, no), *w = typed_decode(io, want, no);
    double *gl = typed_decode(MHA_F32, got_lse, nl), *wl = typed_decode(MHA_F32, want_lse, nl);
    const double r_out = typed_ratio(io, w, ref, no, TOL_REF);
    const double r_lse = typed_ratio(MHA_F32, wl, ref_lse, nl, TOL_REF);
    const double i_out = typed_ratio(io, g, w, no, TOL_ISA), i_lse = typed_ratio(MHA_F32, gl, wl, nl, TOL_ISA);
    if (r_out > 1.0 || r_lse > 1.0)
        fail_msg("%s: scalar vs float64: out %.3g, lse %.3g x tolerance", what, r_out, r_lse);
    if (i_out > 1.0 || i_lse > 1.0)
        fail_msg("%s: %s vs scalar: out %.3g, lse %.3g x tolerance", what, mha_isa_name(isa), i_out,
                 i_lse);
    for (int64_t i = 0; i < nl; i++)
        if (ref_lse[i] == -INFINITY) { /* no visible key: exact zeros (rows in BHSD order) */
            const int64_t b = i / ((int64_t)s->heads * s->seq_q), h = i / s->seq_q % s->heads;
            const int64_t row = i % s->seq_q;
            const int64_t at = layout == MHA_LAYOUT_BHSD ? i * s->dv
                                                         : ((b * s->seq_q + row) * s->heads + h) * s->dv;
            for (int32_t e = 0; e < s->dv; e++)
                if (g[at + e] != 0.0)
                    fail_msg("%s: row %lld sees no key but is %g", what, (long long)i, g[at + e]);
        }
    free(got), free(want), free(got_lse), free(want_lse), free(ref), free(ref_lse);
    free(g), free(w), free(gl), free(wl);
}

/* Tiles' tails and GQA groups, dk and dv multiples of 32 where q8_0 goes, dv != dk,
   decode and prefill rows, lens 0 and = capacity, and split-KV shapes. */
static const shape shapes[] = {
    {2, 4, 2, 64, 64, 112, 3, {1, 112}},   {1, 8, 1, 128, 128, 256, 1, {200}},
    {2, 4, 4, 32, 96, 64, 17, {64, 0}},    {1, 4, 2, 65, 33, 90, 5, {90}},
    {3, 2, 1, 96, 64, 48, 2, {7, 48, 30}}, {1, 8, 2, 128, 128, 2048, 1, {2047}},
    {1, 2, 1, 64, 32, 1200, 3, {1199}},    {1, 4, 1, 7, 16, 160, 100, {150}},
};
static const int32_t block_sizes[] = {0, 1, 7, 16, 64, 256};

static int too_big(const shape *s, double flops)
{
    return quick && (double)s->batch * s->heads * s->seq_q * s->capacity * (s->dk + s->dv) > flops;
}

/* The shapes, each layout, each mask: the cache type, block size and io type taken in
   turn (a type only where the dims allow it), so every type meets every layout, mask,
   block size and io type across the sweep. */
static void typed_vs_float64(void **state)
{
    (void)state;
    rng r = {201};
    char what[256];
    int turn = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        if (too_big(s, 2.5e6))
            continue;
        masks ms;
        masks_init(&ms, &r, s);
        for (int kind = 0; kind < CACHE_KINDS; kind++)
            for (int m = 0; m < M_COUNT; m++, turn++) {
                const mha_dtype dtype = test_types[turn % TEST_TYPE_COUNT];
                const int32_t bs0 = block_sizes[turn / TEST_TYPE_COUNT % (sizeof block_sizes / sizeof *block_sizes)];
                /* a block size that divides the capacity, or larger than every lens */
                const int32_t bs = bs0 && s->capacity % bs0 ? s->capacity : bs0;
                const mha_dtype io = turn % 3 == 2 ? (turn % 2 ? MHA_F16 : MHA_BF16) : MHA_F32;
                if (dtype == MHA_F32 && !bs && io == MHA_F32)
                    continue; /* test_cached's */
                test_cache tc;
                if (!test_cache_init_as(&tc, (cache_kind)kind, dtype, io, bs, s->batch, s->kv_heads,
                                        s->dk, s->dv == s->dk ? 0 : s->dv, s->capacity, &r))
                    continue;
                test_cache_fill(&tc, &r, s->lens);
                void *q = typed_rand(&r, io, (int64_t)s->batch * s->heads * s->seq_q * s->dk);
                snprintf(what, sizeof what,
                         "shape %zu %s cache %s block_size %d io %s mask %d", si,
                         cache_kind_name((cache_kind)kind), mha_dtype_name(dtype), bs,
                         mha_dtype_name(io), m);
                check_typed(s, &tc.c, q, m == M_NONE ? NULL : &ms.m[m], (mha_layout)(turn % 2), what);
                free(q);
                test_cache_free(&tc);
            }
        masks_free(&ms);
    }
}

/* mha_attention on 16-bit q, k, v and out against float64 over the same inputs; the
   bf16 shapes of many rows per kv head and even head_dim take AVX512-BF16's dot
   products where the CPU has them (the fifth and sixth: odd pair counts, key and row
   tails), and AMX's tiles where head_dim is a multiple of 32 (the last three: several
   key tiles and passes with a tail of each, dv 64 against dk 128). */
static void activations_16bit(void **state)
{
    (void)state;
    rng r = {202};
    const mha_attn_dims dims[] = {{2, 4, 2, 37, 75, 64, 0, MHA_F16}, {1, 8, 2, 1, 3000, 64, 32, MHA_BF16},
                                  {3, 2, 1, 100, 100, 33, 0, MHA_BF16}, {1, 4, 4, 17, 130, 128, 0, MHA_F16},
                                  {1, 6, 3, 130, 150, 66, 40, MHA_BF16}, {2, 2, 1, 61, 61, 128, 0, MHA_BF16},
                                  {1, 8, 2, 100, 300, 64, 0, MHA_BF16}, {2, 4, 1, 50, 200, 128, 64, MHA_BF16}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        const mha_attn_dims *d = &dims[i];
        const int32_t dv = d->v_head_dim ? d->v_head_dim : d->head_dim;
        const int64_t nq = (int64_t)d->batch * d->heads * d->seq_q * d->head_dim;
        const int64_t nk = (int64_t)d->batch * d->kv_heads * d->seq_kv * d->head_dim;
        const int64_t nv = (int64_t)d->batch * d->kv_heads * d->seq_kv * dv;
        const int64_t no = (int64_t)d->batch * d->heads * d->seq_q * dv;
        void *q = typed_rand(&r, d->dtype, nq), *k = typed_rand(&r, d->dtype, nk);
        void *v = typed_rand(&r, d->dtype, nv), *out = xcalloc((size_t)mha_row_bytes(d->dtype, no));
        double *ref = xcalloc(sizeof(double) * (size_t)no);
        const mha_mask m = {.causal = (int32_t)(i % 2)};
        for (int layout = 0; layout < 2; layout++) {
            assert_int_equal(mha_attention(d, q, k, v, 0.2f, &m, out, (mha_layout)layout), MHA_OK);
            ref_attention(d, q, k, v, 0.2, &m, ref, (mha_layout)layout);
            double *g = typed_decode(d->dtype, out, no);
            const double e = typed_ratio(d->dtype, g, ref, no, TOL_REF);
            if (e > 1.0)
                fail_msg("%s attention %zu layout %d: %.3g x tolerance", mha_dtype_name(d->dtype), i,
                         layout, e);
            free(g);
        }
        free(q), free(k), free(v), free(out), free(ref);
    }
}

static const int thread_counts[] = {1, 2, 3, 7};

/* Per type, paged and split-KV: out and lse bitwise equal on 1, 2, 3 and 7 threads. */
static void typed_threads_bitwise(void **state)
{
    (void)state;
    rng r = {203};
    const shape s = {1, 8, 2, 64, 64, 4096, 1, {4000}};
    const shape p = {2, 4, 1, 64, 32, 512, 20, {500, 77}};
    for (int t = 0; t < TEST_TYPE_COUNT; t++)
        for (int which = 0; which < 2; which++) {
            const shape *sh = which ? &p : &s;
            if (too_big(sh, 2.5e6))
                continue;
            test_cache tc;
            assert_true(test_cache_init_as(&tc, (cache_kind)(t % CACHE_KINDS), test_types[t],
                                           t == 1 || test_types[t] == MHA_BF16 ? MHA_BF16 : MHA_F32,
                                           which ? 16 : 64, sh->batch,
                                           sh->kv_heads, sh->dk, sh->dv == sh->dk ? 0 : sh->dv,
                                           sh->capacity, &r));
            test_cache_fill(&tc, &r, sh->lens);
            const int64_t nl = (int64_t)sh->batch * sh->heads * sh->seq_q, no = nl * sh->dv;
            void *q = typed_rand(&r, tc.c.io_dtype, nl * sh->dk);
            const size_t ob = (size_t)mha_row_bytes(tc.c.io_dtype, no);
            void *o[2] = {xcalloc(ob), xcalloc(ob)};
            float *l[2] = {xcalloc(sizeof(float) * (size_t)nl), xcalloc(sizeof(float) * (size_t)nl)};
            const mha_mask m = {.causal = 1, .window = which ? 50 : 0};
            for (size_t n = 0; n < sizeof thread_counts / sizeof *thread_counts; n++) {
                set_threads(thread_counts[n]);
                assert_int_equal(mha_attention_cached(&tc.c, sh->lens, q, sh->heads, sh->seq_q, 0.1f,
                                                      &m, o[n > 0], MHA_LAYOUT_BHSD, l[n > 0]),
                                 MHA_OK);
                if (n > 0 && (memcmp(o[0], o[1], ob) || memcmp(l[0], l[1], sizeof(float) * (size_t)nl)))
                    fail_msg("%s %s: %d threads differ from 1", mha_dtype_name(test_types[t]),
                             which ? "paged" : "split", thread_counts[n]);
            }
            set_threads(2);
            free(q), free(o[0]), free(o[1]), free(l[0]), free(l[1]);
            test_cache_free(&tc);
        }
}

/* ggml's reference quantizer (quantize_row_q8_0_ref) as published, ported to plain
   C for one block: the oracle of libmha's q8_0 bytes for finite blocks. */
static void ggml_q8_0_ref(const float *x, uint8_t out[34])
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float v = x[j];
        amax = amax > fabsf(v) ? amax : fabsf(v);
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = mha_f32_to_f16(d); /* GGML_FP32_TO_FP16: nearest even */
    memcpy(out, &dh, 2);
    for (int j = 0; j < 32; j++)
        out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Blocks of 32 floats: random, the edge cases of the rounding, and non-finite. */
static void q8_blocks(rng *r, float *x, int nblocks)
{
    for (int b = 0; b < nblocks; b++) {
        float *y = x + b * 32;
        const float mag = b % 5 == 4 ? 1e-6f : b % 5 == 3 ? 300.0f : 1.0f;
        for (int j = 0; j < 32; j++)
            y[j] = rng_uniform(r, -mag, mag);
        switch (b % 16) {
        case 0: memset(y, 0, 32 * sizeof(float)); break;         /* all zero: d = 0 */
        case 1: y[7] = 1e4f; break;                               /* one huge value */
        case 2: /* x/d exactly a half: amax 127, values k + 0.5 */
            y[0] = 127.0f;
            for (int j = 1; j < 32; j++)
                y[j] = (float)(j % 20) - 9.5f;
            break;
        case 3: y[3] = 0.0076f; break;                             /* d rounds in f16 */
        case 4: for (int j = 0; j < 32; j++) y[j] *= 1e-3f; break; /* f16-subnormal d */
        case 5: y[31] = -65000.0f * 127.0f; break;                 /* d overflows f16 */
        default: break;
        }
    }
}

static void q8_0_bytes_match_ggml(void **state)
{
    (void)state;
    rng r = {204};
    enum { NB = 64, DH = 64 };
    float *x = xcalloc(sizeof(float) * NB * 32);
    q8_blocks(&r, x, NB);
    /* Rows of a q8_0 cache [1][1][cap][64]: two blocks per row. */
    const int32_t cap = NB / 2;
    uint8_t *kc = xcalloc(cap * 2 * 34 + 64), *vc = xcalloc(cap * 2 * 34 + 64);
    const mha_kv_cache c = {.k = kc, .v = vc, .batch = 1, .kv_heads = 1, .head_dim = DH,
                            .capacity = cap, .stride_b = cap * 2, .stride_h = cap * 2,
                            .stride_s = 2, .dtype = MHA_Q8_0};
    const int32_t lens[1] = {0};
    assert_int_equal(mha_kv_append(&c, lens, x, x, cap), MHA_OK);
    for (int b = 0; b < NB; b++) {
        uint8_t want[34];
        ggml_q8_0_ref(x + b * 32, want);
        if (memcmp(kc + b * 34, want, 34) || memcmp(vc + b * 34, want, 34))
            fail_msg("q8_0 block %d (case %d): libmha's bytes differ from ggml's reference", b, b % 16);
    }
    /* A block holding NaN or Inf: a NaN scale, every value NaN. */
    float bad[64];
    memcpy(bad, x, sizeof bad);
    bad[5] = NAN;
    bad[32 + 9] = -INFINITY;
    assert_int_equal(mha_kv_append(&c, lens, bad, bad, 1), MHA_OK);
    for (int blk = 0; blk < 2; blk++)
        for (int j = 0; j < 32; j++)
            assert_true(isnan(ref_value(MHA_Q8_0, kc, blk * 32 + j)));
    free(x), free(kc), free(vc);
}

/* mha_kv_append from every io type into every cache type, contiguous and paged: the
   rows hold the io values converted as mha.h says, and no other byte changes. */
static void append_every_type(void **state)
{
    (void)state;
    rng r = {205};
    const int32_t B = 2, G = 2, dk = 64, dv = 32, cap = 48, n = 5;
    const int32_t lens[2] = {3, 40};
    for (int ti = 0; ti < TEST_TYPE_COUNT; ti++)
        for (int io = 0; io < 3; io++)
            for (int paged = 0; paged < 2; paged++) {
                const mha_dtype t = test_types[ti], iot = (mha_dtype)io;
                test_cache tc;
                assert_true(test_cache_init_as(&tc, (cache_kind)((ti + io) % 2), t, iot, paged ? 16 : 0,
                                               B, G, dk, dv, cap, &r));
                void *kn = typed_rand(&r, iot, (int64_t)B * G * n * dk);
                void *vn = typed_rand(&r, iot, (int64_t)B * G * n * dv);
                uint8_t *kimg = xcalloc(tc.kn * 4), *vimg = xcalloc(tc.vn * 4);
                memcpy(kimg, tc.kbuf, tc.kn * 4);
                memcpy(vimg, tc.vbuf, tc.vn * 4);
                assert_int_equal(mha_kv_append(&tc.c, lens, kn, vn, n), MHA_OK);
                /* The expected image: the rows converted from the io values. */
                for (int pass = 0; pass < 2; pass++)
                    for (int32_t b = 0; b < B; b++)
                        for (int32_t g = 0; g < G; g++)
                            for (int32_t j = 0; j < n; j++) {
                                const int32_t w = pass ? dv : dk;
                                float row[64];
                                for (int32_t e = 0; e < w; e++)
                                    row[e] = (float)ref_value(iot, pass ? vn : kn,
                                                              (((int64_t)b * G + g) * n + j) * w + e);
                                uint8_t *live = pass ? cache_v_row(&tc.c, b, g, lens[b] + j)
                                                     : cache_k_row(&tc.c, b, g, lens[b] + j);
                                uint8_t *img = (pass ? vimg : kimg) + (live - (uint8_t *)(pass ? tc.vbuf : tc.kbuf));
                                typed_store(t, img, row, w);
                            }
                if (memcmp(kimg, tc.kbuf, tc.kn * 4) || memcmp(vimg, tc.vbuf, tc.vn * 4))
                    fail_msg("append %s rows into a %s cache%s: bytes differ", mha_dtype_name(iot),
                             mha_dtype_name(t), paged ? " (paged)" : "");
                free(kn), free(vn), free(kimg), free(vimg);
                test_cache_free(&tc);
            }
}

/* mha_layer_step on caches of every type, contiguous (the GEMM writing the rows
   itself, or through the workspace for unequal lens) and paged: the cache then holds
   the step's f32 rows (those a step on an f32 cache writes) converted to its type,
   and the step's merged output is mha_attention_cached's over that cache, bit for bit. */
static void layer_step_every_type(void **state)
{
    (void)state;
    rng r = {206};
    enum { B = 2, H = 4, G = 2, DH = 32, E = 128, CAP = 64, SQ = 3 };
    test_layer t;
    test_layer_init(&t, &r, H, G, DH, E, 0, 0, 0, 1);
    float *x = rand_floats(&r, B * SQ * E, -1, 1);
    for (int ti = 0; ti < TEST_TYPE_COUNT; ti++)
        for (int v = 0; v < 3; v++) { /* 0 equal lens, 1 unequal, 2 paged */
            const mha_dtype dt = test_types[ti];
            test_cache tc, tf;
            assert_true(test_cache_init_as(&tc, CACHE_BSHD, dt, MHA_F32, v == 2 ? 8 : 0, B, G, DH, 0,
                                           CAP, &r));
            assert_true(test_cache_init(&tf, CACHE_BSHD, B, G, DH, 0, CAP));
            int32_t lens[B] = {10, v ? 23 : 10}, lf[B] = {10, v ? 23 : 10};
            test_cache_fill(&tc, &r, lens);
            test_cache_fill(&tf, &r, lens);
            float *out = xcalloc(sizeof(float) * B * SQ * H * DH), *fo = xcalloc(sizeof(float) * B * SQ * H * DH);
            const mha_mask causal = {.causal = 1};
            assert_int_equal(mha_layer_step(t.layer, x, SQ, &tc.c, lens, &causal, out, NULL, 0), MHA_OK);
            assert_int_equal(mha_layer_step(t.layer, x, SQ, &tf.c, lf, &causal, fo, NULL, 0), MHA_OK);
            for (int32_t b = 0; b < B; b++)
                for (int32_t g = 0; g < G; g++)
                    for (int32_t j = lens[b] - SQ; j < lens[b]; j++) {
                        uint8_t want[2][DH * 4];
                        typed_store(dt, want[0], cache_k_row(&tf.c, b, g, j), DH);
                        typed_store(dt, want[1], cache_v_row(&tf.c, b, g, j), DH);
                        if (memcmp(cache_k_row(&tc.c, b, g, j), want[0], (size_t)mha_row_bytes(dt, DH))
                            || memcmp(cache_v_row(&tc.c, b, g, j), want[1], (size_t)mha_row_bytes(dt, DH)))
                            fail_msg("step on %s (case %d): row %d of b=%d g=%d is not the f32 row converted",
                                     mha_dtype_name(dt), v, j, b, g);
                    }
            /* The output: the projected q against the cache as it now is. */
            float *q = xcalloc(sizeof(float) * B * H * SQ * DH), *kk = xcalloc(sizeof(float) * B * G * SQ * DH);
            float *vv = xcalloc(sizeof(float) * B * G * SQ * DH), *att = xcalloc(sizeof(float) * B * SQ * H * DH);
            assert_int_equal(mha_qkv_project(t.layer, x, x, x, B, SQ, SQ, q, kk, vv), MHA_OK);
            assert_int_equal(mha_attention_cached(&tc.c, lens, q, H, SQ, 1.0f / sqrtf((float)DH), &causal,
                                                  att, MHA_LAYOUT_BSHD, NULL),
                             MHA_OK);
            if (memcmp(att, out, sizeof(float) * B * SQ * H * DH))
                fail_msg("step on %s (case %d): output is not mha_attention_cached's", mha_dtype_name(dt), v);
            free(out), free(fo), free(q), free(kk), free(vv), free(att);
            test_cache_free(&tc);
            test_cache_free(&tf);
        }
    free(x);
    test_layer_free(&t);
}

/* The class of each element: 'n' NaN, 'i' +-Inf, 'f' finite. */
static char cls(double x)
{
    return isnan(x) ? 'n' : isinf(x) ? 'i' : 'f';
}

/* Per type, a NaN or Inf stored in a K or V row (a q8_0 block with one has a NaN
   scale): the classes of every output are those of float64 over the values held;
   rows that hide it stay finite. */
static void nonfinite_every_type(void **state)
{
    (void)state;
    rng r = {207};
    const shape s = {1, 4, 1, 32, 32, 600, 4, {600}};
    for (int ti = 0; ti < TEST_TYPE_COUNT; ti++)
        for (int c = 0; c < 3; c++) {
            test_cache tc;
            assert_true(test_cache_init_as(&tc, CACHE_BHSD, test_types[ti], MHA_F32, c == 2 ? 8 : 0, 1, 1,
                                           32, 0, s.capacity, &r));
            test_cache_fill(&tc, &r, s.lens);
            float bad[32];
            for (int e = 0; e < 32; e++)
                bad[e] = rng_uniform(&r, -1, 1);
            bad[3] = c == 1 ? INFINITY : NAN;
            typed_store(test_types[ti], c == 1 ? cache_v_row(&tc.c, 0, 0, 598) : cache_k_row(&tc.c, 0, 0, 300),
                        bad, 32);
            float *q = rand_floats(&r, 4 * 4 * 32, -1, 1), out[4 * 4 * 32];
            double ref[4 * 4 * 32];
            const mha_mask m = {.causal = 1, .window = c == 1 ? 0 : 200};
            assert_int_equal(mha_attention_cached(&tc.c, s.lens, q, 4, 4, 0.3f, &m, out, MHA_LAYOUT_BHSD, NULL),
                             MHA_OK);
            ref_attention_cached(&tc.c, s.lens, q, 4, 4, 0.3, &m, ref, MHA_LAYOUT_BHSD, NULL);
            for (int i = 0; i < 4 * 4 * 32; i++)
                if (cls(out[i]) != cls(ref[i]))
                    fail_msg("%s case %d: element %d is %g, the rule gives %g", mha_dtype_name(test_types[ti]),
                             c, i, (double)out[i], ref[i]);
            free(q);
            test_cache_free(&tc);
        }
}

/* Bad types, q8_0 dims, block tables and strides: the status, and nothing written. */
static void type_errors(void **state)
{
    (void)state;
    rng r = {208};
    test_cache tc;
    assert_true(test_cache_init_as(&tc, CACHE_BHSD, MHA_F16, MHA_F32, 8, 2, 1, 32, 0, 64, &r));
    test_cache_fill(&tc, &r, (const int32_t[]){64, 20});
    float *img = xcalloc(tc.kn * 4);
    memcpy(img, tc.kbuf, tc.kn * 4);
    float q[2 * 2 * 32], kn[2 * 32], out[2 * 2 * 32];
    for (int i = 0; i < 2 * 2 * 32; i++)
        q[i] = 0.5f, out[i] = 7.0f;
    for (int i = 0; i < 2 * 32; i++)
        kn[i] = 1.0f;
    int32_t lens[2] = {10, 20}, full[2] = {64, 64};
    struct {
        const char *what;
        mha_kv_cache c;
        mha_status want;
    } bad[12];
    int nb = 0;
#define BAD_(w, field, value, st)                      \
    do {                                              \
        bad[nb].what = w, bad[nb].c = tc.c, bad[nb].want = st; \
        bad[nb].c.field = value;                      \
        nb++;                                         \
    } while (0)
    BAD_("unknown dtype", dtype, (mha_dtype)9, MHA_ERR_ARG);
    BAD_("q8_0 as io_dtype", io_dtype, MHA_Q8_0, MHA_ERR_ARG);
    BAD_("unknown io_dtype", io_dtype, (mha_dtype)-1, MHA_ERR_ARG);
    BAD_("block_size 0", block_size, 0, MHA_ERR_SHAPE);
    BAD_("capacity != max_blocks * block_size", max_blocks, 7, MHA_ERR_SHAPE);
    BAD_("num_blocks 0", num_blocks, 0, MHA_ERR_SHAPE);
    BAD_("negative stride", stride_s, -1, MHA_ERR_ARG);
#undef BAD_
    bad[nb].what = "q8_0 with head_dim 48", bad[nb].c = tc.c, bad[nb].want = MHA_ERR_SHAPE;
    bad[nb].c.dtype = MHA_Q8_0, bad[nb].c.head_dim = 48, nb++;
    int32_t table[16];
    memcpy(table, tc.c.block_table, sizeof table);
    table[1] = tc.c.num_blocks; /* row 8.. of sequence 0: needed by lens 10 */
    bad[nb].what = "a needed entry past the pool", bad[nb].c = tc.c, bad[nb].want = MHA_ERR_ARG;
    bad[nb].c.block_table = table, nb++;
    for (int i = 0; i < nb; i++) {
        assert_int_equal(mha_kv_append(&bad[i].c, lens, kn, kn, 1), bad[i].want);
        assert_int_equal(mha_attention_cached(&bad[i].c, lens, q, 2, 1, 0.1f, NULL, out, MHA_LAYOUT_BHSD, NULL),
                         bad[i].want);
        if (memcmp(img, tc.kbuf, tc.kn * 4))
            fail_msg("%s: the cache was written", bad[i].what);
        for (int e = 0; e < 2 * 2 * 32; e++)
            if (out[e] != 7.0f)
                fail_msg("%s: out was written", bad[i].what);
    }
    /* Entries past a sequence's rows are never read: garbage there is fine. */
    int32_t spare[16];
    memcpy(spare, tc.c.block_table, sizeof spare);
    spare[3] = -5, spare[8 + 3] = 1 << 30; /* rows 24.. of both: past lens 10 and 20 */
    mha_kv_cache ok = tc.c;
    ok.block_table = spare;
    assert_int_equal(mha_attention_cached(&ok, lens, q, 2, 1, 0.1f, NULL, out, MHA_LAYOUT_BHSD, NULL), MHA_OK);
    assert_int_equal(mha_kv_append(&ok, full, kn, kn, 1), MHA_ERR_SHAPE);
    /* dims.dtype out of the list, or q8_0 (caches only). */
    mha_attn_dims d = {1, 1, 1, 2, 2, 32, 0, (mha_dtype)4};
    float k[64] = {0}, o[64];
    for (int i = 0; i < 64; i++)
        o[i] = 3.0f;
    assert_int_equal(mha_attention(&d, q, k, k, 1.0f, NULL, o, MHA_LAYOUT_BHSD), MHA_ERR_ARG);
    d.dtype = MHA_Q8_0;
    assert_int_equal(mha_attention(&d, q, k, k, 1.0f, NULL, o, MHA_LAYOUT_BHSD), MHA_ERR_ARG);
    for (int i = 0; i < 64; i++)
        assert_true(o[i] == 3.0f);
    assert_string_equal(mha_dtype_name(MHA_Q8_0), "q8_0");
    assert_string_equal(mha_dtype_name((mha_dtype)TEST_TYPE_COUNT), "unknown");
    /* mha_layer_step needs f32 io. */
    test_layer t;
    test_layer_init(&t, &r, 2, 1, 32, 64, 0, 0, 0, 1);
    mha_kv_cache io16 = tc.c;
    io16.io_dtype = MHA_F16;
    float x[2 * 64], y[2 * 64];
    for (int i = 0; i < 2 * 64; i++)
        x[i] = 0.1f, y[i] = 9.0f;
    assert_int_equal(mha_layer_step(t.layer, x, 1, &io16, lens, NULL, y, NULL, 0), MHA_ERR_ARG);
    assert_true(lens[0] == 10 && y[0] == 9.0f && !memcmp(img, tc.kbuf, tc.kn * 4));
    test_layer_free(&t);
    free(img);
    test_cache_free(&tc);
}

int main(void)
{
    require_env_isa();
    isa = mha_isa_active();
    quick = getenv("MHA_TEST_QUICK") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(typed_vs_float64),      cmocka_unit_test(activations_16bit),
        cmocka_unit_test(typed_threads_bitwise), cmocka_unit_test(q8_0_bytes_match_ggml),
        cmocka_unit_test(append_every_type),     cmocka_unit_test(layer_step_every_type),
        cmocka_unit_test(nonfinite_every_type),  cmocka_unit_test(type_errors),
    };
    return cmocka_run_group_tests_name(mha_isa_name(isa), tests, NULL, NULL);
}
