/* The vectorized exp and tanh of the active ISA against expf and tanhf, within the
 * ulp bounds their source states (exp_ulp and tanh_ulp in its kernel table): exp
 * over every n-th float in [-87.3, 0], tanh over every n-th float in [-20, 20] (n =
 * 97, or 9973 with MHA_TEST_QUICK) plus every float within 4096 ulp of its switch
 * point |x| = 0.25; the ends of each range and the special values (-INFINITY in exp
 * gives 0; tanh keeps the sign of zeros, maps +-inf to +-1 and NaN to NaN); odd
 * lengths exercise the masked tail. Registered for SIMD ISAs only; an ISA whose
 * attention calls tanhf itself (tanh_array NULL) skips the tanh test. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "internal.h"

typedef void (*array_fn)(const float *x, float *y, int64_t n);

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

/* Distance in representable floats; -0 and +0 are one point. */
static int64_t ulps(float a, float b)
{
    const int32_t ia = (int32_t)to_bits(a), ib = (int32_t)to_bits(b);
    const int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return oa > ob ? oa - ob : ob - oa;
}

typedef struct worst {
    int64_t ulps;
    float x;
} worst;

/* fn against ref over the floats whose bits run from `from` to `to` (same sign) in steps
   of stride, `to` included, in chunks of odd length (the vector tail runs each time). */
static void sweep(array_fn fn, float (*ref)(float), uint32_t from, uint32_t to, uint32_t stride,
                  worst *w)
{
    enum { CHUNK = 4093 };
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK);
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
        fn(x, y, n);
        for (int i = 0; i < n; i++) {
            const int64_t u = ulps(y[i], ref(x[i]));
            if (u > w->ulps) {
                w->ulps = u;
                w->x = x[i];
            }
        }
    }
    free(x);
    free(y);
}

static uint32_t stride(void)
{
    return getenv("MHA_TEST_QUICK") ? 9973 : 97;
}

static void exp_ulp_bound(void **state)
{
    (void)state;
    const mha_kernels *kt = mha_kernels_for(mha_isa_active());
    assert_non_null(kt->exp_array);
    worst w = {0, 0};
    sweep(kt->exp_array, expf, to_bits(-0.0f), to_bits(-87.3f), stride(), &w);
    print_message("exp: max error %lld ulp at x = %.9g (bound %d)\n", (long long)w.ulps,
                  (double)w.x, kt->exp_ulp);
    assert_true(w.ulps <= kt->exp_ulp);

    const float special[3] = {-INFINITY, -1000.0f, 0.0f};
    float out[3];
    kt->exp_array(special, out, 3);
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f);
}

static void tanh_ulp_bound(void **state)
{
    (void)state;
    const mha_kernels *kt = mha_kernels_for(mha_isa_active());
    if (!kt->tanh_array) {
        print_message("%s: no vector tanh (its attention calls tanhf)\n",
                      mha_isa_name(kt->isa));
        return;
    }
    worst w = {0, 0};
    for (int sign = 0; sign < 2; sign++) {
        const float s = sign ? -1.0f : 1.0f;
        /* [0, 20], and the 8193 floats around the switch from polynomial to exp at 0.25 */
        sweep(kt->tanh_array, tanhf, to_bits(s * 0.0f), to_bits(s * 20.0f), stride(), &w);
        sweep(kt->tanh_array, tanhf, to_bits(s * 0.25f) - 4096, to_bits(s * 0.25f) + 4096, 1, &w);
    }
    print_message("tanh: max error %lld ulp at x = %.9g (bound %d)\n", (long long)w.ulps,
                  (double)w.x, kt->tanh_ulp);
    assert_true(w.ulps <= kt->tanh_ulp);

    const float special[7] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -1e-40f};
    float out[7];
    kt->tanh_array(special, out, 7);
    assert_true(out[0] == 1.0f && out[1] == -1.0f && isnan(out[2]));
    assert_true(out[3] == 0.0f && !signbit(out[3]) && out[4] == 0.0f && signbit(out[4]));
    assert_true(out[5] == 1e-40f && out[6] == -1e-40f);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {cmocka_unit_test(exp_ulp_bound),
                                       cmocka_unit_test(tanh_ulp_bound)};
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
