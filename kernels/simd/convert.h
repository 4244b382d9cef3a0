/* Loads and stores of every element type written once over the SIMD layer (an
 * ISA's simd.h, included first): whole vectors through the layer's vf_load_f16 /
 * bf16 / q8 and vf_store_f16 / bf16, tails of n < VF_LANES values through a
 * buffer, so that nothing past the n values is touched. The bits are those of the
 * scalar conversions of kernels/dtype.h on every ISA. */
#ifndef MHA_SIMD_CONVERT_H
#define MHA_SIMD_CONVERT_H

#include <string.h>

#include "dtype.h"

static inline vf vf_load_f16_n(const uint16_t *p, int32_t n)
{
    uint16_t buf[VF_LANES] = {0};
    memcpy(buf, p, (size_t)n * 2);
    return vf_load_f16(buf);
}

static inline vf vf_load_bf16_n(const uint16_t *p, int32_t n)
{
    uint16_t buf[VF_LANES] = {0};
    memcpy(buf, p, (size_t)n * 2);
    return vf_load_bf16(buf);
}

static inline void vf_store_f16_n(uint16_t *p, int32_t n, vf x)
{
    uint16_t buf[VF_LANES];
    vf_store_f16(buf, x);
    memcpy(p, buf, (size_t)n * 2);
}

static inline void vf_store_bf16_n(uint16_t *p, int32_t n, vf x)
{
    uint16_t buf[VF_LANES];
    vf_store_bf16(buf, x);
    memcpy(p, buf, (size_t)n * 2);
}

/* VF_LANES int8 values times a q8_0 block's scale d: exactly x * d. */
static inline vf vf_load_q8(const int8_t *p, vf d)
{
    return vf_mul(vf_load_i8(p), d);
}

/* The scale of the q8_0 block at blk, in every lane, converted by the vector unit:
   scales are loaded per block and key, and the branchy scalar conversion cost
   about as much as the values it scales. */
static inline vf vf_q8_scale(const char *blk)
{
    uint16_t d;
    memcpy(&d, blk, 2);
    return vf_set1_f16(d);
}

/* Values [i, i + VF_LANES) of a row of type T (i a multiple of VF_LANES for
   MHA_Q8_0, whose rows hold whole blocks); inlined with a constant T, one path. */
static inline __attribute__((always_inline)) vf vf_load_as(const int T, const void *row, int64_t i)
{
    switch (T) {
    case MHA_F16: return vf_load_f16((const uint16_t *)row + i);
    case MHA_BF16: return vf_load_bf16((const uint16_t *)row + i);
    case MHA_Q8_0: {
        const char *blk = (const char *)row + i / MHA_Q8_BLOCK * MHA_Q8_BYTES;
        return vf_load_q8((const int8_t *)blk + 2 + i % MHA_Q8_BLOCK, vf_q8_scale(blk));
    }
    default: return vf_loadu((const float *)row + i);
    }
}

/* The first n (1..VF_LANES) of them, the rest 0; never past value i + n - 1. */
static inline __attribute__((always_inline)) vf vf_load_as_n(const int T, const void *row,
                                                            int64_t i, int32_t n)
{
    switch (T) {
    case MHA_F16: return vf_load_f16_n((const uint16_t *)row + i, n);
    case MHA_BF16: return vf_load_bf16_n((const uint16_t *)row + i, n);
    case MHA_Q8_0: return vf_load_as(T, row, i); /* rows of whole blocks have no tails */
    default: return vf_loadu_n((const float *)row + i, n);
    }
}

/* Stores to values [i, i + n) of a row of an io type T (n <= VF_LANES). */
static inline __attribute__((always_inline)) void vf_store_as_n(const int T, void *row, int64_t i,
                                                               int32_t n, vf x)
{
    switch (T) {
    case MHA_F16:
        if (n == VF_LANES)
            vf_store_f16((uint16_t *)row + i, x);
        else
            vf_store_f16_n((uint16_t *)row + i, n, x);
        break;
    case MHA_BF16:
        if (n == VF_LANES)
            vf_store_bf16((uint16_t *)row + i, x);
        else
            vf_store_bf16_n((uint16_t *)row + i, n, x);
        break;
    default:
        if (n == VF_LANES)
            vf_storeu((float *)row + i, x);
        else
            vf_storeu_n((float *)row + i, n, x);
    }
}

/* dst[0..n) (type T) = the floats src[0..n). */
static inline __attribute__((always_inline)) void simd_store_row(const int T, void *dst,
                                                                const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_store_as_n(T, dst, i, VF_LANES, vf_loadu(src + i));
    if (i < n)
        vf_store_as_n(T, dst, i, (int32_t)(n - i), vf_loadu_n(src + i, (int32_t)(n - i)));
}

/* dst[0..n) floats = the values [0, n) of a row of type T. */
static inline __attribute__((always_inline)) void simd_load_row(const int T, float *dst,
                                                               const void *src, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_storeu(dst + i, vf_load_as(T, src, i));
    if (i < n)
        vf_storeu_n(dst + i, (int32_t)(n - i), vf_load_as_n(T, src, i, (int32_t)(n - i)));
}

/* The table's convert (internal.h): n values from type `from` to `to`, through
   floats a vector at a time; q8_0 only as a source. */
static inline void simd_convert(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n)
{
#define SIMD_CONVERT_FROM_(F)                                                                  \
    for (int64_t i = 0; i < n; i += VF_LANES) {                                               \
        const int32_t c = n - i < VF_LANES ? (int32_t)(n - i) : VF_LANES;                    \
        const vf x = c == VF_LANES ? vf_load_as(F, src, i) : vf_load_as_n(F, src, i, c);     \
        switch (to) {                                                                         \
        case MHA_F16: vf_store_as_n(MHA_F16, dst, i, c, x); break;                            \
        case MHA_BF16: vf_store_as_n(MHA_BF16, dst, i, c, x); break;                          \
        default: vf_store_as_n(MHA_F32, dst, i, c, x); break;                                 \
        }                                                                                     \
    }
    switch (from) {
    case MHA_F16: SIMD_CONVERT_FROM_(MHA_F16) break;
    case MHA_BF16: SIMD_CONVERT_FROM_(MHA_BF16) break;
    case MHA_Q8_0: SIMD_CONVERT_FROM_(MHA_Q8_0) break;
    default: SIMD_CONVERT_FROM_(MHA_F32) break;
    }
#undef SIMD_CONVERT_FROM_
}

#endif
