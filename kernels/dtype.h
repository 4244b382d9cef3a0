/* The one list of element types, and their scalar conversions: the reference
 * that every ISA's vector conversions match bit for bit (mha.h states the rules). */
#ifndef MHA_DTYPE_H
#define MHA_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mha.h"

/* X(name, enum value, bytes per block, values per block, io): a block is the unit
 * that strides count (one element, or ggml's 32-value block_q8_0); io: also a type
 * of activations (q, k, v, out), not only of caches. In mha_dtype order. */
#define MHA_DTYPE_LIST(X)          \
    X(f32, MHA_F32, 4, 1, 1)       \
    X(f16, MHA_F16, 2, 1, 1)       \
    X(bf16, MHA_BF16, 2, 1, 1)     \
    X(q8_0, MHA_Q8_0, 34, 32, 0)

#define MHA_DTYPE_PLUS_ONE_(name, value, bytes, values, io) +1
enum { MHA_DTYPE_COUNT = 0 MHA_DTYPE_LIST(MHA_DTYPE_PLUS_ONE_) };
enum { MHA_Q8_BLOCK = 32, MHA_Q8_BYTES = 34 };

/* Is t a type of the list (of activations, when io)? */
static inline int mha_dtype_valid(mha_dtype t, int io)
{
#define MHA_DTYPE_VALID_(name, value, bytes, values, is_io) \
    if (t == value)                                          \
        return !io || is_io;
    MHA_DTYPE_LIST(MHA_DTYPE_VALID_)
#undef MHA_DTYPE_VALID_
    return 0;
}

/* Bytes of one block (the unit of strides), and values per block. */
static inline int64_t mha_dtype_block_bytes(mha_dtype t)
{
#define MHA_DTYPE_BYTES_(name, value, bytes, values, io) \
    if (t == value)                                     \
        return bytes;
    MHA_DTYPE_LIST(MHA_DTYPE_BYTES_)
#undef MHA_DTYPE_BYTES_
    return 0;
}

static inline int32_t mha_dtype_block_values(mha_dtype t)
{
    return t == MHA_Q8_0 ? MHA_Q8_BLOCK : 1;
}

/* Bytes of a row of n values (n a multiple of the block). */
static inline int64_t mha_row_bytes(mha_dtype t, int64_t n)
{
    return n / mha_dtype_block_values(t) * mha_dtype_block_bytes(t);
}

static inline uint32_t mha_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float mha_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary16 to binary32, exact; a NaN is quieted (bit 22 set), its payload kept. */
static inline float mha_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return mha_bits_f32(sign | 0x7f800000u | (m ? 0x400000u | m << 13 : 0));
    if (e)
        return mha_bits_f32(sign | (e + 112) << 23 | m << 13);
    return mha_bits_f32(sign | mha_f32_bits((float)m * 0x1p-24f));
}

/* binary32 to binary16, round to nearest even; NaN to a quiet NaN with the leading
   payload bits, overflow to +-Inf, subnormals kept. */
static inline uint16_t mha_f32_to_f16(float f)
{
    const uint32_t u = mha_f32_bits(f), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
    if (a > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)(a >> 13 & 0x3ffu);
    if (a >= 0x477ff000u) /* 65520 and above round to Inf */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* normal: rebias the exponent, round at bit 13 */
        const uint32_t r = a - 0x38000000u;
        return sign | (uint16_t)((r + 0xfffu + (r >> 13 & 1u)) >> 13);
    }
    /* subnormal (or zero): |f| * 2^24 is exact, rounded to an integer, ties to even */
    return sign | (uint16_t)nearbyintf(mha_bits_f32(a) * 0x1p24f);
}

static inline float mha_bf16_to_f32(uint16_t h)
{
    return mha_bits_f32((uint32_t)h << 16);
}

/* binary32 to bfloat16, round to nearest even; NaN to a quiet NaN. */
static inline uint16_t mha_f32_to_bf16(float f)
{
    const uint32_t u = mha_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(u >> 16 | 0x40u);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

/* One q8_0 block from 32 floats (mha.h). Where 1/d overflows (amax < 127 * 2^-128,
   a d that rounds to f16 zero) the values are undefined in ggml; here qs is 0. */
static inline void mha_quantize_q8_0(const float *x, uint8_t *blk)
{
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < MHA_Q8_BLOCK; i++) {
        const float a = fabsf(x[i]);
        finite &= a <= 3.40282347e38f;
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d16 = finite ? mha_f32_to_f16(d) : 0x7e00u;
    memcpy(blk, &d16, 2);
    for (int i = 0; i < MHA_Q8_BLOCK; i++) {
        const float r = roundf(x[i] * id);
        blk[2 + i] = (uint8_t)(int8_t)(finite && fabsf(r) <= 127.0f ? (int)r : 0);
    }
}

/* Value i of a row of type t. */
static inline float mha_load_value(mha_dtype t, const void *row, int64_t i)
{
    switch (t) {
    case MHA_F16: return mha_f16_to_f32(((const uint16_t *)row)[i]);
    case MHA_BF16: return mha_bf16_to_f32(((const uint16_t *)row)[i]);
    case MHA_Q8_0: {
        const uint8_t *blk = (const uint8_t *)row + i / MHA_Q8_BLOCK * MHA_Q8_BYTES;
        uint16_t d;
        memcpy(&d, blk, 2);
        return mha_f16_to_f32(d) * (float)(int8_t)blk[2 + i % MHA_Q8_BLOCK];
    }
    default: return ((const float *)row)[i];
    }
}

#endif
