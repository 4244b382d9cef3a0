/* Non-finite data: NaN or Inf in one batch element never reaches another's
 * output; keys hidden by lengths are never read, so NaN there is harmless;
 * masking alone never creates NaN; and the rule of mha.h, row by row: a NaN or
 * Inf that a row reads reaches it as IEEE arithmetic says, what is hidden from
 * it (by any mask kind) never does, whatever its neighbours in a tile see. */
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
    const mha_attn_dims d = {B, H, 2, S, 45, DH, 0, MHA_F32};
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
    const mha_attn_dims d = {2, 2, 2, 9, 33, 16, 0, MHA_F32};
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

/* The class of each element: 'n' NaN, 'i' +-Inf, 'f' finite. */
static char cls(double x)
{
    return isnan(x) ? 'n' : isinf(x) ? 'i' : 'f';
}

/* One poisoned input per case (attention, B=1, H=2, Hkv=1, S=24, dh=20): each
 * row's classes must be those of the float64 reference, which applies the rule
 * directly, and finite elements must agree within tolerance. Prints each row's
 * class ('n' if any element is NaN, else 'i' if any is Inf, else 'f'). */
static void rule_row_by_row(void **state)
{
    (void)state;
    enum { S2 = 24, D2 = 20 };
    const mha_attn_dims d = {1, 2, 1, S2, S2, D2, 0, MHA_F32};
    const int64_t nq = 2 * S2 * D2, nkv = S2 * D2;
    float *bias = filled_floats(2 * S2 * S2, 0.0f);
    for (int h = 0; h < 2; h++)
        bias[(h * S2 + 3) * S2 + 5] = -INFINITY; /* key 5 hidden from row 3 */
    const mha_mask causal = {.causal = 1};
    const mha_mask biased = {.bias = bias, .bias_stride_h = S2 * S2, .bias_stride_q = S2};
    const mha_mask both = {.bias = bias, .bias_stride_h = S2 * S2, .bias_stride_q = S2,
                           .causal = 1};
    struct {
        const char *name;
        char tensor; /* q, k or v */
        int row, col;
        float value;
        const mha_mask *mask;
    } cases[] = {
        {"NaN in q row 0", 'q', 0, 4, NAN, &causal},
        {"Inf in a visible key (k row 3)", 'k', 3, 7, INFINITY, &causal},
        {"Inf in v at a key causality hides from row 0", 'v', 1, 2, INFINITY, &causal},
        {"NaN in v at a key a -inf bias hides from row 3", 'v', 5, 0, NAN, &biased},
        {"NaN in k at a key a -inf bias hides from row 3", 'k', 5, 9, NAN, &both},
        {"-Inf in v, unmasked", 'v', 10, 3, -INFINITY, NULL},
    };
    rng r = {54};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nkv, -1, 1);
        float *v = rand_floats(&r, nkv, -1, 1), *out = malloc(sizeof(float) * nq);
        double *want = malloc(sizeof(double) * nq);
        float *t = cases[c].tensor == 'q' ? q : cases[c].tensor == 'k' ? k : v;
        t[cases[c].row * D2 + cases[c].col] = cases[c].value;
        assert_int_equal(mha_attention(&d, q, k, v, 0.5f, cases[c].mask, out, MHA_LAYOUT_BHSD),
                         MHA_OK);
        ref_attention(&d, q, k, v, 0.5, cases[c].mask, want, MHA_LAYOUT_BHSD);
        char rows[2 * S2 + 2];
        for (int i = 0; i < 2 * S2; i++) {
            char row = 'f';
            for (int e = 0; e < D2; e++) {
                const int64_t x = (int64_t)i * D2 + e;
                if (cls(out[x]) != cls(want[x]))
                    fail_msg("%s: row %d element %d is %g, the rule gives %g", cases[c].name, i,
                             e, out[x], want[x]);
                row = cls(out[x]) == 'n' || row == 'n' ? 'n' : cls(out[x]) == 'i' ? 'i' : row;
            }
            rows[i + i / S2] = row;
        }
        rows[S2] = ' ';
        rows[2 * S2 + 1] = 0;
        assert_true(tol_ratio(out, want, nq, TOL_REF) <= 1.0);
        print_message("%-48s rows of head 0, head 1: %s\n", cases[c].name, rows);
        free(q), free(k), free(v), free(out), free(want);
    }
    free(bias);
}

/* The same rule on a split-KV shape (B=1, H=8, Hkv=1, one row per head against
 * 4096 cached keys: the keys are cut into chunks whose partial results are
 * merged), output and lse alike: a NaN or Inf that a head's row reads must
 * survive the merge, and what is hidden from it (past lens, by a -INFINITY
 * bias) must not reach it. */
static void rule_on_split_kv(void **state)
{
    (void)state;
    enum { H8 = 8, CAP = 4096, D3 = 16 };
    const mha_kv_cache base = {.batch = 1, .kv_heads = 1, .head_dim = D3, .capacity = CAP,
                               .stride_b = CAP * D3, .stride_h = CAP * D3, .stride_s = D3};
    float *bias = filled_floats(H8 * CAP, 0.0f);
    for (int h = 0; h < H8 / 2; h++)
        bias[h * CAP + 3500] = -INFINITY; /* key 3500 hidden from heads 0-3 */
    const mha_mask biased = {.bias = bias, .bias_stride_h = CAP};
    struct {
        const char *name;
        char tensor;
        int row, col;
        float value;
        int32_t len;
        const mha_mask *mask;
    } cases[] = {
        {"NaN in q of head 0", 'q', 0, 3, NAN, CAP, NULL},
        {"Inf in a visible key (k row 1000)", 'k', 1000, 5, INFINITY, CAP, NULL},
        {"Inf in v row 2000, visible", 'v', 2000, 1, INFINITY, CAP, NULL},
        {"NaN in v row 3500, hidden from heads 0-3", 'v', 3500, 0, NAN, CAP, &biased},
        {"NaN in k and v past lens", 'k', 3900, 2, NAN, 3000, NULL},
    };
    rng r = {55};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float *q = rand_floats(&r, H8 * D3, -1, 1), *k = rand_floats(&r, CAP * D3, -1, 1);
        float *v = rand_floats(&r, CAP * D3, -1, 1), *out = malloc(sizeof(float) * H8 * D3);
        float lse[H8];
        double want[H8 * D3], want_lse[H8];
        float *t = cases[c].tensor == 'q' ? q : cases[c].tensor == 'k' ? k : v;
        t[cases[c].row * D3 + cases[c].col] = cases[c].value;
        if (cases[c].len < CAP)
            v[cases[c].row * D3] = NAN;
        mha_kv_cache cache = base;
        cache.k = k, cache.v = v;
        const int32_t lens[1] = {cases[c].len};
        assert_int_equal(mha_attention_cached(&cache, lens, q, H8, 1, 0.25f, cases[c].mask, out,
                                              MHA_LAYOUT_BHSD, lse),
                         MHA_OK);
        ref_attention_cached(&cache, lens, q, H8, 1, 0.25, cases[c].mask, want, MHA_LAYOUT_BHSD,
                             want_lse);
        char heads[H8 + 1] = {0};
        for (int h = 0; h < H8; h++) {
            char row = 'f';
            for (int e = 0; e < D3; e++) {
                const int x = h * D3 + e;
                if (cls(out[x]) != cls(want[x]))
                    fail_msg("%s: head %d element %d is %g, the rule gives %g", cases[c].name,
                             h, e, out[x], want[x]);
                row = cls(out[x]) == 'n' || row == 'n' ? 'n' : cls(out[x]) == 'i' ? 'i' : row;
            }
            if (cls(lse[h]) != cls(want_lse[h]))
                fail_msg("%s: lse of head %d is %g, the rule gives %g", cases[c].name, h,
                         lse[h], want_lse[h]);
            heads[h] = row;
        }
        assert_true(tol_ratio(out, want, H8 * D3, TOL_REF) <= 1.0);
        print_message("%-48s heads: %s\n", cases[c].name, heads);
        free(q), free(k), free(v), free(out);
    }
    free(bias);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batch_isolation),
        cmocka_unit_test(hidden_keys_never_read),
        cmocka_unit_test(masking_creates_no_nan),
        cmocka_unit_test(rule_row_by_row),
        cmocka_unit_test(rule_on_split_kv),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
