/* The SIMD layer of the shared kernels (kernels/simd/) for AVX2+FMA:
 * 8 float lanes, 16 vector registers; a lane mask is a vector of all-ones or zero lanes. */
#ifndef MHA_AVX2_SIMD_H
#define MHA_AVX2_SIMD_H

#include <immintrin.h>
#include <stdint.h>

#define VF_LANES 8
#define VF_REGS 16
typedef __m256 vf;
typedef __m256i vi;
typedef __m256 vm;

static inline vf vf_load(const float *p) { return _mm256_load_ps(p); } /* 32-byte aligned */
static inline vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm256_store_ps(p, x); }
static inline void vf_storeu(float *p, vf x) { _mm256_storeu_ps(p, x); }
/* The cache line of p into L2 (prefetcht1). asm volatile: GCC treats helpers made
   only of __builtin_prefetch as side-effect free and deletes their calls. */
static inline void prefetch_l2(const void *p) { __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p)); }
/* The cache line of p into L1 (prefetcht0). */
static inline void prefetch_l1(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p)); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }

/* x, kept in a register: a value the compiler would otherwise reload as a memory
   operand of each instruction that uses it. */
static inline void vf_keep(vf *x) { __asm__("" : "+x"(*x)); }

/* The first n lanes (0 <= n <= 8). */
static inline vi vi_first(int32_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_loadu_n(const float *p, int32_t n) { return _mm256_maskload_ps(p, vi_first(n)); }
static inline void vf_storeu_n(float *p, int32_t n, vf x) { _mm256_maskstore_ps(p, vi_first(n), x); }

static inline vi vi_load(const int32_t *p) { return _mm256_load_si256((const __m256i *)p); }
static inline vm vi_gt(vi a, int32_t b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(b))); }
static inline vm vf_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
static inline int vm_all(vm m) { return _mm256_movemask_ps(m) == 0xff; }
static inline int vm_empty(vm m) { return _mm256_movemask_ps(m) == 0; }
static inline vm vm_none(void) { return _mm256_setzero_ps(); }
static inline vm vm_or(vm a, vm b) { return _mm256_or_ps(a, b); }
static inline vf vf_select(vm m, vf if_set, vf if_clear) { return _mm256_blendv_ps(if_clear, if_set, m); }
static inline vm vm_andnot(vm a, vm b) { return _mm256_andnot_ps(b, a); } /* a and not b */
static inline vm vf_lt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline vf vf_abs(vf x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
/* |mag| with the sign of sgn, for mag >= 0. */
static inline vf vf_copysign(vf mag, vf sgn) { return _mm256_or_ps(mag, _mm256_and_ps(sgn, _mm256_set1_ps(-0.0f))); }

/* x rounded to an integer, ties to even. */
static inline vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-127, 127]: n + 127 in the exponent field (2^-127 gives +0). */
static inline vf vf_pow2i(vf n)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

/* The element types' vectors (kernels/dtype.h): VF_LANES binary16 or bfloat16
   values, or int8 values, to floats exactly (F16C; bf16 by a shift),
   and floats to binary16 (F16C, nearest even) and bfloat16 (nearest even, NaN
   quieted: integer operations). */
static inline vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vf_set1_f16(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16((short)h)); }
static inline vf vf_load_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* 2 x 8 bfloat16 values p[0..16) as the floats of the even ones and of the odd ones:
   one load, one shift, one and (no widening shuffles). */
static inline void vf_load_bf16_pair(const uint16_t *p, vf *even, vf *odd)
{
    const __m256i u = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline vf vf_load_i8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline void vf_store_f16(uint16_t *p, vf x)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const __m256i u = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
    const __m256i even = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), even), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i h = _mm256_blendv_epi8(r, q, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* 8x8 transpose of rows a[0..8) (in place). */
static inline void vf_transpose(vf a[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        a[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Lane i of x becomes lane i ^ s (s = 1, 2 or 4): a butterfly step. */
static inline vf vf_swap_lanes(vf x, int s)
{
    switch (s) {
    case 4: return _mm256_permute2f128_ps(x, x, 0x01);
    case 2: return _mm256_permute_ps(x, 0x4e);
    default: return _mm256_permute_ps(x, 0xb1);
    }
}

/* r lane i = the sum of a[i]'s 8 lanes, every lane summed in the same order
 * ((l0 + l2) + (l1 + l3)) + ((l4 + l6) + (l5 + l7)): in-lane unpacks and shuffles
 * first (12, cheap on every AVX2 core), the two 128-bit halves last (2 lane-crossing
 * permutes, slow on Zen 1 and 2, where a transpose-and-add would take 8). */
static inline vf vf_reduce_lanes(const vf a[8])
{
    __m256 s[4], q[2];
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0xee));
    return _mm256_add_ps(_mm256_permute2f128_ps(q[0], q[1], 0x20),
                         _mm256_permute2f128_ps(q[0], q[1], 0x31));
}

#endif
