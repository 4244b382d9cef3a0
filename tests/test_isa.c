/* The active ISA against the scalar reference (forced with mha_isa_force) over
 * shapes that hit every tail of every tile: tokens 1..33, head_dim 8..128,
 * v_head_dim 1..192 below and above head_dim, reduction lengths around the
 * unroll and the cache block, seq_kv 1..145 and 4096, every mask kind, GQA,
 * both layouts. Under MHA_ISA=scalar the two sides
 * coincide and the suite checks the drivers only. MHA_TEST_QUICK=1 (used under
 * valgrind) keeps the sweeps' edges and drops their middles. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

static mha_isa isa;
static int quick;

/* In quick mode, n is swept only near the tile edges of 8 and 16. */
static int skip_quick(int32_t n)
{
    return quick && n > 17 && n % 16 > 1 && n % 16 != 15;
}

static void use_scalar(void)
{
    assert_int_equal(mha_isa_force(MHA_ISA_SCALAR), MHA_OK);
}

static void use_isa(void)
{
    assert_int_equal(mha_isa_force(isa), MHA_OK);
}

static const int32_t head_dims[] = {8, 20, 64, 80, 128};
#define NDH (sizeof head_dims / sizeof *head_dims)

/* v_head_dims[i] goes with head_dims[i] in the sweeps that vary dv: below, above,
   odd, and tails of every panel width. */
static const int32_t v_head_dims[] = {7, 65, 96, 17, 64};

static void qkv_projection_tails(void **state)
{
    (void)state;
    rng r = {11};
    const int32_t ks[] = {1, 7, 8, 9, 100, 768, 1500};
    const int32_t seqs[] = {1, 2, 5, 6, 7, 8, 9, 12, 13, 17, 24, 31, 32, 33};
    for (size_t di = 0; di < NDH; di++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            const int32_t dh = head_dims[di], K = ks[ki], heads = 1 + (int32_t)(ki + di) % 3;
            const int32_t dv = ki % 2 ? v_head_dims[di] : dh; /* every other K: dv != dh */
            test_layer t;
            test_layer_init_v(&t, &r, heads, 0, dh, dv, K, 0, 0, 0, (int)(ki % 3 == 0));
            for (size_t si = 0; si < sizeof seqs / sizeof *seqs; si++) {
                const int32_t S = seqs[si];
                if ((K >= 768 && S % 4 != 1) || (quick && K >= 768) || skip_quick(S))
                    continue; /* long reductions: a few token tails suffice */
                const int64_t n = (int64_t)S * heads * dh, nv = (int64_t)S * heads * dv;
                const int64_t all = 2 * n + nv;
                float *x = rand_floats(&r, (int64_t)S * K, -1, 1);
                float *got = malloc(sizeof(float) * all), *want = malloc(sizeof(float) * all);
                use_isa();
                assert_int_equal(mha_qkv_project(t.layer, x, x, x, 1, S, S, got, got + n,
                                                 got + 2 * n), MHA_OK);
                use_scalar();
                assert_int_equal(mha_qkv_project(t.layer, x, x, x, 1, S, S, want, want + n,
                                                 want + 2 * n), MHA_OK);
                use_isa();
                double worst = tol_ratio_f(got, want, all, TOL_ISA);
                if (worst > 1.0)
                    fail_msg("qkv dh=%d dv=%d K=%d S=%d: %.3g x tolerance", dh, dv, K, S, worst);
                free(x);
                free(got);
                free(want);
            }
            test_layer_free(&t);
        }
}

/* One attention call on the active ISA and on scalar; returns error / tolerance. */
static double attention_ratio(const mha_attn_dims *d, rng *r, const mha_mask *mask,
                              mha_layout layout)
{
    const int32_t dv = d->v_head_dim ? d->v_head_dim : d->head_dim;
    const int64_t nq = (int64_t)d->batch * d->heads * d->seq_q * d->head_dim;
    const int64_t nkv = (int64_t)d->batch * d->kv_heads * d->seq_kv * d->head_dim;
    const int64_t nv = (int64_t)d->batch * d->kv_heads * d->seq_kv * dv;
    const int64_t no = (int64_t)d->batch * d->heads * d->seq_q * dv;
    float *q = rand_floats(r, nq, -1, 1), *k = rand_floats(r, nkv, -1, 1);
    float *v = rand_floats(r, nv, -1, 1);
    float *got = malloc(sizeof(float) * no), *want = malloc(sizeof(float) * no);
    const float scale = 1.0f / sqrtf((float)d->head_dim);
    assert_int_equal(mha_attention(d, q, k, v, scale, mask, got, layout), MHA_OK);
    use_scalar();
    assert_int_equal(mha_attention(d, q, k, v, scale, mask, want, layout), MHA_OK);
    use_isa();
    double worst = tol_ratio_f(got, want, no, TOL_ISA);
    free(q);
    free(k);
    free(v);
    free(got);
    free(want);
    return worst;
}

static void attention_kv_tails(void **state)
{
    (void)state;
    rng r = {12};
    const int32_t seq_qs[] = {1, 5, 33};
    for (size_t di = 0; di < NDH; di++)
        for (int32_t skv = 1; skv <= 70; skv++)
            for (size_t qi = 0; qi < 3 && !skip_quick(skv); qi++) {
                /* dv = dh for Sq 1 and 33, v_head_dims[di] for Sq 5 */
                const int32_t dv = qi == 1 ? v_head_dims[di] : 0;
                const mha_attn_dims d = {1, 2, 1, seq_qs[qi], skv, head_dims[di], dv, MHA_F32};
                const mha_mask causal = {.causal = 1};
                const mha_mask *mask = (skv + (int32_t)qi) % 2 ? &causal : NULL;
                double worst = attention_ratio(&d, &r, mask, (mha_layout)(skv % 2));
                if (worst > 1.0)
                    fail_msg("attention dh=%d dv=%d Sq=%d Skv=%d: %.3g x tolerance",
                             head_dims[di], dv, seq_qs[qi], skv, worst);
            }
}

static void attention_masks(void **state)
{
    (void)state;
    rng r = {13};
    const mha_attn_dims shapes[] = {{2, 4, 2, 37, 45, 64, 0, MHA_F32},   {3, 3, 3, 6, 70, 20, 0, MHA_F32},
                                    {1, 8, 1, 65, 33, 80, 0, MHA_F32},   {2, 2, 1, 1, 129, 128, 0, MHA_F32},
                                    {2, 4, 1, 17, 75, 192, 128, MHA_F32}, {1, 8, 2, 9, 70, 7, 65, MHA_F32},
                                    {3, 2, 2, 33, 20, 64, 96, MHA_F32},  {1, 4, 4, 100, 145, 65, 1, MHA_F32}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const mha_attn_dims d = shapes[s];
        int32_t kl[3], *qkl = malloc(sizeof(int32_t) * d.batch * d.seq_q);
        for (int b = 0; b < d.batch; b++)
            kl[b] = (b * 17 + 3) % (d.seq_kv + 1);
        for (int i = 0; i < d.batch * d.seq_q; i++)
            qkl[i] = (i * 13 + 1) % (d.seq_kv + 1);
        const int64_t sh = (int64_t)d.seq_q * d.seq_kv;
        float *bias = rand_floats(&r, d.batch * d.heads * sh, -3, 3);
        for (int64_t i = 0; i < d.batch * d.heads * sh; i += 7)
            bias[i] = -INFINITY;
        const mha_mask masks[] = {
            {.key_lens = kl},
            {.query_key_lens = qkl},
            {.causal = 1},
            {.bias = bias, .bias_stride_b = sh * d.heads, .bias_stride_h = sh,
             .bias_stride_q = d.seq_kv},
            {.bias = bias, .bias_stride_b = d.seq_kv},
            {.bias = bias, .bias_stride_h = d.seq_kv, .causal = 1, .key_lens = kl},
            {.key_lens = kl, .query_key_lens = qkl, .causal = 1, .bias = bias,
             .bias_stride_q = d.seq_kv},
        };
        for (size_t m = 0; m < sizeof masks / sizeof *masks; m++)
            for (int layout = 0; layout < 2; layout++) {
                double worst = attention_ratio(&d, &r, &masks[m], (mha_layout)layout);
                if (worst > 1.0)
                    fail_msg("shape %zu mask %zu layout %d: %.3g x tolerance", s, m, layout,
                             worst);
            }
        free(qkl);
        free(bias);
    }
}

static void attention_long(void **state)
{
    (void)state;
    rng r = {14};
    const mha_attn_dims d = {1, 2, 1, 40, quick ? 1025 : 4096, 64, 0, MHA_F32};
    const mha_attn_dims dv = {1, 2, 1, 40, quick ? 1025 : 4096, 192, 128, MHA_F32};
    const mha_mask causal = {.causal = 1};
    assert_true(attention_ratio(&d, &r, NULL, MHA_LAYOUT_BHSD) <= 1.0);
    assert_true(attention_ratio(&d, &r, &causal, MHA_LAYOUT_BSHD) <= 1.0);
    assert_true(attention_ratio(&dv, &r, &causal, MHA_LAYOUT_BHSD) <= 1.0);
}

static void layer_forward(void **state)
{
    (void)state;
    rng r = {15};
    struct {
        int32_t heads, kv_heads, dh, dv, q_in, k_in, out_dim, B, Sq, Skv, self;
    } cases[] = {{12, 0, 64, 0, 768, 0, 768, 2, 31, 31, 1}, {8, 2, 20, 0, 100, 60, 50, 3, 7, 13, 0},
                 {5, 0, 20, 0, 100, 0, 0, 2, 4, 6, 0},      {4, 4, 128, 0, 33, 0, 17, 1, 1, 70, 0},
                 {8, 2, 192, 128, 96, 0, 96, 2, 9, 9, 1},   {4, 1, 24, 65, 50, 30, 0, 3, 5, 17, 0},
                 {6, 3, 65, 7, 40, 0, 33, 1, 33, 33, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        test_layer t;
        test_layer_init_v(&t, &r, cases[c].heads, cases[c].kv_heads, cases[c].dh, cases[c].dv,
                          cases[c].q_in, cases[c].k_in, 0, cases[c].out_dim, (int)(c % 2 == 0));
        const int32_t B = cases[c].B, Sq = cases[c].Sq, Skv = cases[c].Skv;
        float *query = rand_floats(&r, (int64_t)B * Sq * cases[c].q_in, -1, 1);
        float *key = cases[c].self ? query : rand_floats(&r, (int64_t)B * Skv * t.k_in, -1, 1);
        const int32_t width = cases[c].out_dim ? cases[c].out_dim : cases[c].heads * t.dv;
        const int64_t n = (int64_t)B * Sq * width;
        float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        int32_t kl[3] = {Skv, 1, Skv / 2};
        const mha_mask mask = {.key_lens = kl, .causal = (int32_t)(c % 2)};
        assert_int_equal(mha_layer_forward(t.layer, query, key, key, B, Sq, Skv, &mask, got,
                                           NULL, 0), MHA_OK);
        use_scalar();
        assert_int_equal(mha_layer_forward(t.layer, query, key, key, B, Sq, Skv, &mask, want,
                                           NULL, 0), MHA_OK);
        use_isa();
        double worst = tol_ratio_f(got, want, n, TOL_ISA);
        if (worst > 1.0)
            fail_msg("layer case %zu: %.3g x tolerance", c, worst);
        if (!cases[c].self)
            free(key);
        free(query);
        free(got);
        free(want);
        test_layer_free(&t);
    }
}

static void transpose_equal(void **state)
{
    (void)state;
    for (int32_t S = 1; S <= 17; S += 4)
        for (int32_t H = 1; H <= 17; H += 3)
            for (int32_t D = 1; D <= 130; D += 43) {
                const int64_t n = 2LL * S * H * D;
                float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
                for (int64_t i = 0; i < n; i++)
                    a[i] = b[i] = (float)i;
                assert_int_equal(mha_heads_split(a, 2, S, H, D), MHA_OK);
                use_scalar();
                assert_int_equal(mha_heads_split(b, 2, S, H, D), MHA_OK);
                use_isa();
                assert_memory_equal(a, b, (size_t)n * sizeof(float));
                assert_int_equal(mha_heads_merge(a, 2, S, H, D), MHA_OK);
                for (int64_t i = 0; i < n; i++)
                    assert_true(a[i] == (float)i);
                free(a);
                free(b);
            }
}

int main(void)
{
    require_env_isa();
    isa = mha_isa_active();
    quick = getenv("MHA_TEST_QUICK") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qkv_projection_tails), cmocka_unit_test(attention_kv_tails),
        cmocka_unit_test(attention_masks),      cmocka_unit_test(attention_long),
        cmocka_unit_test(layer_forward),        cmocka_unit_test(transpose_equal),
    };
    return cmocka_run_group_tests_name(mha_isa_name(isa), tests, NULL, NULL);
}
