/* The active ISA against cases worked on paper and against a float64 evaluation
 * of the math: softmax of two keys, masks leaving one key, fully masked rows,
 * the seeds' d2l and BERT modules, GQA, v_head_dim != head_dim, both layouts,
 * head split and merge. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

/* Tolerance of the active ISA against float64: the scalar reference's, plus the
   ISA-vs-scalar allowance for optimized kernels. */
static double tol(void)
{
    return mha_isa_active() == MHA_ISA_SCALAR ? TOL_REF : TOL_REF + TOL_ISA;
}

/* 1 head, dh 1, two keys with scores 0 and ln 3: weights 1/4 and 3/4. */
static void two_key_softmax(void **state)
{
    (void)state;
    const mha_attn_dims d = {1, 1, 1, 1, 2, 1, 0, MHA_F32};
    const float q = 1.0f, k[2] = {0.0f, logf(3.0f)}, v[2] = {10.0f, 20.0f};
    float out = -1.0f;
    assert_int_equal(mha_attention(&d, &q, k, v, 1.0f, NULL, &out, MHA_LAYOUT_BHSD), MHA_OK);
    assert_float_equal(out, 17.5f, 1e-5f);
}

/* Two heads of dh 2 over three keys; each mask kind leaves exactly key 1
   visible, so every output row is v[1]. */
static void masks_leaving_one_key(void **state)
{
    (void)state;
    const mha_attn_dims d = {1, 2, 2, 2, 3, 2, 0, MHA_F32};
    rng r = {1};
    float *q = rand_floats(&r, 8, -1, 1), *k = rand_floats(&r, 12, -1, 1);
    float *v = rand_floats(&r, 12, -1, 1);
    float bias[2 * 3] = {-INFINITY, 0.0f, -INFINITY, -INFINITY, 0.0f, -INFINITY};
    const int32_t qkl[2] = {2, 2};
    /* query_key_lens keeps keys 0-1, bias hides keys 0 and 2 */
    mha_mask m1 = {.query_key_lens = qkl, .bias = bias, .bias_stride_q = 3};
    /* causal with Sq 2, Skv 3: row 0 sees keys 0-1; bias (broadcast over rows) hides key 0 */
    float bias0[3] = {-INFINITY, 0.0f, 0.0f};
    mha_mask m2 = {.causal = 1, .bias = bias0};
    const mha_mask *masks[2] = {&m1, &m2};
    for (int t = 0; t < 2; t++) {
        float out[8];
        assert_int_equal(mha_attention(&d, q, k, v, 0.5f, masks[t], out, MHA_LAYOUT_BHSD), MHA_OK);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < (t ? 1 : 2); i++)
                for (int e = 0; e < 2; e++)
                    assert_float_equal(out[(h * 2 + i) * 2 + e], v[(h * 3 + 1) * 2 + e], 1e-6f);
    }
    free(q);
    free(k);
    free(v);
}

/* Rows with no visible key give zeros, never NaN: key_lens 0, a -inf bias row,
   and causal rows above the first key when Sq > Skv. */
static void fully_masked_rows_are_zero(void **state)
{
    (void)state;
    const mha_attn_dims d = {2, 1, 1, 5, 3, 4, 0, MHA_F32};
    rng r = {2};
    float *q = rand_floats(&r, 40, -1, 1), *k = rand_floats(&r, 24, -1, 1);
    float *v = rand_floats(&r, 24, -1, 1);
    const int32_t key_lens[2] = {0, 3};
    float *bias = filled_floats(2 * 5 * 3, 0.0f);
    for (int j = 0; j < 3; j++)
        bias[(1 * 5 + 4) * 3 + j] = -INFINITY; /* batch 1, row 4 */
    mha_mask m = {.key_lens = key_lens, .bias = bias, .bias_stride_b = 15, .bias_stride_q = 3,
                  .causal = 1};
    float out[40];
    assert_int_equal(mha_attention(&d, q, k, v, 0.5f, &m, out, MHA_LAYOUT_BHSD), MHA_OK);
    for (int i = 0; i < 40; i++)
        assert_false(isnan(out[i]));
    for (int i = 0; i < 20; i++) /* batch 0: key_lens 0 */
        assert_true(out[i] == 0.0f);
    for (int i = 0; i < 2; i++) /* batch 1, rows 0-1: causal diagonal below key 0 */
        for (int e = 0; e < 4; e++)
            assert_true(out[20 + i * 4 + e] == 0.0f);
    for (int e = 0; e < 4; e++) /* batch 1, row 2: only key 0 */
        assert_float_equal(out[20 + 2 * 4 + e], v[12 + e], 1e-6f);
    for (int e = 0; e < 4; e++) /* batch 1, row 4: all -inf */
        assert_true(out[20 + 4 * 4 + e] == 0.0f);
    free(q);
    free(k);
    free(v);
    free(bias);
}

/* Attention over every mask kind, GQA, v_head_dim (0, below and above head_dim) and
   both layouts against float64. */
static void attention_vs_float64(void **state)
{
    (void)state;
    rng r = {3};
    const mha_attn_dims shapes[] = {
        {2, 4, 4, 7, 9, 20, 0, MHA_F32},      {1, 4, 2, 33, 70, 64, 0, MHA_F32},   {3, 6, 1, 5, 5, 8, 0, MHA_F32},
        {1, 2, 2, 17, 130, 80, 0, MHA_F32},   {2, 4, 2, 7, 9, 20, 12, MHA_F32},    {1, 4, 1, 33, 70, 64, 96, MHA_F32},
        {1, 2, 2, 17, 130, 65, 7, MHA_F32},   {2, 3, 3, 5, 75, 1, 17, MHA_F32},    {1, 8, 2, 3, 40, 192, 128, MHA_F32},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const mha_attn_dims d = shapes[s];
        const int32_t dv = d.v_head_dim ? d.v_head_dim : d.head_dim;
        const int64_t nq = (int64_t)d.batch * d.heads * d.seq_q * d.head_dim;
        const int64_t nkv = (int64_t)d.batch * d.kv_heads * d.seq_kv * d.head_dim;
        const int64_t nv = (int64_t)d.batch * d.kv_heads * d.seq_kv * dv;
        const int64_t no = (int64_t)d.batch * d.heads * d.seq_q * dv;
        float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nkv, -1, 1);
        float *v = rand_floats(&r, nv, -1, 1);
        int32_t *kl = malloc(sizeof(int32_t) * d.batch);
        int32_t *qkl = malloc(sizeof(int32_t) * d.batch * d.seq_q);
        for (int b = 0; b < d.batch; b++)
            kl[b] = 1 + (b * 5) % d.seq_kv;
        for (int i = 0; i < d.batch * d.seq_q; i++)
            qkl[i] = (i * 7) % (d.seq_kv + 1);
        float *bias = rand_floats(&r, (int64_t)d.batch * d.heads * d.seq_q * d.seq_kv, -2, 2);
        bias[0] = -INFINITY;
        const int64_t sh = (int64_t)d.seq_q * d.seq_kv;
        const mha_mask masks[] = {
            {0},
            {.key_lens = kl},
            {.query_key_lens = qkl},
            {.causal = 1},
            {.bias = bias, .bias_stride_b = sh * d.heads, .bias_stride_h = sh,
             .bias_stride_q = d.seq_kv},
            {.bias = bias, .bias_stride_b = d.seq_kv}, /* BERT [B,1,1,S] */
            {.key_lens = kl, .query_key_lens = qkl, .causal = 1, .bias = bias,
             .bias_stride_b = d.seq_kv},
        };
        float *out = malloc(sizeof(float) * no);
        double *ref = malloc(sizeof(double) * no);
        const float scale = 1.0f / sqrtf((float)d.head_dim);
        for (size_t m = 0; m < sizeof masks / sizeof *masks; m++)
            for (int layout = 0; layout < 2; layout++) {
                assert_int_equal(mha_attention(&d, q, k, v, scale, &masks[m], out,
                                               (mha_layout)layout), MHA_OK);
                ref_attention(&d, q, k, v, scale, &masks[m], ref, (mha_layout)layout);
                double worst = tol_ratio(out, ref, no, tol());
                if (worst > 1.0)
                    fail_msg("shape %zu mask %zu layout %d: error %.3g x tolerance", s, m, layout,
                             worst);
            }
        free(q);
        free(k);
        free(v);
        free(kl);
        free(qkl);
        free(bias);
        free(out);
        free(ref);
    }
}

static void check_layer(test_layer *t, rng *r, int32_t B, int32_t Sq, int32_t Skv, int self,
                        const mha_mask *mask, double tolerance)
{
    const mha_layer_desc *d = &t->desc;
    const int32_t width = d->out_dim > 0 ? d->out_dim : d->heads * t->dv;
    float *query = rand_floats(r, (int64_t)B * Sq * d->q_in, -1, 1);
    float *key = self ? query : rand_floats(r, (int64_t)B * Skv * t->k_in, -1, 1);
    float *value = self ? query : rand_floats(r, (int64_t)B * Skv * t->v_in, -1, 1);
    const int64_t n = (int64_t)B * Sq * width;
    float *out = filled_floats(n, NAN), *out_ws = filled_floats(n, NAN);
    double *ref = malloc(sizeof(double) * n);
    assert_int_equal(mha_layer_forward(t->layer, query, key, value, B, Sq, Skv, mask, out, NULL, 0),
                     MHA_OK);
    ref_layer(&t->desc, query, key, value, B, Sq, Skv, mask, ref);
    double worst = tol_ratio(out, ref, n, tolerance);
    if (worst > 1.0)
        fail_msg("layer B=%d Sq=%d Skv=%d: error %.3g x tolerance", B, Sq, Skv, worst);

    /* A caller workspace gives the same bits. */
    size_t ws_bytes = mha_layer_workspace_size(t->layer, B, Sq, Skv);
    assert_true(ws_bytes > 0);
    void *ws = malloc(ws_bytes);
    assert_int_equal(mha_layer_forward(t->layer, query, key, value, B, Sq, Skv, mask, out_ws, ws,
                                       ws_bytes), MHA_OK);
    assert_memory_equal(out, out_ws, (size_t)n * sizeof(float));
    free(ws);
    if (!self) {
        free(key);
        free(value);
    }
    free(query);
    free(out);
    free(out_ws);
    free(ref);
}

/* d2l: MultiHeadAttention(100, 100, 100, 100, num_heads=5), no bias, X (2, 4, 100),
   Y (2, 6, 100) as keys and values, valid_lens [3, 2] and a (B, Sq) version. */
static void seed_d2l(void **state)
{
    (void)state;
    rng r = {4};
    test_layer t;
    test_layer_init(&t, &r, 5, 0, 20, 100, 100, 100, 100, 0);
    const int32_t valid_lens[2] = {3, 2};
    const mha_mask m = {.key_lens = valid_lens};
    float *x = filled_floats(2 * 4 * 100, 1.0f), *y = filled_floats(2 * 6 * 100, 1.0f);
    float out[2 * 4 * 100];
    assert_int_equal(mha_layer_forward(t.layer, x, y, y, 2, 4, 6, &m, out, NULL, 0), MHA_OK);
    double ref[2 * 4 * 100];
    ref_layer(&t.desc, x, y, y, 2, 4, 6, &m, ref);
    assert_true(tol_ratio(out, ref, 800, tol()) <= 1.0);
    free(x);
    free(y);

    const int32_t qkl[2 * 4] = {1, 2, 3, 4, 6, 5, 4, 3};
    const mha_mask m2 = {.query_key_lens = qkl};
    check_layer(&t, &r, 2, 4, 6, 0, &m, tol());
    check_layer(&t, &r, 2, 4, 6, 0, &m2, tol());
    test_layer_free(&t);
}

/* BERT SelfAttention: hidden 768, 12 heads, biases, no output projection,
   additive mask [B,1,1,S] of 0 and -10000. */
static void seed_bert(void **state)
{
    (void)state;
    rng r = {5};
    test_layer t;
    test_layer_init(&t, &r, 12, 0, 64, 768, 0, 0, 0, 1);
    const int32_t B = 2, S = 19;
    float bias[2 * 19];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++)
            bias[b * S + j] = j < S - 4 * b ? 0.0f : -10000.0f;
    const mha_mask m = {.bias = bias, .bias_stride_b = S};
    check_layer(&t, &r, B, S, S, 1, &m, tol());
    test_layer_free(&t);
}

/* Layers in every configuration: GQA, v_head_dim, cross attention with other
   widths, with and without output projection and biases. */
static void layers_vs_float64(void **state)
{
    (void)state;
    rng r = {6};
    struct {
        int32_t heads, kv_heads, dh, dv, q_in, k_in, v_in, out_dim, bias, B, Sq, Skv, self;
    } cases[] = {
        {4, 2, 16, 0, 48, 0, 0, 40, 1, 2, 9, 9, 1},
        {3, 0, 20, 0, 30, 24, 17, 0, 0, 2, 5, 11, 0},
        {8, 1, 8, 0, 64, 0, 0, 64, 1, 1, 33, 33, 1},
        {2, 0, 80, 0, 100, 50, 0, 7, 1, 3, 4, 2, 0},
        {1, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1},
        {4, 2, 16, 24, 48, 0, 0, 40, 1, 2, 9, 9, 1},
        {3, 0, 20, 7, 30, 24, 17, 0, 0, 2, 5, 11, 0},
        {4, 1, 192, 128, 64, 0, 0, 50, 1, 1, 6, 6, 1},
        {2, 2, 7, 65, 33, 20, 0, 0, 1, 2, 3, 8, 0},
        {1, 0, 1, 3, 5, 0, 0, 2, 0, 1, 4, 4, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        test_layer t;
        test_layer_init_v(&t, &r, cases[c].heads, cases[c].kv_heads, cases[c].dh, cases[c].dv,
                          cases[c].q_in, cases[c].k_in, cases[c].v_in, cases[c].out_dim,
                          cases[c].bias);
        int32_t kl[3] = {1, cases[c].Skv, cases[c].Skv / 2 + 1};
        const mha_mask causal = {.causal = 1}, lens = {.key_lens = kl};
        check_layer(&t, &r, cases[c].B, cases[c].Sq, cases[c].Skv, cases[c].self, NULL, tol());
        check_layer(&t, &r, cases[c].B, cases[c].Sq, cases[c].Skv, cases[c].self, &causal, tol());
        check_layer(&t, &r, cases[c].B, cases[c].Sq, cases[c].Skv, cases[c].self, &lens, tol());
        test_layer_free(&t);
    }
}

/* mha_qkv_project writes head-major Q [B][H][S][dh], K [B][Hkv][S][dh] and
   V [B][Hkv][S][dv] whether fused or not, GQA and v_head_dim included. */
static void qkv_project_head_major(void **state)
{
    (void)state;
    rng r = {7};
    const int32_t cases[][4] = {{3, 0, 20, 0}, {4, 2, 16, 24}, {2, 1, 64, 7}, {3, 3, 5, 1}};
    const int32_t B = 2, S = 5, E = 30;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        test_layer t;
        test_layer_init_v(&t, &r, cases[c][0], cases[c][1], cases[c][2], cases[c][3], E, 0, 0, 0,
                          1);
        const int32_t heads[3] = {cases[c][0], t.kv_heads, t.kv_heads};
        const int32_t dims[3] = {cases[c][2], cases[c][2], t.dv};
        float *x = rand_floats(&r, B * S * E, -1, 1), *y = rand_floats(&r, B * S * E, -1, 1);
        float *outs[3];
        for (int p = 0; p < 3; p++)
            outs[p] = malloc(sizeof(float) * B * S * heads[p] * dims[p]);
        double *lin = malloc(sizeof(double) * B * S * heads[0] * (dims[0] + dims[2]));
        /* self: x for all three; cross with value != key: y for keys, x for values */
        for (int mode = 0; mode < 2; mode++) {
            const float *key = mode ? y : x;
            assert_int_equal(mha_qkv_project(t.layer, x, key, x, B, S, S, outs[0], outs[1],
                                             outs[2]), MHA_OK);
            const float *srcs[3] = {x, key, x}, *ws[3] = {t.w_q, t.w_k, t.w_v};
            const float *bs[3] = {t.b_q, t.b_k, t.b_v};
            for (int p = 0; p < 3; p++) {
                const int32_t n = heads[p] * dims[p], dp = dims[p];
                for (int b = 0; b < B; b++)
                    for (int s = 0; s < S; s++)
                        for (int o = 0; o < n; o++) {
                            double acc = bs[p][o];
                            for (int i = 0; i < E; i++)
                                acc += (double)srcs[p][(b * S + s) * E + i] * ws[p][o * E + i];
                            lin[((b * heads[p] + o / dp) * S + s) * dp + o % dp] = acc;
                        }
                if (tol_ratio(outs[p], lin, B * S * n, tol()) > 1.0)
                    fail_msg("qkv case %zu mode %d: projection %d off", c, mode, p);
            }
        }
        free(x);
        free(y);
        for (int p = 0; p < 3; p++)
            free(outs[p]);
        free(lin);
        test_layer_free(&t);
    }
}

/* Split moves element (b, s, h, e) to (b, h, s, e); merge undoes it exactly. */
static void split_merge(void **state)
{
    (void)state;
    /* Small matrices go through the kernel's tile; larger than 256 KiB per batch,
       through the driver's parallel cycle following (long cycles for prime S,
       segments, and the tile-first pass for elements under 128 bytes). */
    const int32_t shapes[][4] = {{1, 1, 1, 1},      {2, 5, 3, 4},      {1, 7, 16, 20},
                                 {3, 13, 12, 64},   {1, 128, 12, 1},   {2, 1, 5, 8},
                                 {1, 17, 1, 3},     {2, 33, 9, 130},   {1, 1031, 12, 8},
                                 {2, 300, 16, 20},  {1, 4099, 3, 64},  {1, 70001, 2, 1},
                                 {1, 2048, 16, 32}, {3, 509, 12, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int32_t B = shapes[s][0], S = shapes[s][1], H = shapes[s][2], D = shapes[s][3];
        const int64_t n = (int64_t)B * S * H * D;
        float *x = malloc(sizeof(float) * n), *orig = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++)
            x[i] = orig[i] = (float)i;
        assert_int_equal(mha_heads_split(x, B, S, H, D), MHA_OK);
        for (int32_t b = 0; b < B; b++)
            for (int32_t si = 0; si < S; si++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t e = 0; e < D; e++)
                        assert_true(x[(((int64_t)b * H + h) * S + si) * D + e]
                                    == orig[(((int64_t)b * S + si) * H + h) * D + e]);
        assert_int_equal(mha_heads_merge(x, B, S, H, D), MHA_OK);
        assert_memory_equal(x, orig, (size_t)n * sizeof(float));
        free(x);
        free(orig);
    }
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_key_softmax),
        cmocka_unit_test(masks_leaving_one_key),
        cmocka_unit_test(fully_masked_rows_are_zero),
        cmocka_unit_test(attention_vs_float64),
        cmocka_unit_test(seed_d2l),
        cmocka_unit_test(seed_bert),
        cmocka_unit_test(layers_vs_float64),
        cmocka_unit_test(qkv_project_head_major),
        cmocka_unit_test(split_merge),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
