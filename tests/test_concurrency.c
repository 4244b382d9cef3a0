/* Calls from many threads at once: 8 pthreads run mha_layer_forward on one
 * shared layer, with and without their own workspaces, and must all get the
 * single-threaded bits; a thread flipping mha_isa_force while others compute
 * leaves each call wholly on one ISA (its result equals that ISA's bits). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

enum { THREADS = 8, ROUNDS = 6, B = 2, S = 23, E = 48, H = 4, DH = 12 };

static test_layer shared;
static float *x, *want[2]; /* want[0]: scalar bits, want[1]: the ISA under test */
static const int32_t key_lens[B] = {S, 11};
static const mha_mask mask = {.key_lens = key_lens, .causal = 1};
static atomic_int flipping;

static void *worker(void *arg)
{
    const int id = (int)(intptr_t)arg;
    const size_t n = (size_t)B * S * E;
    float *out = malloc(n * sizeof(float));
    const size_t ws_bytes = mha_layer_workspace_size(shared.layer, B, S, S);
    void *ws = id % 2 ? malloc(ws_bytes) : NULL;
    intptr_t bad = 0;
    for (int r = 0; r < ROUNDS && !bad; r++) {
        if (mha_layer_forward(shared.layer, x, x, x, B, S, S, &mask, out, ws, ws ? ws_bytes : 0)
            != MHA_OK)
            bad = 1;
        else if (memcmp(out, want[0], n * sizeof(float)) != 0
                 && memcmp(out, want[1], n * sizeof(float)) != 0)
            bad = 1;
    }
    free(out);
    free(ws);
    return (void *)bad;
}

static void *flipper(void *arg)
{
    const mha_isa isa = (mha_isa)(intptr_t)arg;
    while (atomic_load(&flipping)) {
        mha_isa_force(MHA_ISA_SCALAR);
        mha_isa_force(isa);
    }
    return NULL;
}

static void run_workers(int with_flipper, mha_isa isa)
{
    pthread_t t[THREADS], f;
    atomic_store(&flipping, 1);
    if (with_flipper)
        assert_int_equal(pthread_create(&f, NULL, flipper, (void *)(intptr_t)isa), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    intptr_t failures = 0;
    for (int i = 0; i < THREADS; i++) {
        void *bad;
        assert_int_equal(pthread_join(t[i], &bad), 0);
        failures += (intptr_t)bad;
    }
    atomic_store(&flipping, 0);
    if (with_flipper)
        assert_int_equal(pthread_join(f, NULL), 0);
    assert_int_equal(failures, 0);
}

static void shared_layer(void **state)
{
    (void)state;
    const mha_isa isa = mha_isa_active();
    rng r = {41};
    test_layer_init(&shared, &r, H, 2, DH, E, 0, 0, E, 1);
    x = rand_floats(&r, (int64_t)B * S * E, -1, 1);
    const size_t n = (size_t)B * S * E;
    for (int i = 0; i < 2; i++) {
        want[i] = malloc(n * sizeof(float));
        assert_int_equal(mha_isa_force(i ? isa : MHA_ISA_SCALAR), MHA_OK);
        assert_int_equal(mha_layer_forward(shared.layer, x, x, x, B, S, S, &mask, want[i], NULL, 0),
                         MHA_OK);
    }
    run_workers(0, isa); /* every result must equal want[1] (or want[0] when isa is scalar) */
    run_workers(1, isa);
    assert_int_equal(mha_isa_force(isa), MHA_OK);
    free(x);
    free(want[0]);
    free(want[1]);
    test_layer_free(&shared);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {cmocka_unit_test(shared_layer)};
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
