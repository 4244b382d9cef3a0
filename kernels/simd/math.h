/* exp and tanh written once over the SIMD layer (an ISA's simd.h, included
 * first). The per-ISA part is two primitives: vf_round (to nearest, ties to
 * even) and vf_pow2i (2^n for integral n, built in the exponent field). Every
 * other step is an IEEE operation of the layer (mul, fma, add, div, compare,
 * select), so every ISA computes the same bits. */
#ifndef MHA_SIMD_MATH_H
#define MHA_SIMD_MATH_H

#include <stdint.h>

/* Maximum error in ulps against glibc's expf over [-87.3, 0], exp2f over [-126, 0]
 * and tanhf over [-20, 20], measured over every float of those ranges on avx2
 * (exhaustive) and checked per ISA by tests/test_simd.c. */
enum { SIMD_EXP_ULP = 1, SIMD_EXP2_ULP = 1, SIMD_TANH_ULP = 2 };

/* exp(x) for x <= 0 (the softmax range). Range reduction x = n ln2 + r with
 * n = round(x / ln2) and r = (x - n ln2_hi) - n ln2_lo (Cody-Waite: ln2_hi has
 * 16 significant bits, so n ln2_hi is exact for |n| < 2^8), |r| <= ln2/2; then
 * exp(r) - 1 ~ r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4), a degree-6 fit of
 * the relative error on Chebyshev nodes (4e-9 = 0.06 ulp in exact arithmetic),
 * evaluated in Estrin form, and exp(x) = 2^n + 2^n (exp(r) - 1). x < ln(FLT_MIN)
 * ~ -87.3365 (so -INFINITY too) gives 0; NaN stays NaN; exp(0) is exactly 1. */
static inline vf vf_exp(vf x)
{
    const vf n = vf_round(vf_mul(x, vf_set1(0x1.715476p+0f)));
    vf r = vf_fmadd(n, vf_set1(-0x1.62e4p-1f), x);
    r = vf_fmadd(n, vf_set1(-0x1.7f7d1cp-20f), r);
    const vf r2 = vf_mul(r, r);
    const vf p23 = vf_fmadd(vf_set1(0x1.55548ep-3f), r, vf_set1(0x1.fffff8p-2f));
    const vf p45 = vf_fmadd(vf_set1(0x1.123b8ep-7f), r, vf_set1(0x1.555b58p-5f));
    const vf p46 = vf_fmadd(vf_set1(0x1.687c22p-10f), r2, p45);
    const vf poly = vf_fmadd(r2, vf_fmadd(p46, r2, p23), r);
    const vf scale = vf_pow2i(n);
    const vf y = vf_fmadd(poly, scale, scale);
    return vf_select(vf_lt(x, vf_set1(-0x1.5d589ep+6f)), vf_zero(), y);
}

/* 2^x for x <= 0: the softmax's exp, whose scores carry log2(e) from the query
 * scale. x is clamped to -127 (vf_max keeps a NaN x), n = round(x) and r = x - n
 * (exact, |r| <= 1/2); then 2^r - 1 ~ r q(r), q of degree 5 fitted to the relative
 * error of 2^r on Chebyshev nodes (2e-9 = 0.03 ulp in exact arithmetic), evaluated
 * in Estrin form, and 2^x = 2^n + 2^n (2^r - 1), where 2^-127 is the exponent field
 * 0, +0. Against exp: no multiply by 1/ln2 and no two-step reduction (8 multiplies
 * and FMAs, not 10), and one max in place of a compare and a select. x < -126.5
 * (so -INFINITY too) gives 0, [-126.5, -126) subnormals; NaN stays NaN; 2^0 is
 * exactly 1. */
static inline vf vf_exp2(vf x)
{
    x = vf_max(vf_set1(-127.0f), x);
    const vf n = vf_round(x), r = vf_sub(x, n), r2 = vf_mul(r, r);
    const vf p12 = vf_fmadd(vf_set1(0x1.ebfbdcp-3f), r, vf_set1(0x1.62e430p-1f));
    const vf p34 = vf_fmadd(vf_set1(0x1.3b2d4cp-7f), r, vf_set1(0x1.c6aee8p-5f));
    const vf p56 = vf_fmadd(vf_set1(0x1.41fbbap-13f), r, vf_set1(0x1.5f3e54p-10f));
    const vf q = vf_fmadd(vf_fmadd(p56, r2, p34), r2, p12);
    const vf scale = vf_pow2i(n);
    return vf_fmadd(vf_mul(q, r), scale, scale);
}

/* tanh(x) = sign(x) t(|x|): below 0.625, t = a + a^3 Q(a^2), Q of degree 4
 * fitted to the relative error (7e-2 ulp in exact arithmetic); above it,
 * t = 1 - 2e / (1 + e) with e = exp(-2|x|) <= 0.29, free of cancellation.
 * NaN stays NaN, +-Inf gives +-1, the sign of zeros is kept. A vector whose
 * lanes all lie below 0.625 (softcapped scores, mostly) skips the exp and the
 * division: each lane's bits are those of its branch either way. */
static inline vf vf_tanh(vf x)
{
    const vf a = vf_abs(x), a2 = vf_mul(x, x), one = vf_set1(1.0f);
    vf q = vf_fmadd(vf_set1(-0x1.75e1c6p-8f), a2, vf_set1(0x1.52269ap-6f));
    q = vf_fmadd(q, a2, vf_set1(-0x1.b83c5ap-5f));
    q = vf_fmadd(q, a2, vf_set1(0x1.110726p-3f));
    q = vf_fmadd(q, a2, vf_set1(-0x1.555532p-2f));
    const vf small = vf_fmadd(vf_mul(a, a2), q, a);
    const vm is_small = vf_lt(a, vf_set1(0.625f));
    if (vm_all(is_small))
        return vf_copysign(small, x);
    const vf e = vf_exp(vf_mul(a, vf_set1(-2.0f)));
    const vf big = vf_sub(one, vf_div(vf_add(e, e), vf_add(one, e)));
    return vf_copysign(vf_select(is_small, small, big), x);
}

/* y = f(x) over an array, in vectors then a masked tail (f inlines: static). */
static inline void simd_map(vf (*f)(vf), const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_storeu(y + i, f(vf_loadu(x + i)));
    if (i < n)
        vf_storeu_n(y + i, (int32_t)(n - i), f(vf_loadu_n(x + i, (int32_t)(n - i))));
}

#endif
