/* Non-finite data: NaN or Inf in one batch element never reaches another's
 * output; keys hidden by lengths are never read, so NaN there is harmless;
 * masking alone never creates NaN. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

enum { B = 3, S = 19, E = 40, H = 4, DH = 10 };

static void batch_isolation(void **state)
{
    (void)state;
    rng r = {51};
    test_layer t;
    test_layer_init(&t, &r, H, 0, DH, E, 0, 0, E, 1);
    const size_t n = (size_t)B * S * E;
    float *x = rand_floats(&r, (int64_t)n, -1, 1), *clean = malloc(n * sizeof(float));
    float *dirty = malloc(n * sizeof(float));
    assert_int_equal(mha_layer_forward(t.layer, x, x, x, B, S, S, NULL, clean, NULL, 0), MHA_OK);
    const float poison[] = {NAN, INFINITY, -INFINITY};
    for (int p = 0; p < 3; p++) {
        float *y = malloc(n * sizeof(float));
        memcpy(y, x, n * sizeof(float));
        y[1 * S * E + 5 * E + 3] = poison[p]; /* batch 1, token 5 */
        assert_int_equal(mha_layer_forward(t.layer, y, y, y, B, S, S, NULL, dirty, NULL, 0), MHA_OK);
        /* batches 0 and 2 keep their bits */
        assert_memory_equal(dirty, clean, (size_t)S * E * sizeof(float));
        assert_memory_equal(dirty + 2 * S * E, clean + 2 * S * E, (size_t)S * E * sizeof(float));
        free(y);
    }
    free(x);
    free(clean);
    free(dirty);
    test_layer_free(&t);
}

static void hidden_keys_never_read(void **state)
{
    (void)state;
    rng r = {52};
    const mha_attn_dims d = {B, H, 2, S, 45, DH};
    const int64_t nq = (int64_t)B * H * S * DH, nkv = (int64_t)B * 2 * 45 * DH;
    float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nkv, -1, 1);
    float *v = rand_floats(&r, nkv, -1, 1);
    const int32_t kl[B] = {45, 20, 1};
    float *clean = malloc(sizeof(float) * nq), *dirty = malloc(sizeof(float) * nq);
    const mha_mask masks[] = {{.key_lens = kl}, {.key_lens = kl, .causal = 1}};
    for (int m = 0; m < 2; m++) {
        assert_int_equal(mha_attention(&d, q, k, v, 0.3f, &masks[m], clean, MHA_LAYOUT_BHSD),
                         MHA_OK);
        float *k2 = malloc(sizeof(float) * nkv), *v2 = malloc(sizeof(float) * nkv);
        memcpy(k2, k, sizeof(float) * nkv);
        memcpy(v2, v, sizeof(float) * nkv);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < 2; h++)
                for (int j = kl[b]; j < 45; j++)
                    for (int e = 0; e < DH; e++) {
                        k2[((b * 2 + h) * 45 + j) * DH + e] = NAN;
                        v2[((b * 2 + h) * 45 + j) * DH + e] = INFINITY;
                    }
        assert_int_equal(mha_attention(&d, q, k2, v2, 0.3f, &masks[m], dirty, MHA_LAYOUT_BHSD),
                         MHA_OK);
        assert_memory_equal(clean, dirty, sizeof(float) * nq);
        free(k2);
        free(v2);
    }
    free(q);
    free(k);
    free(v);
    free(clean);
    free(dirty);
}

/* Huge finite scores, all-masked rows and -inf biases: never NaN. */
static void masking_creates_no_nan(void **state)
{
    (void)state;
    rng r = {53};
    const mha_attn_dims d = {2, 2, 2, 9, 33, 16};
    const int64_t nq = 2 * 2 * 9 * 16, nkv = 2 * 2 * 33 * 16;
    float *q = rand_floats(&r, nq, -1e3f, 1e3f), *k = rand_floats(&r, nkv, -1e3f, 1e3f);
    float *v = rand_floats(&r, nkv, -1, 1), *out = malloc(sizeof(float) * nq);
    float *bias = filled_floats(2 * 33, -INFINITY);
    for (int j = 0; j < 33; j += 5)
        bias[33 + j] = 0.0f; /* batch 0 all -inf, batch 1 every fifth key visible */
    const int32_t kl[2] = {0, 33};
    const mha_mask masks[] = {{.key_lens = kl}, {.bias = bias, .bias_stride_b = 33},
                              {.bias = bias, .bias_stride_b = 33, .causal = 1}};
    for (int m = 0; m < 3; m++) {
        assert_int_equal(mha_attention(&d, q, k, v, 1.0f, &masks[m], out, MHA_LAYOUT_BSHD), MHA_OK);
        for (int64_t i = 0; i < nq; i++)
            assert_true(isfinite(out[i]));
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(bias);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batch_isolation),
        cmocka_unit_test(hidden_keys_never_read),
        cmocka_unit_test(masking_creates_no_nan),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
