/* mha.h promises that a layer call given a large enough workspace allocates
 * nothing. This suite is linked with --wrap for malloc, calloc, realloc and
 * aligned_alloc, so every allocation of the library's own code passes through
 * a counter; it checks zero allocations during mha_layer_forward and
 * mha_layer_step with a workspace, on shapes that split the keys into chunks
 * and on shapes that do not, and that the counter sees the allocations of
 * the same calls without a workspace (so that it cannot pass by not counting);
 * that a workspace sized for fewer threads than run is refused; and that a small
 * call without a workspace allocates nothing when the one before it had the
 * same shape (the library keeps its freed scratch for the next call). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <setjmp.h>

#include <cmocka.h>

#include "common.h"

static atomic_int counting;
static atomic_long allocations;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

static void count(void)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocations, 1);
}

void *__wrap_malloc(size_t n)
{
    count();
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    count();
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    count();
    return __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    count();
    return __real_aligned_alloc(align, n);
}

/* The allocations between start and stop. */
static void start(void)
{
    atomic_store(&allocations, 0);
    atomic_store(&counting, 1);
}

static long stop(void)
{
    atomic_store(&counting, 0);
    return atomic_load(&allocations);
}

/* One layer call shape: seq_kv keys for the forward pass (cross-attention when it
   differs from seq_q) and cached rows before the step. */
typedef struct shape {
    int32_t batch, heads, kv_heads, head_dim, v_head_dim, seq_q, seq_kv;
} shape;

static const shape shapes[] = {
    {2, 4, 2, 32, 0, 7, 7},         /* a block per (b, kv head), no split */
    {1, 8, 2, 64, 48, 1, 3000},     /* decode: few blocks, the keys split into chunks */
    {1, 4, 4, 16, 0, 100, 100},     /* several row blocks */
    {3, 6, 3, 40, 72, 2, 1500},     /* GQA, dv > dk, split */
};

static void forward_allocates_nothing(void **state)
{
    (void)state;
    rng r = {41};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        const int32_t E = s->heads * s->head_dim;
        test_layer t;
        test_layer_init_v(&t, &r, s->heads, s->kv_heads, s->head_dim, s->v_head_dim, E, E, E, E, 1);
        float *x = rand_floats(&r, (int64_t)s->batch * s->seq_q * E, -1, 1);
        float *kv = rand_floats(&r, (int64_t)s->batch * s->seq_kv * E, -1, 1);
        float *out = filled_floats((int64_t)s->batch * s->seq_q * E, 0);
        const mha_mask causal = {.causal = 1};
        const size_t bytes = mha_layer_workspace_size(t.layer, s->batch, s->seq_q, s->seq_kv);
        void *ws = malloc(bytes);
        start();
        assert_int_equal(mha_layer_forward(t.layer, x, kv, kv, s->batch, s->seq_q, s->seq_kv,
                                           &causal, out, ws, bytes),
                         MHA_OK);
        assert_int_equal(stop(), 0);
        start();
        assert_int_equal(mha_layer_forward(t.layer, x, kv, kv, s->batch, s->seq_q, s->seq_kv,
                                           &causal, out, NULL, 0),
                         MHA_OK);
        assert_true(stop() > 0); /* the counter works: the library allocates its own */
        free(ws);
        free(x);
        free(kv);
        free(out);
        test_layer_free(&t);
    }
}

static void step_allocates_nothing(void **state)
{
    (void)state;
    rng r = {43};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        const int32_t E = s->heads * s->head_dim;
        const int32_t dv = s->v_head_dim ? s->v_head_dim : s->head_dim;
        const int32_t cap = s->seq_kv + s->seq_q;
        test_layer t;
        test_layer_init_v(&t, &r, s->heads, s->kv_heads, s->head_dim, s->v_head_dim, E, E, E, E, 1);
        float *k = rand_floats(&r, (int64_t)s->batch * s->kv_heads * cap * s->head_dim, -1, 1);
        float *v = rand_floats(&r, (int64_t)s->batch * s->kv_heads * cap * dv, -1, 1);
        const mha_kv_cache cache = {.k = k, .v = v, .batch = s->batch, .kv_heads = s->kv_heads,
                                    .head_dim = s->head_dim, .capacity = cap,
                                    .stride_b = (int64_t)s->kv_heads * cap * s->head_dim,
                                    .stride_h = (int64_t)cap * s->head_dim,
                                    .stride_s = s->head_dim, .v_head_dim = s->v_head_dim,
                                    .v_stride_b = (int64_t)s->kv_heads * cap * dv,
                                    .v_stride_h = (int64_t)cap * dv, .v_stride_s = dv};
        int32_t *lens = malloc(sizeof(int32_t) * (size_t)s->batch);
        for (int32_t b = 0; b < s->batch; b++) /* unequal lens take the workspace's path */
            lens[b] = s->seq_kv - (i % 2 ? b : 0);
        float *x = rand_floats(&r, (int64_t)s->batch * s->seq_q * E, -1, 1);
        float *out = filled_floats((int64_t)s->batch * s->seq_q * E, 0);
        const mha_mask causal = {.causal = 1};
        const size_t bytes = mha_layer_step_workspace_size(t.layer, s->batch, s->seq_q);
        void *ws = malloc(bytes);
        start();
        assert_int_equal(mha_layer_step(t.layer, x, s->seq_q, &cache, lens, &causal, out, ws, bytes),
                         MHA_OK);
        assert_int_equal(stop(), 0);
        for (int32_t b = 0; b < s->batch; b++)
            lens[b] -= s->seq_q;
        start();
        assert_int_equal(mha_layer_step(t.layer, x, s->seq_q, &cache, lens, &causal, out, NULL, 0),
                         MHA_OK);
        assert_true(stop() > 0);
        free(ws);
        free(lens);
        free(k);
        free(v);
        free(x);
        free(out);
        test_layer_free(&t);
    }
}

/* A workspace holds one attention scratch slot per thread that may run: both
   workspace sizes grow from 1 thread to 2, and a workspace sized at 1 thread is
   refused at 2 (MHA_ERR_ARG, out, cache and lens untouched), never shared by two
   threads. A build without OpenMP runs one thread: nothing to check. */
static void workspace_follows_threads(void **state)
{
    (void)state;
#ifdef _OPENMP
    rng r = {47};
    const shape *s = &shapes[1];
    const int32_t E = s->heads * s->head_dim, dv = s->v_head_dim;
    const int32_t cap = s->seq_kv + 1;
    test_layer t;
    test_layer_init_v(&t, &r, s->heads, s->kv_heads, s->head_dim, dv, E, E, E, E, 1);
    set_threads(1);
    const size_t fwd1 = mha_layer_workspace_size(t.layer, s->batch, s->seq_q, s->seq_kv);
    const size_t step1 = mha_layer_step_workspace_size(t.layer, s->batch, s->seq_q);
    set_threads(2);
    const size_t fwd2 = mha_layer_workspace_size(t.layer, s->batch, s->seq_q, s->seq_kv);
    const size_t step2 = mha_layer_step_workspace_size(t.layer, s->batch, s->seq_q);
    assert_true(fwd2 > fwd1 && step2 > step1);

    float *x = rand_floats(&r, (int64_t)s->batch * s->seq_kv * E, -1, 1);
    float *out = filled_floats((int64_t)s->batch * s->seq_q * E, 5.0f);
    float *k = filled_floats((int64_t)cap * s->kv_heads * s->head_dim, 3.0f);
    float *v = filled_floats((int64_t)cap * s->kv_heads * dv, 3.0f);
    const mha_kv_cache cache = {.k = k, .v = v, .batch = 1, .kv_heads = s->kv_heads,
                                .head_dim = s->head_dim, .capacity = cap,
                                .stride_b = (int64_t)cap * s->kv_heads * s->head_dim,
                                .stride_h = s->head_dim, .stride_s = (int64_t)s->kv_heads * s->head_dim,
                                .v_head_dim = dv, .v_stride_b = (int64_t)cap * s->kv_heads * dv,
                                .v_stride_h = dv, .v_stride_s = (int64_t)s->kv_heads * dv};
    int32_t lens[1] = {s->seq_kv};
    void *ws = malloc(fwd1 > step1 ? fwd1 : step1);
    assert_int_equal(mha_layer_forward(t.layer, x, x, x, s->batch, s->seq_q, s->seq_kv, NULL, out,
                                       ws, fwd1),
                     MHA_ERR_ARG);
    assert_int_equal(mha_layer_step(t.layer, x, s->seq_q, &cache, lens, NULL, out, ws, step1),
                     MHA_ERR_ARG);
    for (int64_t i = 0; i < (int64_t)s->batch * s->seq_q * E; i++)
        assert_true(out[i] == 5.0f);
    for (int64_t i = 0; i < (int64_t)cap * s->kv_heads * s->head_dim; i++)
        assert_true(k[i] == 3.0f);
    assert_int_equal(lens[0], s->seq_kv);
    free(ws), free(x), free(out), free(k), free(v);
    test_layer_free(&t);
#endif
}

/* The second of two identical attention calls takes the scratch the first left. */
static void small_call_reuses_scratch(void **state)
{
    (void)state;
    rng r = {53};
    const mha_attn_dims d = {.batch = 1, .heads = 8, .kv_heads = 2, .seq_q = 1, .seq_kv = 64,
                             .head_dim = 64};
    float *q = rand_floats(&r, 8 * 64, -1, 1), *k = rand_floats(&r, 2 * 64 * 64, -1, 1);
    float *v = rand_floats(&r, 2 * 64 * 64, -1, 1), *out = filled_floats(8 * 64, 0);
    assert_int_equal(mha_attention(&d, q, k, v, 0.125f, NULL, out, MHA_LAYOUT_BHSD), MHA_OK);
    start();
    assert_int_equal(mha_attention(&d, q, k, v, 0.125f, NULL, out, MHA_LAYOUT_BHSD), MHA_OK);
    assert_int_equal(stop(), 0);
    free(q), free(k), free(v), free(out);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_allocates_nothing),
        cmocka_unit_test(step_allocates_nothing),
        cmocka_unit_test(workspace_follows_threads),
        cmocka_unit_test(small_call_reuses_scratch),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
