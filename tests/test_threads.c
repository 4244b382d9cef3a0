/* Bitwise determinism: every kernel family gives the same bits with 1, 2, 3
 * and 7 OpenMP threads (thread counts that split the work unevenly). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

static const int thread_counts[] = {1, 2, 3, 7};
#define NT (sizeof thread_counts / sizeof *thread_counts)

static void layer_and_attention(void **state)
{
    (void)state;
    rng r = {21};
    test_layer t;
    test_layer_init(&t, &r, 6, 2, 20, 60, 0, 0, 44, 1);
    const int32_t B = 3, S = 41;
    float *x = rand_floats(&r, B * S * 60, -1, 1);
    int32_t kl[3] = {41, 7, 0};
    const mha_mask masks[] = {{0}, {.key_lens = kl, .causal = 1}};
    const int64_t n = (int64_t)B * S * 44;
    float *first = malloc(sizeof(float) * n), *again = malloc(sizeof(float) * n);
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < NT; i++) {
            set_threads(thread_counts[i]);
            float *dst = i == 0 ? first : again;
            assert_int_equal(mha_layer_forward(t.layer, x, x, x, B, S, S, &masks[m], dst, NULL, 0),
                             MHA_OK);
            if (i > 0)
                assert_memory_equal(first, again, (size_t)n * sizeof(float));
        }

    /* Many blocks; then few blocks over many keys (cut into chunks), dv != dk. */
    const mha_attn_dims dims[] = {{2, 4, 1, 100, 300, 64, 0, MHA_F32}, {1, 8, 2, 1, 6000, 128, 0, MHA_F32},
                                  {1, 4, 1, 3, 3000, 192, 128, MHA_F32}};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        const mha_attn_dims d = dims[di];
        const int32_t dv = d.v_head_dim ? d.v_head_dim : d.head_dim;
        const int64_t nq = (int64_t)d.batch * d.heads * d.seq_q * d.head_dim;
        const int64_t nk = (int64_t)d.batch * d.kv_heads * d.seq_kv * d.head_dim;
        const int64_t nv = nk / d.head_dim * dv, no = nq / d.head_dim * dv;
        float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nk, -1, 1);
        float *v = rand_floats(&r, nv, -1, 1);
        float *o1 = malloc(sizeof(float) * no), *o2 = malloc(sizeof(float) * no);
        const mha_mask causal = {.causal = 1};
        for (int m = 0; m < 2; m++)
            for (size_t i = 0; i < NT; i++) {
                set_threads(thread_counts[i]);
                assert_int_equal(mha_attention(&d, q, k, v, 0.125f, m ? &causal : NULL,
                                               i == 0 ? o1 : o2, MHA_LAYOUT_BSHD), MHA_OK);
                if (i > 0)
                    assert_memory_equal(o1, o2, (size_t)no * sizeof(float));
            }
        free(q);
        free(k);
        free(v);
        free(o1);
        free(o2);
    }
    set_threads(2);
    free(x);
    free(first);
    free(again);
    test_layer_free(&t);
}

static void heads_split(void **state)
{
    (void)state;
    const int32_t B = 5, S = 37, H = 12, D = 20;
    const int64_t n = (int64_t)B * S * H * D;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    for (size_t i = 0; i < NT; i++) {
        float *dst = i == 0 ? a : b;
        for (int64_t j = 0; j < n; j++)
            dst[j] = (float)j;
        set_threads(thread_counts[i]);
        assert_int_equal(mha_heads_split(dst, B, S, H, D), MHA_OK);
        if (i > 0)
            assert_memory_equal(a, b, (size_t)n * sizeof(float));
    }
    set_threads(2);
    free(a);
    free(b);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_and_attention),
        cmocka_unit_test(heads_split),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
