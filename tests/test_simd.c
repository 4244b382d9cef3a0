/* The SIMD layer of the ISA named by MHA_ISA (tests/simd_layer.h), against
 * scalar C: arithmetic, fma, max, copysign, compares and selects bit for bit
 * (special values included), masked loads and stores at every tail length flush
 * against guard pages, transpose, lane reduction (the same order in every
 * lane), masks, and the shared exp, exp2 and tanh within the ulp bounds that
 * simd/math.h states: exp over every n-th float in [-87.3, 0], exp2 in [-126, 0],
 * tanh in [-20, 20] (n = 97, or 9973 with MHA_TEST_QUICK), plus every float
 * within 4096 ulp of tanh's switch point and the special values. When the CPU
 * has several SIMD ISAs, their exp, exp2 and tanh must agree bit for bit. The element
 * types' conversions: every one of the 65536 binary16 and bfloat16 patterns to
 * f32 against a decoding written here from the fields, and floats of every
 * rounding class (ties both ways, the largest finite and overflow, subnormals,
 * zeros, NaN payloads) to 16 bits against the scalar conversions of
 * kernels/dtype.h and against values worked out by hand, bit for bit, with every
 * tail length; int8 times a scale. */
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
#include "dtype.h"
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
    float n[255], p[255];
    for (int i = 0; i < 255; i++)
        n[i] = (float)(i - 127);
    L->unary(OP_POW2I, n, p, 255);
    assert_true(same(p[0], 0.0f)); /* 2^-127: the exponent field 0, +0 */
    for (int i = 1; i < 255; i++)
        assert_true(p[i] == ldexpf(1.0f, i - 127));
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

    /* Butterfly steps: lane i takes lane i ^ s. */
    for (int s = 1; s < lanes; s *= 2) {
        L->swap_lanes(m, s, y);
        for (int i = 0; i < lanes; i++)
            assert_true(to_bits(y[i]) == to_bits(m[i ^ s]));
    }
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

/* op within bound ulps of ref over [to, from] (x <= 0), every stride()-th float. */
static void ulp_bound(const char *name, simd_unop op, float (*ref)(float), float from, float to,
                      int32_t bound)
{
    worst w = {0, 0};
    sweep(op, ref, to_bits(from), to_bits(to), stride(), &w);
    print_message("%s: max error %lld ulp at x = %.9g (bound %d)\n", name, (long long)w.ulps,
                  (double)w.x, bound);
    assert_true(w.ulps <= bound);
}

static void exp_ulp_bound(void **state)
{
    (void)state;
    ulp_bound("exp", OP_EXP, expf, -0.0f, -87.3f, L->exp_ulp);

    const float special[4] = {-INFINITY, -1000.0f, 0.0f, NAN};
    float out[4];
    L->unary(OP_EXP, special, out, 4);
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f && isnan(out[3]));
}

static void exp2_ulp_bound(void **state)
{
    (void)state;
    ulp_bound("exp2", OP_EXP2, exp2f, -0.0f, -126.0f, L->exp2_ulp);

    const float special[7] = {-INFINITY, -1000.0f, -126.5001f, -126.0f, 0.0f, NAN, -126.25f};
    float out[7];
    L->unary(OP_EXP2, special, out, 7);
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f && out[3] == 0x1p-126f);
    assert_true(out[4] == 1.0f && isnan(out[5]));
    assert_true(ulps(out[6], exp2f(-126.25f)) <= 1); /* a subnormal */
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

/* binary16 and bfloat16 to binary32 from their fields; NaN quieted (bit 22),
   payload kept in the leading bits. */
static uint32_t half_bits(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
        return sign | 0x7f800000u | (m ? 0x400000u | m << 13 : 0);
    if (e == 0)
        return sign | to_bits(ldexpf((float)m, -24));
    return sign | (e + 112) << 23 | m << 13;
}

static void sixteen_bit_loads(void **state)
{
    (void)state;
    enum { N = 65536 };
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    float *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    L->load16(MHA_F16, h, y, N);
    for (int i = 0; i < N; i++)
        if (to_bits(y[i]) != half_bits((uint16_t)i))
            fail_msg("f16 0x%04x to f32: 0x%08x, want 0x%08x", i, to_bits(y[i]), half_bits((uint16_t)i));
    float lanes[64];
    for (int i = 0; i < N; i++) { /* one value in every lane: the q8_0 scales */
        L->set1_f16((uint16_t)i, lanes);
        for (int l = 0; l < L->lanes; l++)
            if (to_bits(lanes[l]) != half_bits((uint16_t)i))
                fail_msg("f16 0x%04x in every lane, lane %d: 0x%08x", i, l, to_bits(lanes[l]));
    }
    L->load16(MHA_BF16, h, y, N);
    for (int i = 0; i < N; i++)
        if (to_bits(y[i]) != (uint32_t)i << 16)
            fail_msg("bf16 0x%04x to f32: 0x%08x", i, to_bits(y[i]));
    /* bf16 pairs: every pattern in even and in odd position; the last pair ends at a
       guard page (nothing past the 2 x lanes values is read). */
    float even[64], odd[64];
    for (int i = 0; i < N; i += 2 * L->lanes) {
        L->load_bf16_pair(h + i, even, odd);
        for (int l = 0; l < L->lanes; l++)
            if (to_bits(even[l]) != (uint32_t)(i + 2 * l) << 16
                || to_bits(odd[l]) != (uint32_t)(i + 2 * l + 1) << 16)
                fail_msg("bf16 pair at 0x%04x, lane %d", i, l);
    }
    uint16_t *hp = guard_alloc_bytes((size_t)L->lanes * 4, GUARD_AFTER);
    memcpy(hp, h + 77, (size_t)L->lanes * 4);
    L->load_bf16_pair(hp, even, odd);
    for (int l = 0; l < L->lanes; l++)
        assert_true(to_bits(even[l]) == (uint32_t)(77 + 2 * l) << 16
                    && to_bits(odd[l]) == (uint32_t)(78 + 2 * l) << 16);
    guard_free_bytes(hp, (size_t)L->lanes * 4, GUARD_AFTER);
    for (int n = 0; n <= 3 * L->lanes; n++) { /* tails: nothing past n is read or written */
        float *yg = guard_alloc((size_t)(n ? n : 1), GUARD_AFTER);
        uint16_t *hg = guard_alloc_bytes((size_t)n * 2, GUARD_AFTER);
        memcpy(hg, h + 1000, (size_t)n * 2);
        L->load16(MHA_F16, hg, yg + (n ? 0 : 1), n);
        for (int i = 0; i < n; i++)
            assert_true(to_bits(yg[i]) == half_bits((uint16_t)(1000 + i)));
        guard_free_bytes(hg, (size_t)n * 2, GUARD_AFTER);
        guard_free(yg, (size_t)(n ? n : 1), GUARD_AFTER);
    }
    free(h);
    free(y);
}

static void sixteen_bit_stores(void **state)
{
    (void)state;
    /* Values with their f16 and bf16 bits worked out by hand. */
    static const struct {
        uint32_t x;
        uint16_t f16, bf16;
    } cases[] = {
        {0x3f800000, 0x3c00, 0x3f80}, /* 1 */
        {0x3f801000, 0x3c00, 0x3f80}, /* 1 + 2^-11: f16 tie to even (down) */
        {0x3f803000, 0x3c02, 0x3f80}, /* 1 + 3*2^-11: f16 tie to even (up) */
        {0x3f808000, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 tie to even (down) */
        {0x3f818000, 0x3c0c, 0x3f82}, /* 1 + 3*2^-8: bf16 tie to even (up) */
        {0x477fe000, 0x7bff, 0x4780}, /* 65504, the largest f16 */
        {0x477fefff, 0x7bff, 0x4780}, /* just below the overflow tie */
        {0x477ff000, 0x7c00, 0x4780}, /* 65520: f16 overflow by rounding */
        {0x7f7fffff, 0x7c00, 0x7f80}, /* FLT_MAX: f16 Inf, bf16 rounds to Inf */
        {0x7f800000, 0x7c00, 0x7f80}, /* Inf */
        {0xff800000, 0xfc00, 0xff80}, /* -Inf */
        {0x33800000, 0x0001, 0x3380}, /* 2^-24, the smallest f16 subnormal */
        {0x33000000, 0x0000, 0x3300}, /* 2^-25: tie to even, zero */
        {0x33400000, 0x0001, 0x3340}, /* 3*2^-26: rounds up to 2^-24 */
        {0x387fc000, 0x03ff, 0x3880}, /* the largest f16 subnormal */
        {0x38800000, 0x0400, 0x3880}, /* 2^-14, the smallest f16 normal */
        {0x00000001, 0x0000, 0x0000}, /* the smallest f32 subnormal */
        {0x00400000, 0x0000, 0x0040}, /* an f32 subnormal, kept by bf16 */
        {0x80000000, 0x8000, 0x8000}, /* -0 */
        {0x7fc00000, 0x7e00, 0x7fc0}, /* quiet NaN */
        {0x7f800001, 0x7e00, 0x7fc0}, /* signalling NaN, payload in low bits: quieted */
        {0x7fa12345, 0x7f09, 0x7fe1}, /* signalling NaN, payload kept in the leading bits */
        {0xffc00001, 0xfe00, 0xffc0}, /* negative NaN */
    };
    enum { NC = sizeof cases / sizeof *cases };
    float x[NC];
    uint16_t h[NC + 4], b[NC + 4];
    for (int i = 0; i < NC; i++)
        x[i] = from_bits(cases[i].x);
    for (int n = 0; n <= NC; n++) { /* every tail; canaries after n */
        for (int i = 0; i < NC + 4; i++)
            h[i] = b[i] = 0xabcd;
        L->store16(MHA_F16, x, h, n);
        L->store16(MHA_BF16, x, b, n);
        for (int i = 0; i < n; i++) {
            if (h[i] != cases[i].f16 || h[i] != mha_f32_to_f16(x[i]))
                fail_msg("f32 0x%08x to f16: 0x%04x, want 0x%04x", cases[i].x, h[i], cases[i].f16);
            if (b[i] != cases[i].bf16 || b[i] != mha_f32_to_bf16(x[i]))
                fail_msg("f32 0x%08x to bf16: 0x%04x, want 0x%04x", cases[i].x, b[i], cases[i].bf16);
        }
        for (int i = n; i < NC + 4; i++)
            assert_true(h[i] == 0xabcd && b[i] == 0xabcd);
    }
    /* Random floats of every magnitude, against the scalar conversions. */
    rng r = {77};
    enum { NR = 100003 };
    float *xr = malloc(sizeof(float) * NR);
    uint16_t *hr = malloc(sizeof(uint16_t) * NR);
    for (int i = 0; i < NR; i++)
        xr[i] = from_bits((uint32_t)(rng_uniform(&r, 0.0f, 1.0f) * 4294967040.0f) ^ (uint32_t)i);
    for (int t = 0; t < 2; t++) {
        L->store16(t ? MHA_BF16 : MHA_F16, xr, hr, NR);
        for (int i = 0; i < NR; i++) {
            const uint16_t want = t ? mha_f32_to_bf16(xr[i]) : mha_f32_to_f16(xr[i]);
            if (hr[i] != want)
                fail_msg("%s of 0x%08x: 0x%04x, scalar 0x%04x", t ? "bf16" : "f16", to_bits(xr[i]),
                         hr[i], want);
        }
    }
    free(xr);
    free(hr);
    int8_t q[64];
    float y[64];
    for (int i = 0; i < 64; i++)
        q[i] = (int8_t)(i * 37 - 128);
    L->load_q8(q, 0.5f, y);
    for (int i = 0; i < L->lanes; i++)
        assert_true(y[i] == 0.5f * q[i]);
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
        cmocka_unit_test(exp_ulp_bound), cmocka_unit_test(exp2_ulp_bound),
        cmocka_unit_test(tanh_ulp_bound),
        cmocka_unit_test(sixteen_bit_loads), cmocka_unit_test(sixteen_bit_stores),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
