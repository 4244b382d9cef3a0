/* Every kernel family on tail shapes with each input and output buffer flush
 * against a PROT_NONE page, at the end and then at the start: one float read or
 * written out of bounds crashes the suite. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "guard.h"

static float *guarded_copy(const float *src, size_t n, guard_side side)
{
    float *p = guard_alloc(n, side);
    memcpy(p, src, n * sizeof(float));
    return p;
}

static void attention_guarded(void **state)
{
    (void)state;
    rng r = {31};
    const mha_attn_dims shapes[] = {{1, 1, 1, 1, 1, 1, 0, MHA_F32},    {1, 2, 1, 7, 33, 20, 0, MHA_F32},
                                    {2, 3, 3, 13, 17, 8, 0, MHA_F32},  {1, 2, 2, 5, 70, 80, 0, MHA_F32},
                                    {1, 1, 1, 33, 65, 128, 0, MHA_F32}, {1, 4, 2, 3, 9, 3, 0, MHA_F32}};
    for (int side = 0; side < 2; side++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const mha_attn_dims d = shapes[s];
            const size_t nq = (size_t)d.batch * d.heads * d.seq_q * d.head_dim;
            const size_t nkv = (size_t)d.batch * d.kv_heads * d.seq_kv * d.head_dim;
            const size_t nbias = (size_t)d.batch * d.heads * d.seq_q * d.seq_kv;
            float *tq = rand_floats(&r, (int64_t)nq, -1, 1), *tk = rand_floats(&r, (int64_t)nkv, -1, 1);
            float *tb = rand_floats(&r, (int64_t)nbias, -1, 1);
            float *q = guarded_copy(tq, nq, (guard_side)side);
            float *k = guarded_copy(tk, nkv, (guard_side)side);
            float *v = guarded_copy(tk, nkv, (guard_side)side);
            float *bias = guarded_copy(tb, nbias, (guard_side)side);
            int32_t *kl = malloc(sizeof(int32_t) * d.batch);
            for (int b = 0; b < d.batch; b++)
                kl[b] = d.seq_kv - b;
            const int64_t sh = (int64_t)d.seq_q * d.seq_kv;
            const mha_mask masks[] = {{0}, {.causal = 1, .key_lens = kl},
                                      {.bias = bias, .bias_stride_b = sh * d.heads,
                                       .bias_stride_h = sh, .bias_stride_q = d.seq_kv}};
            float *out = guard_alloc(nq, (guard_side)side);
            for (size_t m = 0; m < 3; m++)
                for (int layout = 0; layout < 2; layout++)
                    assert_int_equal(mha_attention(&d, q, k, v, 0.3f, &masks[m], out,
                                                   (mha_layout)layout), MHA_OK);
            guard_free(q, nq, (guard_side)side);
            guard_free(k, nkv, (guard_side)side);
            guard_free(v, nkv, (guard_side)side);
            guard_free(bias, nbias, (guard_side)side);
            guard_free(out, nq, (guard_side)side);
            free(tq);
            free(tk);
            free(tb);
            free(kl);
        }
}

static void layer_guarded(void **state)
{
    (void)state;
    rng r = {32};
    struct {
        int32_t heads, kv_heads, dh, q_in, k_in, out_dim, B, Sq, Skv;
    } cases[] = {{1, 0, 1, 1, 0, 1, 1, 1, 1},     {3, 1, 20, 7, 9, 5, 2, 7, 5},
                 {2, 2, 16, 17, 0, 0, 1, 13, 13}, {4, 2, 80, 100, 33, 31, 1, 6, 19}};
    for (int side = 0; side < 2; side++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            test_layer t;
            test_layer_init(&t, &r, cases[c].heads, cases[c].kv_heads, cases[c].dh, cases[c].q_in,
                            cases[c].k_in, 0, cases[c].out_dim, 1);
            const int32_t B = cases[c].B, Sq = cases[c].Sq, Skv = cases[c].Skv;
            const size_t nxq = (size_t)B * Sq * cases[c].q_in, nxk = (size_t)B * Skv * t.k_in;
            const size_t width = cases[c].out_dim ? (size_t)cases[c].out_dim
                                                  : (size_t)cases[c].heads * cases[c].dh;
            const size_t nout = (size_t)B * Sq * width;
            const size_t nq = (size_t)B * Sq * cases[c].heads * cases[c].dh;
            const size_t nkv = (size_t)B * Skv * t.kv_heads * cases[c].dh;
            float *tx = rand_floats(&r, (int64_t)(nxq > nxk ? nxq : nxk), -1, 1);
            float *xq = guarded_copy(tx, nxq, (guard_side)side);
            float *xk = guarded_copy(tx, nxk, (guard_side)side);
            float *out = guard_alloc(nout, (guard_side)side);
            float *q = guard_alloc(nq, (guard_side)side), *k = guard_alloc(nkv, (guard_side)side);
            float *v = guard_alloc(nkv, (guard_side)side);
            const size_t ws_bytes = mha_layer_workspace_size(t.layer, B, Sq, Skv);
            const size_t ws_floats = (ws_bytes + sizeof(float) - 1) / sizeof(float);
            float *ws = guard_alloc(ws_floats, (guard_side)side);
            const mha_mask causal = {.causal = 1};
            assert_int_equal(mha_layer_forward(t.layer, xq, xk, xk, B, Sq, Skv, &causal, out, NULL,
                                               0), MHA_OK);
            assert_int_equal(mha_layer_forward(t.layer, xq, xk, xk, B, Sq, Skv, NULL, out, ws,
                                               ws_bytes), MHA_OK);
            assert_int_equal(mha_qkv_project(t.layer, xq, xk, xk, B, Sq, Skv, q, k, v), MHA_OK);
            if (Sq == Skv) {
                float *xs = guarded_copy(tx, nxq, (guard_side)side);
                assert_int_equal(mha_layer_forward(t.layer, xs, xs, xs, B, Sq, Sq, NULL, out, ws,
                                                   ws_bytes), MHA_OK);
                assert_int_equal(mha_qkv_project(t.layer, xs, xs, xs, B, Sq, Sq, q, k, v), MHA_OK);
                guard_free(xs, nxq, (guard_side)side);
            }
            guard_free(xq, nxq, (guard_side)side);
            guard_free(xk, nxk, (guard_side)side);
            guard_free(out, nout, (guard_side)side);
            guard_free(q, nq, (guard_side)side);
            guard_free(k, nkv, (guard_side)side);
            guard_free(v, nkv, (guard_side)side);
            guard_free(ws, ws_floats, (guard_side)side);
            free(tx);
            test_layer_free(&t);
        }
}

static void transpose_guarded(void **state)
{
    (void)state;
    const int32_t shapes[][4] = {{1, 2, 3, 1},   {2, 5, 3, 7},      {1, 17, 12, 64},
                                 {3, 9, 16, 20}, {1, 33, 5, 130},   {1, 1031, 12, 8},
                                 {1, 70001, 2, 1}, {2, 300, 16, 20}};
    for (int side = 0; side < 2; side++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const size_t n = (size_t)shapes[s][0] * shapes[s][1] * shapes[s][2] * shapes[s][3];
            float *x = guard_alloc(n, (guard_side)side);
            for (size_t i = 0; i < n; i++)
                x[i] = (float)i;
            assert_int_equal(mha_heads_split(x, shapes[s][0], shapes[s][1], shapes[s][2],
                                             shapes[s][3]), MHA_OK);
            assert_int_equal(mha_heads_merge(x, shapes[s][0], shapes[s][1], shapes[s][2],
                                             shapes[s][3]), MHA_OK);
            for (size_t i = 0; i < n; i++)
                assert_true(x[i] == (float)i);
            guard_free(x, n, (guard_side)side);
        }
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attention_guarded),
        cmocka_unit_test(layer_guarded),
        cmocka_unit_test(transpose_guarded),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
