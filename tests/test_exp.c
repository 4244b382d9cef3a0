/* The vectorized exp of the active ISA against expf: every n-th float in
 * [-87.3, 0] (n = 97, or 9973 with MHA_TEST_QUICK) plus the ends, within the
 * ulp bound its source states (exp_ulp in its kernel table); -INFINITY gives 0
 * and odd lengths exercise the masked tail. Registered for SIMD ISAs only. */
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

typedef void (*exp_fn)(const float *x, float *y, int64_t n);

static exp_fn isa_exp(int *bound)
{
    const mha_kernels *kt = mha_kernels_for(mha_isa_active());
    *bound = kt->exp_ulp;
    return kt->exp_array;
}

static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia; /* both >= 0 here */
}

static void exp_ulp_bound(void **state)
{
    (void)state;
    int bound = 0;
    exp_fn fn = isa_exp(&bound);
    assert_non_null(fn);
    const uint32_t stride = getenv("MHA_TEST_QUICK") ? 9973 : 97;
    const uint32_t lo = 0x80000000u; /* -0.0f */
    const float end = -87.3f;
    uint32_t hi;
    memcpy(&hi, &end, 4);
    enum { CHUNK = 4093 }; /* odd, so the vector tail runs on every chunk */
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK);
    int64_t worst = 0;
    float worst_x = 0;
    for (uint64_t bits = lo; bits <= hi;) {
        int n = 0;
        for (; n < CHUNK && bits <= hi; n++, bits += stride)
            memcpy(&x[n], &(uint32_t){(uint32_t)bits}, 4);
        if (bits > hi && n < CHUNK)
            x[n++] = end;
        fn(x, y, n);
        for (int i = 0; i < n; i++) {
            const int64_t u = ulps(y[i], expf(x[i]));
            if (u > worst) {
                worst = u;
                worst_x = x[i];
            }
        }
    }
    print_message("max error %lld ulp at x = %.9g (bound %d)\n", (long long)worst, worst_x, bound);
    assert_true(worst <= bound);

    const float special[3] = {-INFINITY, -1000.0f, 0.0f};
    float out[3];
    fn(special, out, 3);
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f);
    free(x);
    free(y);
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {cmocka_unit_test(exp_ulp_bound)};
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
