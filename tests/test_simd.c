/* The SIMD layer of the ISA named by MHA_ISA (tests/simd_layer.h), against
 * scalar C: arithmetic, fma, max, copysign, compares and selects bit for bit
 * (special values included), masked loads and stores at every tail length flush
 * against guard pages, transpose, lane reduction (the same order in every
 * lane), masks, and the shared exp and tanh within the ulp bounds that
 * simd/math.h states: exp over every n-th float in [-87.3, 0], tanh over every n-th
 * float in [-20, 20] (n = 97, or 9973 with MHA_TEST_QUICK), plus every float
 * within 4096 ulp of tanh's switch point and the special values. When the CPU
 * has several SIMD ISAs, their exp and tanh must agree bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "guard.h"
#include "simd_layer.h"

#define DECLARE_LAYER_(name, value) extern const simd_layer_ops simd_layer_##name;
MHA_ISA_SIMD(DECLARE_LAYER_)

typedef struct layer_entry {
    mha_isa isa;
    const simd_layer_ops *ops;
} layer_entry;
#define LAYER_ENTRY_(name, value) {value, &simd_layer_##name},
static const layer_entry layers[] = {MHA_ISA_SIMD(LAYER_ENTRY_)};
enum { N_LAYERS = sizeof layers / sizeof *layers };

static const simd_layer_ops *L; /* the layer under test */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Equal bits, or both NaN (payloads may differ between ISAs). */
static int same(float a, float b)
{
    return (isnan(a) && isnan(b)) || to_bits(a) == to_bits(b);
}

/* Random floats with special values mixed in. */
static void fill_special(rng *r, float *x, int64_t n)
{
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f,
                                    1.0f, -1.0f, 0.5f, 1.5f, 2.5f, -2.5f, 3.4e38f};
    for (int64_t i = 0; i < n; i++) {
        const float u = rng_uniform(r, 0.0f, 1.0f);
        x[i] = u < 0.25f ? special[(int64_t)(u * 56) % 14] : rng_uniform(r, -100.0f, 100.0f);
    }
}

static float scalar_binop(simd_binop op, float a, float b)
{
    switch (op) {
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV: return a / b;
    case OP_MAX: return a > b ? a : b;
    case OP_COPYSIGN: return copysignf(fabsf(a), b);
    case OP_SELECT_LT: return a < b ? a : b;
    case OP_SELECT_EQ: return a == b ? a : b;
    default: return 0.0f;
    }
}

enum { MAXN = 100, CANARY = 7 };

/* Every length 0..MAXN: results at [0, n), canaries after n untouched. */
static void arithmetic(void **state)
{
    (void)state;
    rng r = {11};
    float a[MAXN], b[MAXN], c[MAXN], y[MAXN + CANARY];
    for (int n = 0; n <= MAXN; n++) {
        fill_special(&r, a, n);
        fill_special(&r, b, n);
        fill_special(&r, c, n);
        for (int op = 0; op < OP_BINOPS; op++) {
            for (int i = 0; i < n + CANARY; i++)
                y[i] = -7.0f;
            L->binary((simd_binop)op, a, b, y, n);
            for (int i = 0; i < n; i++)
                if (!same(y[i], scalar_binop((simd_binop)op, a[i], b[i])))
                    fail_msg("binary op %d, n %d, [%d]: %a op %a = %a, want %a", op, n, i,
                             (double)a[i], (double)b[i], (double)y[i],
                             (double)scalar_binop((simd_binop)op, a[i], b[i]));
            for (int i = n; i < n + CANARY; i++)
                assert_true(y[i] == -7.0f);
        }
        L->fmadd(a, b, c, y, n);
        for (int i = 0; i < n; i++)
            if (!same(y[i], fmaf(a[i], b[i], c[i])))
                fail_msg("fmadd n %d [%d]", n, i);
        L->unary(OP_ABS, a, y, n);
        for (int i = 0; i < n; i++)
            assert_true(same(y[i], fabsf(a[i])));
        for (int i = 0; i < n; i++) /* round: ties to even, in the range exp uses */
            c[i] = i % 3 ? rng_uniform(&r, -200.0f, 200.0f)
                         : (float)(int)rng_uniform(&r, -200.0f, 200.0f) + 0.5f;
        L->unary(OP_ROUND, c, y, n);
        for (int i = 0; i < n; i++)
            assert_true(same(y[i], nearbyintf(c[i])));
    }
    const float ties[6] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f};
    float rt[6];
    L->unary(OP_ROUND, ties, rt, 6);
    for (int i = 0; i < 6; i++)
        assert_true(same(rt[i], nearbyintf(ties[i])));
    float n[254], p[254];
    for (int i = 0; i < 254; i++)
        n[i] = (float)(i - 126);
    L->unary(OP_POW2I, n, p, 254);
    for (int i = 0; i < 254; i++)
        assert_true(p[i] == ldexpf(1.0f, i - 126));
}

/* A masked load n floats from the end of a buffer flush against a guard page
   (one float more would crash), lanes past n zero; a masked store of n floats
   into such a buffer writes exactly those. */
static void masked_tails(void **state)
{
    (void)state;
    const int32_t lanes = L->lanes;
    float y[64], want[64];
    for (int32_t n = 0; n <= lanes; n++) {
        float *src = guard_alloc((size_t)(n ? n : 1), GUARD_AFTER);
        float *dst = guard_alloc((size_t)(n ? n : 1), GUARD_AFTER);
        float *src_at = src + (n ? 0 : 1), *dst_at = dst + (n ? 0 : 1); /* n = 0: at the guard */
        for (int32_t i = 0; i < n; i++)
            src_at[i] = (float)(i + 1);
        for (int32_t i = 0; i < n; i++)
            dst_at[i] = -1.0f;
        L->load_store_n(src_at, n, y, dst_at);
        for (int32_t i = 0; i < lanes; i++)
            want[i] = i < n ? (float)(i + 1) : 0.0f;
        assert_memory_equal(y, want, (size_t)lanes * sizeof(float));
        for (int32_t i = 0; i < n; i++)
            assert_true(dst_at[i] == (float)(i + 1));
        guard_free(src, (size_t)(n ? n : 1), GUARD_AFTER);
        guard_free(dst, (size_t)(n ? n : 1), GUARD_AFTER);
    }
}

static void transpose_and_reduce(void **state)
{
    (void)state;
    const int32_t lanes = L->lanes;
    rng r = {5};
    float m[64 * 64], t[64 * 64], y[64], y2[64];
    for (int i = 0; i < lanes * lanes; i++)
        m[i] = t[i] = rng_uniform(&r, -1.0f, 1.0f);
    L->transpose(t);
    for (int i = 0; i < lanes; i++)
        for (int j = 0; j < lanes; j++)
            assert_true(t[i * lanes + j] == m[j * lanes + i]);

    L->reduce_lanes(m, y);
    for (int i = 0; i < lanes; i++) {
        double sum = 0.0, mag = 0.0;
        for (int j = 0; j < lanes; j++)
            sum += m[i * lanes + j], mag += fabs(m[i * lanes + j]);
        assert_true(fabs(y[i] - sum) <= 1e-6 * mag);
    }
    /* The same vector in every slot sums to the same bits in every lane. */
    for (int i = 1; i < lanes; i++)
        memcpy(m + i * lanes, m, (size_t)lanes * sizeof(float));
    L->reduce_lanes(m, y2);
    for (int i = 1; i < lanes; i++)
        assert_true(to_bits(y2[i]) == to_bits(y2[0]));
}

static void masks(void **state)
{
    (void)state;
    const int32_t lanes = L->lanes;
    rng r = {9};
    _Alignas(64) int32_t k[64];
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < lanes; i++)
            k[i] = (int32_t)rng_uniform(&r, -8.0f, 8.0f);
        const int32_t b = (int32_t)rng_uniform(&r, -9.0f, 9.0f);
        const int32_t b2 = trial % 5 == 0 ? -100 : (int32_t)rng_uniform(&r, -9.0f, 9.0f);
        for (int op = 0; op < 4; op++) {
            uint32_t want = 0;
            for (int i = 0; i < lanes; i++) {
                const int lane = op == 0   ? k[i] > b
                                 : op == 1 ? k[i] > b || k[i] > b2
                                 : op == 2 ? k[i] > b && !(k[i] > b2)
                                           : 0;
                want |= (uint32_t)lane << i;
            }
            const uint32_t all = (lanes == 32 ? 0xffffffffu : (1u << lanes) - 1);
            want |= (uint32_t)(want == all) << 30 | (uint32_t)(want == 0) << 31;
            assert_int_equal(L->mask(op, k, b, b2), want);
        }
    }
    float buf[64] = {1.0f};
    L->prefetch(buf);
    assert_true(buf[0] == 1.0f);
}

typedef struct worst {
    int64_t ulps;
    float x;
} worst;

/* Distance in representable floats; -0 and +0 are one point. */
static int64_t ulps(float a, float b)
{
    const int32_t ia = (int32_t)to_bits(a), ib = (int32_t)to_bits(b);
    const int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return oa > ob ? oa - ob : ob - oa;
}

/* op against ref over the floats whose bits run from `from` to `to` (same sign)
   in steps of stride, `to` included, in chunks of odd length (the masked tail
   runs each time); every other SIMD layer of this CPU must give the same bits. */
static void sweep(simd_unop op, float (*ref)(float), uint32_t from, uint32_t to, uint32_t stride,
                  worst *w)
{
    enum { CHUNK = 4093 };
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK);
    float *y2 = malloc(sizeof(float) * CHUNK);
    uint64_t bits = from;
    int done = 0;
    while (!done) {
        int n = 0;
        for (; n < CHUNK && !done; n++) {
            if (bits >= to) {
                bits = to;
                done = 1;
            }
            x[n] = from_bits((uint32_t)bits);
            bits += stride;
        }
        L->unary(op, x, y, n);
        for (int i = 0; i < n; i++) {
            const int64_t u = ulps(y[i], ref(x[i]));
            if (u > w->ulps) {
                w->ulps = u;
                w->x = x[i];
            }
        }
        for (int l = 0; l < N_LAYERS; l++) {
            if (layers[l].ops == L || !mha_isa_available(layers[l].isa))
                continue;
            layers[l].ops->unary(op, x, y2, n);
            assert_memory_equal(y, y2, (size_t)n * sizeof(float));
        }
    }
    free(x);
    free(y);
    free(y2);
}

static uint32_t stride(void)
{
    return getenv("MHA_TEST_QUICK") ? 9973 : 97;
}

static void exp_ulp_bound(void **state)
{
    (void)state;
    worst w = {0, 0};
    sweep(OP_EXP, expf, to_bits(-0.0f), to_bits(-87.3f), stride(), &w);
    print_message("exp: max error %lld ulp at x = %.9g (bound %d)\n", (long long)w.ulps,
                  (double)w.x, L->exp_ulp);
    assert_true(w.ulps <= L->exp_ulp);

    const float special[4] = {-INFINITY, -1000.0f, 0.0f, NAN};
    float out[4];
    L->unary(OP_EXP, special, out, 4);
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f && isnan(out[3]));
}

static void tanh_ulp_bound(void **state)
{
    (void)state;
    worst w = {0, 0};
    for (int sign = 0; sign < 2; sign++) {
        const float s = sign ? -1.0f : 1.0f;
        /* [0, 20], and the 8193 floats around the switch from polynomial to exp */
        sweep(OP_TANH, tanhf, to_bits(s * 0.0f), to_bits(s * 20.0f), stride(), &w);
        sweep(OP_TANH, tanhf, to_bits(s * 0.625f) - 4096, to_bits(s * 0.625f) + 4096, 1, &w);
    }
    print_message("tanh: max error %lld ulp at x = %.9g (bound %d)\n", (long long)w.ulps,
                  (double)w.x, L->tanh_ulp);
    assert_true(w.ulps <= L->tanh_ulp);

    const float special[7] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -1e-40f};
    float out[7];
    L->unary(OP_TANH, special, out, 7);
    assert_true(out[0] == 1.0f && out[1] == -1.0f && isnan(out[2]));
    assert_true(out[3] == 0.0f && !signbit(out[3]) && out[4] == 0.0f && signbit(out[4]));
    assert_true(out[5] == 1e-40f && out[6] == -1e-40f);
}

int main(void)
{
    require_env_isa();
    for (int l = 0; l < N_LAYERS; l++)
        if (layers[l].isa == mha_isa_active())
            L = layers[l].ops;
    if (!L) {
        printf("%s has no SIMD layer, skipping\n", mha_isa_name(mha_isa_active()));
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(arithmetic),    cmocka_unit_test(masked_tails),
        cmocka_unit_test(transpose_and_reduce), cmocka_unit_test(masks),
        cmocka_unit_test(exp_ulp_bound), cmocka_unit_test(tanh_ulp_bound),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
