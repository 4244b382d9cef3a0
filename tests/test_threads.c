/* Bitwise determinism: every kernel family gives the same bits with 1, 2, 3
 * and 7 OpenMP threads (thread counts that split the work unevenly), and a
 * long decode with 128 OpenMP threads and on a caller's pool of 128 threads
 * (more than the CPUs: items wait for scratch slots) gives the bits of 1. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "internal.h"

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

/* A long B=1 decode is cut into enough items for many threads (the cut depends
 * on the shapes only), and 128 threads give the bits of one. */
static void many_threads(void **state)
{
    (void)state;
    const mha_attn_args llama = {.batch = 1, .heads = 32, .kv_heads = 8, .seq_q = 1,
                                 .seq_kv = 16384, .dk = 128, .dv = 128};
    mha_attn_plan plan;
    assert_int_equal(mha_attention_prepare(mha_kernels_active(), &llama, NULL, 0, &plan), MHA_OK);
    print_message("B=1 H=32 Hkv=8 Skv=16384 decode: %lld items\n",
                  (long long)(plan.blocks * plan.chunks));
    assert_true(plan.blocks * plan.chunks >= 128);
    mha_attention_release(&plan);

    rng r = {88};
    const mha_attn_dims d = {1, 32, 8, 1, 16384, 32, 0, MHA_F32}; /* 128 items: 128 slots */
    const int64_t nq = 32 * 32, nk = 8 * 16384 * 32;
    float *q = rand_floats(&r, nq, -1, 1), *k = rand_floats(&r, nk, -1, 1);
    float *v = rand_floats(&r, nk, -1, 1);
    float *want = malloc(sizeof(float) * nq), *got = malloc(sizeof(float) * nq);
    const mha_mask causal = {.causal = 1};
    set_threads(1);
    assert_int_equal(mha_attention(&d, q, k, v, 0.17f, &causal, want, MHA_LAYOUT_BHSD), MHA_OK);
    set_threads(128);
    assert_int_equal(mha_attention(&d, q, k, v, 0.17f, &causal, got, MHA_LAYOUT_BHSD), MHA_OK);
    assert_memory_equal(want, got, sizeof(float) * nq);
    set_threads(2);
    test_pool p;
    assert_int_equal(test_pool_start(&p, 127, 1 << 20), 0);
    mha_set_parallel_for(test_pool_parallel_for, &p);
    memset(got, 0, sizeof(float) * nq);
    assert_int_equal(mha_attention(&d, q, k, v, 0.17f, &causal, got, MHA_LAYOUT_BHSD), MHA_OK);
    mha_set_parallel_for(NULL, NULL);
    test_pool_stop(&p);
    assert_true(p.jobs > 0);
    assert_memory_equal(want, got, sizeof(float) * nq);
    free(q);
    free(k);
    free(v);
    free(want);
    free(got);
}

/* Scratch slots follow the thread count past 64: 200 threads may hold 200
 * distinct slots at once (a build without OpenMP: 1), and every slot given back
 * is free again. */
static void scratch_slots(void **state)
{
    (void)state;
    set_threads(200);
    const int32_t n = mha_parallel_width() >= 200 ? 200 : 1;
    mha_scratch sc;
    assert_int_equal(mha_scratch_init(&sc, 64, 1000), MHA_OK);
    assert_int_equal(sc.slots, n);
    char *held[200];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++) {
            held[i] = mha_scratch_take(&sc);
            assert_true(held[i] >= sc.base && held[i] < sc.base + n * 64);
            for (int j = 0; j < i; j++)
                assert_ptr_not_equal(held[i], held[j]);
        }
        for (int i = 0; i < n; i++)
            mha_scratch_give(&sc, held[i]);
        for (int w = 0; w < MHA_SCRATCH_SLOTS_MAX / 64; w++)
            assert_true(atomic_load(&sc.busy[w]) == 0);
    }
    mha_scratch_free(&sc);
    set_threads(2);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_and_attention),
        cmocka_unit_test(heads_split),
        cmocka_unit_test(many_threads),
        cmocka_unit_test(scratch_slots),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
