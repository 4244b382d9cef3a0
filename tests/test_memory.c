/* The memory of a layer: one packed copy of its weights (RSS growth of
 * mha_layer_create at d_model 2048), copies for other panel widths made lazily
 * after mha_isa_force (right weights, made once even when 8 threads ask at
 * once, MHA_ERR_NOMEM with outputs untouched when they cannot be allocated),
 * and shape overflow caught before any product is formed. */
#define _DEFAULT_SOURCE
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "common.h"
#include "internal.h"

static mha_isa home; /* the ISA of MHA_ISA, active when each layer is created */

/* A field of /proc/self/status in kB ("VmRSS", "VmSize"), or -1 when unreadable. */
static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    const size_t len = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            kb = strtol(line + len + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#endif

/* Why this process's RSS or address space does not measure libmha, or NULL. */
static const char *memory_unmeasurable(void)
{
#ifdef TEST_ASAN
    return "ASan (its allocator keeps freed memory in quarantine, and adds shadow memory)";
#else
    return under_valgrind() ? "valgrind (its own allocator and memory accounting)" : NULL;
#endif
}

/* The number of distinct GEMM panel widths over the ISAs available here. */
static int panel_widths(void)
{
    int32_t seen[MHA_ISA_COUNT];
    int n = 0;
    for (int i = 0; i < MHA_ISA_COUNT; i++) {
        const mha_kernels *kt = mha_kernels_for((mha_isa)i);
        if (!kt)
            continue;
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= seen[j] == kt->gemm_nr;
        if (!dup)
            seen[n++] = kt->gemm_nr;
    }
    return n;
}

static void layer_rss_one_copy(void **state)
{
    (void)state;
    const char *why = memory_unmeasurable();
    /* Valgrind: a small layer, since the RSS is not judged there anyway. */
    const int32_t d = under_valgrind() ? 256 : 2048, dh = 128, heads = d / dh;
    if (status_kb("VmRSS") < 0) {
        printf("layer RSS: /proc/self/status unreadable, skipping\n");
        skip();
    }
    rng r = {5};
    const int64_t dd = (int64_t)d * d;
    const float bound = 1.0f / sqrtf((float)d);
    /* The caller's arrays are written (resident) before the first reading and freed
       after the last, so the growth is the layer's alone. */
    float *w[4], *b[4];
    for (int i = 0; i < 4; i++) {
        w[i] = rand_floats(&r, dd, -bound, bound);
        b[i] = rand_floats(&r, d, -bound, bound);
    }
    float *x = rand_floats(&r, 4 * d, -1, 1), *out = malloc(4 * (size_t)d * sizeof(float));
    const mha_layer_desc desc = {.heads = heads, .head_dim = dh, .q_in = d, .out_dim = d,
                                 .w_q = w[0], .w_k = w[1], .w_v = w[2], .w_o = w[3],
                                 .b_q = b[0], .b_k = b[1], .b_v = b[2], .b_o = b[3]};
    const double weight_bytes = 4.0 * (double)dd * sizeof(float), mib = 1024.0 * 1024.0;

    const long before = status_kb("VmRSS");
    mha_layer *L;
    assert_int_equal(mha_layer_create(&desc, &L), MHA_OK);
    const double growth = (double)(status_kb("VmRSS") - before) * 1024.0;
    printf("layer RSS (%s, d_model %d): weights %.1f MiB, growth %.1f MiB, ratio %.3f\n",
           mha_isa_name(home), d, weight_bytes / mib, growth / mib, growth / weight_bytes);

    /* A forward pass on every ISA: ISAs of one panel width share one copy. */
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        if (mha_isa_available((mha_isa)i)) {
            assert_int_equal(mha_isa_force((mha_isa)i), MHA_OK);
            assert_int_equal(mha_layer_forward(L, x, x, x, 1, 4, 4, NULL, out, NULL, 0), MHA_OK);
        }
    assert_int_equal(mha_isa_force(home), MHA_OK);
    const int widths = panel_widths();
    const double growth_all = (double)(status_kb("VmRSS") - before) * 1024.0;
    printf("layer RSS after a call on every ISA (%d panel widths): growth %.1f MiB, ratio %.3f\n",
           widths, growth_all / mib, growth_all / weight_bytes);

    if (why) {
        printf("layer RSS: not judged under %s\n", why);
    } else {
        if (growth > 1.25 * weight_bytes)
            fail_msg("mha_layer_create grew RSS by %.1f MiB for %.1f MiB of weights",
                     growth / mib, weight_bytes / mib);
        if (growth_all > 1.25 * widths * weight_bytes)
            fail_msg("RSS grew by %.1f MiB for %d panel widths of %.1f MiB", growth_all / mib,
                     widths, weight_bytes / mib);
    }
    mha_layer_destroy(L);
    for (int i = 0; i < 4; i++) {
        free(w[i]);
        free(b[i]);
    }
    free(x);
    free(out);
}

/* Shapes whose widths are not multiples of any panel width (padded panels), GQA,
   distinct input widths and both with and without an output projection. */
typedef struct shape {
    int32_t heads, kv_heads, dh, q_in, k_in, v_in, out_dim, bias;
} shape;
static const shape shapes[] = {
    {3, 1, 12, 40, 24, 56, 40, 1},
    {4, 4, 16, 64, 0, 0, 0, 0},
    {2, 2, 20, 33, 0, 0, 17, 1},
    {8, 2, 8, 70, 70, 5, 70, 1},
};
enum { B = 2, SQ = 7, SKV = 9 };

/* Outputs of one layer: forward with cross-attention inputs, then the projections. */
typedef struct outputs {
    float *fwd, *qkv;
    size_t n_fwd, n_qkv;
} outputs;

typedef struct inputs {
    float *xq, *xk, *xv;
} inputs;

static outputs outputs_new(const shape *s)
{
    const int32_t kvh = s->kv_heads ? s->kv_heads : s->heads;
    outputs o;
    o.n_fwd = (size_t)B * SQ * (s->out_dim ? s->out_dim : s->heads * s->dh);
    o.n_qkv = (size_t)B * (SQ * s->heads + 2 * SKV * kvh) * s->dh;
    o.fwd = malloc(o.n_fwd * sizeof(float));
    o.qkv = malloc(o.n_qkv * sizeof(float));
    return o;
}

static void outputs_free(outputs *o)
{
    free(o->fwd);
    free(o->qkv);
}

static mha_status run(const mha_layer *L, const shape *s, const inputs *in, outputs *o)
{
    const int32_t kvh = s->kv_heads ? s->kv_heads : s->heads;
    const mha_mask mask = {.causal = 1};
    mha_status st = mha_layer_forward(L, in->xq, in->xk, in->xv, B, SQ, SKV, &mask, o->fwd, NULL, 0);
    if (st != MHA_OK)
        return st;
    float *q = o->qkv, *k = q + (size_t)B * SQ * s->heads * s->dh;
    float *v = k + (size_t)B * SKV * kvh * s->dh;
    return mha_qkv_project(L, in->xq, in->xk, in->xv, B, SQ, SKV, q, k, v);
}

static inputs inputs_new(rng *r, const shape *s)
{
    const int32_t k_in = s->k_in ? s->k_in : s->q_in, v_in = s->v_in ? s->v_in : k_in;
    inputs in = {rand_floats(r, (int64_t)B * SQ * s->q_in, -1, 1),
                 rand_floats(r, (int64_t)B * SKV * k_in, -1, 1), NULL};
    /* value == key when the widths allow, to reach the fused K/V GEMM too. */
    in.xv = v_in == k_in ? in.xk : rand_floats(r, (int64_t)B * SKV * v_in, -1, 1);
    return in;
}

static void inputs_free(inputs *in)
{
    if (in->xv != in->xk)
        free(in->xv);
    free(in->xq);
    free(in->xk);
}

static void repack_after_isa_force(void **state)
{
    (void)state;
    rng r = {17};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        test_layer t;
        test_layer_init(&t, &r, s->heads, s->kv_heads, s->dh, s->q_in, s->k_in, s->v_in,
                        s->out_dim, s->bias); /* packed for `home` */
        inputs in = inputs_new(&r, s);
        outputs first = outputs_new(s), got = outputs_new(s), want = outputs_new(s);
        assert_int_equal(run(t.layer, s, &in, &first), MHA_OK);
        for (int i = 0; i < MHA_ISA_COUNT; i++) {
            if (i == (int)home || !mha_isa_available((mha_isa)i))
                continue;
            assert_int_equal(mha_isa_force((mha_isa)i), MHA_OK);
            assert_int_equal(run(t.layer, s, &in, &got), MHA_OK); /* repacked weights */
            mha_layer *fresh;
            assert_int_equal(mha_layer_create(&t.desc, &fresh), MHA_OK); /* packed for i */
            assert_int_equal(run(fresh, s, &in, &want), MHA_OK);
            mha_layer_destroy(fresh);
            const double fwd = tol_ratio_f(got.fwd, want.fwd, (int64_t)got.n_fwd, TOL_ISA);
            const double qkv = tol_ratio_f(got.qkv, want.qkv, (int64_t)got.n_qkv, TOL_ISA);
            if (fwd > 1.0 || qkv > 1.0)
                fail_msg("shape %zu, created on %s, run on %s: forward %.3g, qkv %.3g x tolerance"
                         " against a layer created on %s", si, mha_isa_name(home),
                         mha_isa_name((mha_isa)i), fwd, qkv, mha_isa_name((mha_isa)i));
            /* A second call reuses the copy. */
            assert_int_equal(run(t.layer, s, &in, &want), MHA_OK);
            assert_memory_equal(got.fwd, want.fwd, got.n_fwd * sizeof(float));
        }
        assert_int_equal(mha_isa_force(home), MHA_OK);
        assert_int_equal(run(t.layer, s, &in, &got), MHA_OK);
        assert_memory_equal(got.fwd, first.fwd, got.n_fwd * sizeof(float));
        assert_memory_equal(got.qkv, first.qkv, got.n_qkv * sizeof(float));
        outputs_free(&first);
        outputs_free(&got);
        outputs_free(&want);
        inputs_free(&in);
        test_layer_free(&t);
    }
}

/* An ISA whose panel width differs from home's, or -1. */
static int other_width_isa(void)
{
    const int32_t nr = mha_kernels_for(home)->gemm_nr;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        if (mha_kernels_for((mha_isa)i) && mha_kernels_for((mha_isa)i)->gemm_nr != nr)
            return i;
    return -1;
}

enum { THREADS = 8 };
static pthread_barrier_t barrier;
static const mha_layer *race_layer;
static const shape *race_shape;
static const inputs *race_in;

static void *race_worker(void *arg)
{
    outputs *o = arg;
    pthread_barrier_wait(&barrier);
    return (void *)(intptr_t)(run(race_layer, race_shape, race_in, o) != MHA_OK);
}

/* 8 threads making the first call on another panel width at once: one repack,
   and every thread gets the bits of a layer created on that ISA. */
static void repack_race(void **state)
{
    (void)state;
    const int other = other_width_isa();
    if (other < 0) {
        printf("repack race: no ISA here packs for another width than %s, skipping\n",
               mha_isa_name(home));
        skip();
    }
    rng r = {23};
    const shape *s = &shapes[3];
    test_layer t;
    test_layer_init(&t, &r, s->heads, s->kv_heads, s->dh, s->q_in, s->k_in, s->v_in, s->out_dim,
                    s->bias);
    inputs in = inputs_new(&r, s);
    outputs o[THREADS], want = outputs_new(s);
    for (int i = 0; i < THREADS; i++)
        o[i] = outputs_new(s);
    assert_int_equal(mha_isa_force((mha_isa)other), MHA_OK);
    mha_layer *fresh;
    assert_int_equal(mha_layer_create(&t.desc, &fresh), MHA_OK);
    assert_int_equal(run(fresh, s, &in, &want), MHA_OK);
    mha_layer_destroy(fresh);

    race_layer = t.layer, race_shape = s, race_in = &in;
    assert_int_equal(pthread_barrier_init(&barrier, NULL, THREADS), 0);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, race_worker, &o[i]), 0);
    intptr_t failures = 0;
    for (int i = 0; i < THREADS; i++) {
        void *bad;
        assert_int_equal(pthread_join(th[i], &bad), 0);
        failures += (intptr_t)bad;
    }
    pthread_barrier_destroy(&barrier);
    assert_int_equal(mha_isa_force(home), MHA_OK);
    assert_int_equal(failures, 0);
    for (int i = 0; i < THREADS; i++) {
        assert_true(tol_ratio_f(o[i].fwd, want.fwd, (int64_t)want.n_fwd, TOL_ISA) <= 1.0);
        assert_true(tol_ratio_f(o[i].qkv, want.qkv, (int64_t)want.n_qkv, TOL_ISA) <= 1.0);
        assert_memory_equal(o[i].fwd, o[0].fwd, want.n_fwd * sizeof(float));
        assert_memory_equal(o[i].qkv, o[0].qkv, want.n_qkv * sizeof(float));
    }
    for (int i = 0; i < THREADS; i++)
        outputs_free(&o[i]);
    outputs_free(&want);
    inputs_free(&in);
    test_layer_free(&t);
}

/* A repack that cannot be allocated (address space capped with RLIMIT_AS):
   MHA_ERR_NOMEM before any output is written; the next call, with memory, works. */
static void repack_nomem(void **state)
{
    (void)state;
    const char *why = memory_unmeasurable();
    const int other = other_width_isa();
    struct rlimit saved = {0, 0};
    if (why || other < 0 || status_kb("VmSize") < 0 || getrlimit(RLIMIT_AS, &saved) != 0) {
        printf("repack out of memory: %s, skipping\n",
               why ? why : other < 0 ? "no ISA of another panel width"
                                     : "no /proc/self/status or getrlimit");
        skip();
    }
    /* 72 MiB of packed Wq, Wk, Wv: more than glibc's largest mmap threshold (32 MiB)
       and than its per-thread arena heaps (64 MiB, reserved up front and so already
       in VmSize), so the repack needs address space beyond the cap. */
    enum { HEADS = 16, DH = 128, IN = 3072, NQ = HEADS * DH };
    rng r = {29};
    test_layer t;
    test_layer_init(&t, &r, HEADS, 0, DH, IN, 0, 0, 0, 1);
    float *x = rand_floats(&r, IN, -1, 1);
    float *y = malloc(4 * NQ * sizeof(float)), *canary = malloc(4 * NQ * sizeof(float));
    float *q = y + NQ, *k = q + NQ, *v = k + NQ;
    const size_t ws_bytes = mha_layer_workspace_size(t.layer, 1, 1, 1);
    void *ws = malloc(ws_bytes);
    assert_int_equal(mha_layer_forward(t.layer, x, x, x, 1, 1, 1, NULL, y, ws, ws_bytes), MHA_OK);
    memset(y, 0x5a, 4 * NQ * sizeof(float));
    memcpy(canary, y, 4 * NQ * sizeof(float));

    assert_int_equal(mha_isa_force((mha_isa)other), MHA_OK);
    struct rlimit cap = saved;
    cap.rlim_cur = (rlim_t)status_kb("VmSize") * 1024 + (4 << 20);
    if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < cap.rlim_cur)
        cap.rlim_cur = saved.rlim_cur;
    assert_int_equal(setrlimit(RLIMIT_AS, &cap), 0);
    void *probe = malloc((size_t)80 << 20); /* more than the repack needs */
    if (probe) {
        free(probe);
        assert_int_equal(setrlimit(RLIMIT_AS, &saved), 0);
        assert_int_equal(mha_isa_force(home), MHA_OK);
        printf("repack out of memory: RLIMIT_AS is not enforced here (qemu-user ignores it),"
               " skipping\n");
        free(ws);
        free(x);
        free(y);
        free(canary);
        test_layer_free(&t);
        skip();
    }
    const mha_status fwd = mha_layer_forward(t.layer, x, x, x, 1, 1, 1, NULL, y, ws, ws_bytes);
    const mha_status qkv = mha_qkv_project(t.layer, x, x, x, 1, 1, 1, q, k, v);
    assert_int_equal(setrlimit(RLIMIT_AS, &saved), 0);
    assert_int_equal(fwd, MHA_ERR_NOMEM);
    assert_int_equal(qkv, MHA_ERR_NOMEM);
    assert_memory_equal(y, canary, 4 * NQ * sizeof(float));

    assert_int_equal(mha_layer_forward(t.layer, x, x, x, 1, 1, 1, NULL, y, ws, ws_bytes), MHA_OK);
    assert_int_equal(mha_qkv_project(t.layer, x, x, x, 1, 1, 1, q, k, v), MHA_OK);
    assert_int_equal(mha_isa_force(home), MHA_OK);
    free(ws);
    free(x);
    free(y);
    free(canary);
    test_layer_free(&t);
}

/* heads * head_dim beyond int32: MHA_ERR_SHAPE, found before the product is formed
   (UBSan at -O0 reports a signed overflow otherwise), *out untouched. */
static void create_overflow(void **state)
{
    (void)state;
    static float w[16];
    const int32_t big = INT32_MAX / 2;
    const mha_layer_desc cases[] = {
        {.heads = 4, .head_dim = big, .q_in = 4, .w_q = w, .w_k = w, .w_v = w},
        {.heads = 4, .kv_heads = 2, .head_dim = big, .q_in = 4, .out_dim = 4, .w_q = w,
         .w_k = w, .w_v = w, .w_o = w},
        {.heads = 2, .kv_heads = 1, .head_dim = big, .q_in = 4, .w_q = w, .w_k = w, .w_v = w},
        {.heads = 1, .head_dim = 4, .q_in = 4, .out_dim = big, .w_q = w, .w_k = w, .w_v = w,
         .w_o = w},
        {.heads = INT32_MAX, .head_dim = INT32_MAX, .q_in = INT32_MAX, .w_q = w, .w_k = w,
         .w_v = w},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mha_layer *sentinel = (mha_layer *)&sentinel, *L = sentinel;
        assert_int_equal(mha_layer_create(&cases[i], &L), MHA_ERR_SHAPE);
        assert_ptr_equal(L, sentinel);
    }
}

int main(void)
{
    require_env_isa();
    home = mha_isa_active();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_rss_one_copy), /* first: the heap is still fresh */
        cmocka_unit_test(repack_after_isa_force),
        cmocka_unit_test(repack_race),
        cmocka_unit_test(repack_nomem),
        cmocka_unit_test(create_overflow),
    };
    return cmocka_run_group_tests_name(mha_isa_name(home), tests, NULL, NULL);
}
