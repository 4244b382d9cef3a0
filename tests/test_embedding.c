/* What an engine that embeds libmha relies on:
 *  - the caller's thread pool (mha_set_parallel_for): a small pthread pool
 *    drives the layer, attention (every mask kind) and the head transpose (tile
 *    and cycle paths), and every result is bitwise the OpenMP result;
 *  - a bounded stack: every entry point runs on a thread with a 64 KiB stack
 *    (or the platform's minimum, 128 KiB on AArch64 with its 64 KiB pages), with
 *    the pool's workers on such stacks too; every suite runs with OMP_STACKSIZE
 *    set as small, so OpenMP's workers have small stacks. */
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

enum { POOL_WORKERS = 3 };
#define SMALL_STACK (PTHREAD_STACK_MIN > 65536 ? PTHREAD_STACK_MIN : 65536)

static void small_stack_attr(pthread_attr_t *attr)
{
    assert_int_equal(pthread_attr_init(attr), 0);
    assert_int_equal(pthread_attr_setstacksize(attr, SMALL_STACK), 0);
}

/* Every entry point on fixed inputs; outputs go to one buffer per call. */
typedef struct outputs {
    float *layer, *attn[4], *qkv, *split_small, *split_big;
    int failed; /* some call did not return MHA_OK */
} outputs;

typedef struct inputs {
    test_layer t;
    int32_t B, S, E;
    float *x, *q, *k, *v, *bias, *small, *big;
    int32_t kl[2];
    int64_t nq, n_small, n_big;
} inputs;

static void make_inputs(inputs *in)
{
    rng r = {41};
    in->B = 2, in->S = 77, in->E = 96;
    test_layer_init(&in->t, &r, 6, 2, 16, in->E, 0, 0, in->E, 1);
    in->x = rand_floats(&r, (int64_t)in->B * in->S * in->E, -1, 1);
    in->nq = (int64_t)in->B * 4 * in->S * 64;
    in->q = rand_floats(&r, in->nq, -1, 1);
    in->k = rand_floats(&r, in->nq / 2, -1, 1);
    in->v = rand_floats(&r, in->nq / 2, -1, 1);
    in->bias = rand_floats(&r, (int64_t)in->B * in->S * in->S, -2, 2);
    in->kl[0] = 77, in->kl[1] = 30;
    in->n_small = 3LL * 37 * 5 * 24;
    in->n_big = 1LL * 1024 * 16 * 80; /* 5 MiB: the driver's cycle path */
    in->small = rand_floats(&r, in->n_small, -1, 1);
    in->big = rand_floats(&r, in->n_big, -1, 1);
}

static void free_inputs(inputs *in)
{
    test_layer_free(&in->t);
    free(in->x), free(in->q), free(in->k), free(in->v), free(in->bias);
    free(in->small), free(in->big);
}

static void run_all(const inputs *in, outputs *o)
{
    o->failed = 0;
    const int64_t nl = (int64_t)in->B * in->S * in->E;
    o->layer = malloc(sizeof(float) * nl);
    const mha_mask causal = {.key_lens = in->kl, .causal = 1};
    o->failed |= mha_layer_forward(in->t.layer, in->x, in->x, in->x, in->B, in->S, in->S,
                                   &causal, o->layer, NULL, 0) != MHA_OK;
    const mha_attn_dims d = {in->B, 4, 2, in->S, in->S, 64, 0, MHA_F32};
    const mha_mask masks[4] = {
        {0},
        {.causal = 1},
        {.key_lens = in->kl},
        {.bias = in->bias, .bias_stride_b = (int64_t)in->S * in->S, .bias_stride_q = in->S},
    };
    for (int m = 0; m < 4; m++) {
        o->attn[m] = malloc(sizeof(float) * in->nq);
        o->failed |= mha_attention(&d, in->q, in->k, in->v, 0.125f, &masks[m], o->attn[m],
                                   (mha_layout)(m % 2)) != MHA_OK;
    }
    const int64_t nqkv = (int64_t)in->B * in->S * 6 * 16;
    o->qkv = calloc((size_t)(3 * nqkv), sizeof(float)); /* k and v fill a third of theirs */
    o->failed |= mha_qkv_project(in->t.layer, in->x, in->x, in->x, in->B, in->S, in->S,
                                 o->qkv, o->qkv + nqkv, o->qkv + 2 * nqkv) != MHA_OK;
    o->split_small = malloc(sizeof(float) * in->n_small);
    memcpy(o->split_small, in->small, sizeof(float) * in->n_small);
    o->failed |= mha_heads_split(o->split_small, 3, 37, 5, 24) != MHA_OK;
    o->split_big = malloc(sizeof(float) * in->n_big);
    memcpy(o->split_big, in->big, sizeof(float) * in->n_big);
    o->failed |= mha_heads_merge(o->split_big, 1, 1024, 16, 80) != MHA_OK;
}

static void assert_same(const inputs *in, const outputs *a, const outputs *b)
{
    assert_false(a->failed);
    assert_false(b->failed);
    assert_memory_equal(a->layer, b->layer, sizeof(float) * in->B * in->S * in->E);
    for (int m = 0; m < 4; m++)
        assert_memory_equal(a->attn[m], b->attn[m], sizeof(float) * in->nq);
    assert_memory_equal(a->qkv, b->qkv, sizeof(float) * 3 * in->B * in->S * 6 * 16);
    assert_memory_equal(a->split_small, b->split_small, sizeof(float) * in->n_small);
    assert_memory_equal(a->split_big, b->split_big, sizeof(float) * in->n_big);
}

static void free_outputs(outputs *o)
{
    free(o->layer), free(o->qkv), free(o->split_small), free(o->split_big);
    for (int m = 0; m < 4; m++)
        free(o->attn[m]);
}

typedef struct small_stack_job {
    const inputs *in;
    outputs *out;
} small_stack_job;

/* cmocka's assertions longjmp to the test's stack: the job only computes, and
 * the test checks afterwards. */
static void *run_on_small_stack(void *arg)
{
    small_stack_job *job = arg;
    run_all(job->in, job->out);
    return NULL;
}

static void caller_pool_bits(void **state)
{
    (void)state;
    inputs in;
    make_inputs(&in);
    outputs omp, pooled;
    run_all(&in, &omp);
    test_pool p;
    assert_int_equal(test_pool_start(&p, POOL_WORKERS, SMALL_STACK), 0);
    mha_set_parallel_for(test_pool_parallel_for, &p);
    run_all(&in, &pooled);
    mha_set_parallel_for(NULL, NULL);
    test_pool_stop(&p);
    assert_true(p.jobs > 0);
    assert_same(&in, &omp, &pooled);
    free_outputs(&omp);
    free_outputs(&pooled);
    free_inputs(&in);
}

static void small_stacks(void **state)
{
    (void)state;
    inputs in;
    make_inputs(&in);
    outputs want, got_omp, got_pool;
    run_all(&in, &want);

    pthread_attr_t attr;
    small_stack_attr(&attr);
    pthread_t th;
    small_stack_job job = {&in, &got_omp};
    assert_int_equal(pthread_create(&th, &attr, run_on_small_stack, &job), 0);
    assert_int_equal(pthread_join(th, NULL), 0);

    test_pool p;
    assert_int_equal(test_pool_start(&p, POOL_WORKERS, SMALL_STACK), 0);
    mha_set_parallel_for(test_pool_parallel_for, &p);
    job.out = &got_pool;
    assert_int_equal(pthread_create(&th, &attr, run_on_small_stack, &job), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    mha_set_parallel_for(NULL, NULL);
    test_pool_stop(&p);
    pthread_attr_destroy(&attr);

    assert_same(&in, &want, &got_omp);
    assert_same(&in, &want, &got_pool);
    free_outputs(&want);
    free_outputs(&got_omp);
    free_outputs(&got_pool);
    free_inputs(&in);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(caller_pool_bits),
        cmocka_unit_test(small_stacks),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
