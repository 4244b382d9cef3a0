/* The kernel table of the ISA named by MHA_ISA, driven directly through its
 * pointers (not the public API) at the edges of each contract in internal.h,
 * against the scalar table:
 *   gemm_tile   every mr in 1..gemm_mr, kc from 1, with rows of A past mr - 1
 *               and W past its panel behind guard pages (reading them crashes);
 *   attn_block  rows 1..attn_block_rows in groups of group_rows, dk and dv
 *               tails, padded strides, key ranges (full, lengths, causal,
 *               windows, empty rows), softcap, bias with -INFINITY, ALiBi,
 *               sinks, lse, and NaN in K or V where some rows see it and others
 *               do not; K and V of every element type, contiguous or through a
 *               block table (block sizes 1 to 97, blocks shuffled); K and V rows
 *               outside every range are NaN, so reading one shows, and the
 *               storage ends against a guard page (a tail read 2 bytes too far
 *               crashes);
 *   convert     every pair of types, every length up to 3 vectors, special values;
 *   transpose   matrix shapes and element widths up to the tile bound.
 * A new ISA gets all of it by its line in the ISA list. */
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
#include "guard.h"
#include "internal.h"

static const mha_kernels *T; /* the table under test */

static int quick(void)
{
    return getenv("MHA_TEST_QUICK") != NULL;
}

static void *aligned(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(p);
    return p;
}

static void gemm_tile_edges(void **state)
{
    (void)state;
    const int32_t MR = T->gemm_mr, NR = T->gemm_nr;
    static const int32_t kcs[] = {1, 2, 3, 5, 8, 17, 64, 129};
    rng r = {3};
    float *tile = aligned(sizeof(float) * (size_t)MR * NR);
    for (int32_t mr = 1; mr <= MR; mr++)
        for (size_t ki = 0; ki < sizeof kcs / sizeof *kcs; ki++) {
            const int32_t kc = kcs[ki], lda = kc + mr % 3;
            const size_t na = (size_t)(mr - 1) * lda + kc, nw = (size_t)kc * NR;
            float *a = guard_alloc(na, GUARD_AFTER), *w = guard_alloc(nw, GUARD_AFTER);
            for (size_t i = 0; i < na; i++)
                a[i] = rng_uniform(&r, -1.0f, 1.0f);
            for (size_t i = 0; i < nw; i++)
                w[i] = rng_uniform(&r, -1.0f, 1.0f);
            T->gemm_tile(mr, kc, a, lda, w, tile);
            for (int32_t i = 0; i < mr; i++)
                for (int32_t j = 0; j < NR; j++) {
                    double sum = 0.0, mag = 0.0;
                    for (int32_t k = 0; k < kc; k++) {
                        const double t = (double)a[i * lda + k] * w[k * NR + j];
                        sum += t, mag += fabs(t);
                    }
                    if (fabs(tile[i * NR + j] - sum) > 1e-6 * mag + 1e-30)
                        fail_msg("gemm_tile mr %d kc %d [%d][%d]: %g, want %g", mr, kc, i, j,
                                 (double)tile[i * NR + j], sum);
                }
            guard_free(a, na, GUARD_AFTER);
            guard_free(w, nw, GUARD_AFTER);
        }
    free(tile);
}

/* One attention block case and the memory behind it. */
typedef struct attn_case {
    int32_t rows, group_rows, seq_kv, dk, dv;
    int range;     /* 0 full, 1 lengths, 2 causal, 3 windows, 4 some rows empty, 5 windows
                      ending at seq_kv (only kv_begin hides) */
    int modifiers; /* bits: 1 softcap, 2 bias, 4 alibi, 8 sink, 16 lse */
    int poison;    /* 0 none, 1 NaN in a K row, 2 NaN in a V row, 3 Inf in a V row */
    mha_dtype kv_type;
    int32_t block_size; /* 0: K and V rows contiguous */
} attn_case;

typedef struct attn_bufs {
    mha_attn_block blk;
    float *q, *k, *v, *bias, *out, *lse, *slope, *sink;
    typed_rows kt, vt;
    int32_t *kb, *ke, *pos;
    size_t nq, nk, nv, nbias, nout;
    void *scratch;
} attn_bufs;

/* The block's view of typed rows. */
static mha_rows rows_of(const typed_rows *tr)
{
    return (mha_rows){.base = tr->mem, .stride = tr->stride, .block_stride = tr->block_stride,
                      .table = tr->table, .block_size = tr->block_size};
}

/* Row r's element offset in a tensor of the block's row and group strides. */
static int64_t row_at(const mha_attn_block *b, int32_t r, int64_t stride, int64_t group_stride)
{
    return mha_row_offset(b, r, stride, group_stride);
}

static void case_build(const attn_case *c, rng *r, attn_bufs *a)
{
    memset(a, 0, sizeof *a);
    mha_attn_block *b = &a->blk;
    const int32_t R = c->rows, G = c->group_rows, groups = R / G, S = c->seq_kv;
    b->rows = R, b->group_rows = G, b->seq_kv = S, b->dk = c->dk, b->dv = c->dv;
    b->q_stride = c->dk + 3, b->q_group_stride = G * b->q_stride + 5;
    const int64_t kld = c->dk + 1, vld = c->dv + 1; /* the f32 values, before storage */
    b->out_stride = c->dv + 2, b->out_group_stride = G * b->out_stride + 1;
    b->scale = 1.0f / sqrtf((float)c->dk);
    a->nq = (size_t)(groups * b->q_group_stride);
    a->nk = (size_t)(S * kld), a->nv = (size_t)(S * vld);
    a->nout = (size_t)(groups * b->out_group_stride);
    a->q = guard_alloc(a->nq, GUARD_AFTER);
    a->k = malloc(sizeof(float) * a->nk);
    a->v = malloc(sizeof(float) * a->nv);
    a->out = guard_alloc(a->nout, GUARD_AFTER);
    for (size_t i = 0; i < a->nq; i++) /* padding NaN: reading past dk shows */
        a->q[i] = (int64_t)(i % (size_t)b->q_group_stride) < G * b->q_stride
                          && (int64_t)(i % (size_t)b->q_group_stride) % b->q_stride < c->dk
                      ? rng_uniform(r, -1.0f, 1.0f)
                      : NAN;
    a->kb = aligned(sizeof(int32_t) * (size_t)R);
    a->ke = aligned(sizeof(int32_t) * (size_t)R);
    int32_t lo = S, hi = 0;
    for (int32_t i = 0; i < R; i++) {
        const int32_t row = i % G; /* causal and windows follow a group's row */
        int32_t kb = 0, ke = S;
        if (c->range == 1)
            ke = (int32_t)rng_uniform(r, 0.0f, (float)S + 0.99f);
        else if (c->range == 2)
            ke = S - G + row + 1 > 0 ? S - G + row + 1 : 0;
        else if (c->range == 3) {
            ke = (int32_t)rng_uniform(r, 1.0f, (float)S + 0.99f);
            kb = (int32_t)rng_uniform(r, 0.0f, (float)ke - 0.01f);
        } else if (c->range == 5)
            kb = (int32_t)rng_uniform(r, 0.0f, (float)S - 0.01f);
        else if (c->range == 4 && i % 3 == 1)
            ke = 0;
        a->kb[i] = kb, a->ke[i] = ke;
        if (kb < ke)
            lo = kb < lo ? kb : lo, hi = ke > hi ? ke : hi;
    }
    /* Keys no row sees and the padding of rows are NaN: a kernel that reads one
       into a row shows. */
    for (int32_t j = 0; j < S; j++) {
        const int seen = j >= lo && j < hi;
        for (int32_t d = 0; d < kld; d++)
            a->k[j * kld + d] = seen && d < c->dk ? rng_uniform(r, -1.0f, 1.0f) : NAN;
        for (int32_t d = 0; d < vld; d++)
            a->v[j * vld + d] = seen && d < c->dv ? rng_uniform(r, -1.0f, 1.0f) : NAN;
    }
    if (c->poison && hi > lo) {
        const int32_t j = lo + (hi - lo) / 2;
        if (c->poison == 1)
            a->k[j * kld] = NAN;
        else
            a->v[j * vld + b->dv - 1] = c->poison == 2 ? NAN : INFINITY;
    }
    /* Padding of a unit after each K row (none on V), stored typed, the storage
       flush against a guard page; paged with two spare poisoned blocks. */
    typed_rows_init(&a->kt, c->kv_type, a->k, kld, S, c->dk, 1, c->block_size, 2, r);
    typed_rows_init(&a->vt, c->kv_type, a->v, vld, S, c->dv, 0, c->block_size, 2, r);
    if (c->block_size) /* one table for K and V, as a cache has */
        memcpy(a->vt.table, a->kt.table, sizeof(int32_t) * (size_t)((S + c->block_size - 1) / c->block_size));
    b->q = a->q, b->out = a->out;
    b->k = rows_of(&a->kt), b->v = rows_of(&a->vt), b->kv_type = c->kv_type;
    /* two cases in three prefetch, one of them far ahead (nothing past the rows may be read) */
    b->kv_far = S % 3 == 2 ? KV_PAST_L3 : S % 3 ? KV_PAST_L2 : KV_IN_L2;
    b->kv_begin = c->range == 3 || c->range == 5 ? a->kb : NULL;
    b->kv_end = a->ke;
    if (c->modifiers & 1)
        b->softcap = 5.0f;
    if (c->modifiers & 2) {
        b->bias_stride = S + 1, b->bias_group_stride = G * b->bias_stride;
        a->nbias = (size_t)(groups * b->bias_group_stride);
        a->bias = guard_alloc(a->nbias, GUARD_AFTER);
        for (size_t i = 0; i < a->nbias; i++)
            a->bias[i] = rng_uniform(r, 0.0f, 1.0f) < 0.1f ? -INFINITY : rng_uniform(r, -2.0f, 2.0f);
        b->bias = a->bias;
    }
    if (c->modifiers & 4) {
        a->slope = aligned(sizeof(float) * (size_t)R);
        a->pos = aligned(sizeof(int32_t) * (size_t)R);
        for (int32_t i = 0; i < R; i++)
            a->slope[i] = rng_uniform(r, 0.0f, 0.5f), a->pos[i] = a->ke[i] ? a->ke[i] - 1 : 0;
        b->alibi_slope = a->slope, b->alibi_pos = a->pos;
    }
    if (c->modifiers & 8) {
        a->sink = aligned(sizeof(float) * (size_t)R);
        for (int32_t i = 0; i < R; i++)
            a->sink[i] = rng_uniform(r, -3.0f, 3.0f);
        b->sink = a->sink;
    }
    if (c->modifiers & 16) {
        a->lse = aligned(sizeof(float) * (size_t)R);
        b->lse = a->lse;
    }
}

static void case_free(attn_bufs *a)
{
    guard_free(a->q, a->nq, GUARD_AFTER);
    free(a->k), free(a->v);
    typed_rows_free(&a->kt), typed_rows_free(&a->vt);
    guard_free(a->out, a->nout, GUARD_AFTER);
    if (a->bias)
        guard_free(a->bias, a->nbias, GUARD_AFTER);
    free(a->kb), free(a->ke), free(a->pos), free(a->slope), free(a->sink), free(a->lse);
}

/* Runs the case through the table t into out / lse (copies). */
static void case_run(const mha_kernels *t, attn_bufs *a, float *out, float *lse)
{
    for (size_t i = 0; i < a->nout; i++)
        a->out[i] = -777.0f;
    void *scratch = t->attn_scratch_bytes ? aligned(t->attn_scratch_bytes()) : NULL;
    a->blk.scratch = scratch;
    t->attn_block(&a->blk);
    free(scratch);
    const mha_attn_block *b = &a->blk;
    for (int32_t i = 0; i < b->rows; i++) {
        memcpy(out + (int64_t)i * b->dv, a->out + row_at(b, i, b->out_stride, b->out_group_stride),
               (size_t)b->dv * sizeof(float));
        if (lse)
            lse[i] = b->lse ? b->lse[i] : 0.0f;
    }
    /* Padding between rows and groups is never written. */
    for (int32_t i = 0; i < b->rows; i++) {
        const float *o = a->out + row_at(b, i, b->out_stride, b->out_group_stride);
        for (int32_t d = b->dv; d < b->out_stride && (i + 1) % b->group_rows; d++)
            assert_true(o[d] == -777.0f);
    }
}

static int32_t attn_cases(attn_case *cs, int32_t max)
{
    static const int32_t rows_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 25, 31, 32,
                                        47, 48, 49, 64, 95, 96, 128, 200, 256};
    static const int32_t seq_list[] = {1, 5, 71, 72, 73, 145, 300};
    static const int32_t dk_list[] = {1, 7, 8, 16, 33, 64, 65, 128};
    static const int32_t dk_q8[] = {32, 64, 96, 128, 32, 64, 160, 128};
    static const mha_dtype types[] = {
#define TYPE_ENTRY_(name, value, bytes, values, io) value,
        TEST_DTYPES(TYPE_ENTRY_)
#undef TYPE_ENTRY_
    };
    static const int32_t block_sizes[] = {0, 0, 1, 7, 16, 97};
    rng r = {17};
    int32_t n = 0;
    const int32_t B = T->attn_block_rows;
    for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
        int32_t rows = rows_list[ri] < B ? rows_list[ri] : B;
        if (ri > 0 && rows_list[ri - 1] >= B)
            break;
        const int32_t divisors[3] = {rows, 1, rows % 4 == 0 ? rows / 4 : rows};
        for (int gi = 0; gi < 3; gi++)
            for (int trial = 0; trial < (quick() ? 2 : 6) && n < max; trial++) {
                attn_case c = {.rows = rows, .group_rows = divisors[gi]};
                c.seq_kv = seq_list[(size_t)rng_uniform(&r, 0.0f, 6.99f)];
                c.kv_type = types[(size_t)n % (sizeof types / sizeof *types)];
                const int32_t *dks = c.kv_type == MHA_Q8_0 ? dk_q8 : dk_list;
                c.dk = dks[(size_t)rng_uniform(&r, 0.0f, 7.99f)];
                c.dv = trial % 2 ? dks[(size_t)rng_uniform(&r, 0.0f, 7.99f)] : c.dk;
                c.block_size = block_sizes[(size_t)(n / 4) % (sizeof block_sizes / sizeof *block_sizes)];
                c.range = (trial + gi + (int)ri) % 6;
                c.modifiers = (int)rng_uniform(&r, 0.0f, 31.99f);
                c.poison = trial % 4 == 3 ? 1 + (int)rng_uniform(&r, 0.0f, 2.99f) : 0;
                cs[n++] = c;
            }
    }
    return n;
}

static void attn_block_edges(void **state)
{
    (void)state;
    enum { MAX_CASES = 600 };
    attn_case *cs = malloc(sizeof *cs * MAX_CASES);
    const int32_t n = attn_cases(cs, MAX_CASES);
    rng r = {23};
    double worst = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const attn_case *c = &cs[i];
        attn_bufs a;
        case_build(c, &r, &a);
        const size_t no = (size_t)c->rows * c->dv;
        float *got = malloc(sizeof(float) * no), *want = malloc(sizeof(float) * no);
        float *lse_got = malloc(sizeof(float) * (size_t)c->rows);
        float *lse_want = malloc(sizeof(float) * (size_t)c->rows);
        case_run(&mha_kernels_scalar, &a, want, lse_want);
        case_run(T, &a, got, lse_got);
        const double e = tol_ratio_f(got, want, (int64_t)no, TOL_ISA);
        const double el = tol_ratio_f(lse_got, lse_want, c->rows, TOL_ISA);
        worst = fmax(worst, fmax(e, el));
        if (!(e <= 1.0 && el <= 1.0))
            fail_msg("attn_block rows %d group_rows %d seq_kv %d dk %d dv %d range %d "
                     "modifiers %d poison %d %s block_size %d: %g x tolerance (lse %g)",
                     c->rows, c->group_rows, c->seq_kv, c->dk, c->dv, c->range, c->modifiers,
                     c->poison, mha_dtype_name(c->kv_type), c->block_size, e, el);
        free(got), free(want), free(lse_got), free(lse_want);
        case_free(&a);
    }
    print_message("%d blocks, worst %.3g x tolerance\n", n, worst);
    free(cs);
}

static void transpose_edges(void **state)
{
    (void)state;
    static const int32_t dims[] = {1, 2, 3, 5, 17, 64};
    static const int32_t elems[] = {1, 3, 4, 8, 17, 64, 129};
    rng r = {29};
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t e = 0; e < 7; e++) {
                const int32_t rows = dims[a], cols = dims[b], elem = elems[e];
                const size_t n = (size_t)rows * cols * elem;
                if (n * sizeof(float) > MHA_TRANSPOSE_TILE_BYTES)
                    continue;
                float *x = guard_alloc(n, GUARD_AFTER), *want = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    x[i] = want[i] = rng_uniform(&r, -1.0f, 1.0f);
                void *s1 = aligned(mha_kernels_scalar.transpose_scratch_bytes(rows, cols, elem));
                void *s2 = aligned(T->transpose_scratch_bytes(rows, cols, elem));
                mha_kernels_scalar.transpose(want, rows, cols, elem, s1);
                T->transpose(x, rows, cols, elem, s2);
                if (memcmp(x, want, n * sizeof(float)))
                    fail_msg("transpose %d x %d of %d floats", rows, cols, elem);
                free(s1), free(s2), free(want);
                guard_free(x, n, GUARD_AFTER);
            }
}

/* convert from every type to every io type, every length up to three vectors (q8_0:
   whole blocks), values with every rounding class (ties, overflow, subnormals, NaN
   with payloads), against the scalar table bit for bit, writing nothing past n. */
static void convert_edges(void **state)
{
    (void)state;
    enum { N = 200, CANARY = 16 };
    static const mha_dtype types[] = {
#define TYPE_ENTRY_(name, value, bytes, values, io) value,
        TEST_DTYPES(TYPE_ENTRY_)
#undef TYPE_ENTRY_
    };
    rng r = {31};
    float x[N];
    for (int i = 0; i < N; i++) {
        const uint32_t u = (uint32_t)(rng_uniform(&r, 0.0f, 1.0f) * 4294967040.0f);
        float f;
        memcpy(&f, &u, 4);
        x[i] = i % 3 == 0 ? f : rng_uniform(&r, -70000.0f, 70000.0f) * (i % 7 ? 1.0f : 1e-7f);
    }
    const int nt = (int)(sizeof types / sizeof *types);
    for (int fi = 0; fi < nt; fi++) {
        const mha_dtype from = types[fi];
        char src[N * 4];
        typed_store(from, src, x, from == MHA_Q8_0 ? N / 32 * 32 : N);
        for (int ti = 0; ti < nt; ti++) {
            const mha_dtype to = types[ti];
            if (!mha_dtype_valid(to, 1))
                continue;
            for (int n = 0; n <= (from == MHA_Q8_0 ? 96 : 3 * 16 + 5); n += from == MHA_Q8_0 ? 32 : 1) {
                const size_t bytes = (size_t)mha_row_bytes(to, n);
                char *got = guard_alloc_bytes(bytes + CANARY, GUARD_AFTER), want[N * 4 + CANARY];
                memset(got, 0x5a, bytes + CANARY);
                memset(want, 0x5a, bytes + CANARY);
                T->convert(to, got, from, src, n);
                mha_kernels_scalar.convert(to, want, from, src, n);
                if (memcmp(got, want, bytes + CANARY))
                    fail_msg("convert %s to %s, n %d", mha_dtype_name(from), mha_dtype_name(to), n);
                guard_free_bytes(got, bytes + CANARY, GUARD_AFTER);
            }
        }
    }
}

int main(void)
{
    require_env_isa();
    T = mha_kernels_for(mha_isa_active());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm_tile_edges),
        cmocka_unit_test(attn_block_edges),
        cmocka_unit_test(transpose_edges),
        cmocka_unit_test(convert_edges),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
