/* The SIMD layer of the shared kernels (kernels/simd/) for AVX-512
 * F/BW/DQ/VL: 16 float lanes, 32 vector registers; a lane mask is an opmask register. */
#ifndef MHA_AVX512_SIMD_H
#define MHA_AVX512_SIMD_H

#include <immintrin.h>
#include <stdint.h>

#define VF_LANES 16
#define VF_REGS 32
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vm;

static inline vf vf_load(const float *p) { return _mm512_load_ps(p); } /* 64-byte aligned */
static inline vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm512_store_ps(p, x); }
static inline void vf_storeu(float *p, vf x) { _mm512_storeu_ps(p, x); }
/* The cache line of p into L2 (prefetcht1). asm volatile: GCC treats helpers made
   only of __builtin_prefetch as side-effect free and deletes their calls. */
static inline void prefetch_l2(const void *p) { __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p)); }
/* The cache line of p into L1 (prefetcht0). */
static inline void prefetch_l1(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p)); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

/* x, kept in a register: a value the compiler would otherwise reload as a memory
   operand of each instruction that uses it. */
static inline void vf_keep(vf *x) { __asm__("" : "+v"(*x)); }

/* The first n lanes (0 <= n <= 16). */
static inline vm vm_first(int32_t n) { return (vm)((1u << n) - 1); }
static inline vf vf_loadu_n(const float *p, int32_t n) { return _mm512_maskz_loadu_ps(vm_first(n), p); }
static inline void vf_storeu_n(float *p, int32_t n, vf x) { _mm512_mask_storeu_ps(p, vm_first(n), x); }

static inline vi vi_load(const int32_t *p) { return _mm512_load_si512(p); }
static inline vm vi_gt(vi a, int32_t b) { return _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(b)); }
static inline vm vf_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
static inline int vm_all(vm m) { return m == 0xffff; }
static inline int vm_empty(vm m) { return m == 0; }
static inline vm vm_none(void) { return 0; }
static inline vm vm_or(vm a, vm b) { return a | b; }
static inline vf vf_select(vm m, vf if_set, vf if_clear) { return _mm512_mask_blend_ps(m, if_clear, if_set); }
static inline vm vm_andnot(vm a, vm b) { return (vm)(a & ~b); } /* a and not b */
static inline vm vf_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline vf vf_abs(vf x) { return _mm512_abs_ps(x); }
/* |mag| with the sign of sgn, for mag >= 0. */
static inline vf vf_copysign(vf mag, vf sgn) { return _mm512_or_ps(mag, _mm512_and_ps(sgn, _mm512_set1_ps(-0.0f))); }

/* x rounded to an integer, ties to even. */
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-127, 127]: n + 127 in the exponent field (2^-127 gives +0). */
static inline vf vf_pow2i(vf n)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}

/* The element types' vectors (kernels/dtype.h): VF_LANES binary16 or bfloat16
   values, or int8 values, to floats exactly, and floats to binary16
   (vcvtps2ph, nearest even) and bfloat16 (nearest even, NaN quieted: integer
   operations; AVX512-BF16's vcvtneps2bf16 flushes subnormals, which mha.h keeps). */
static inline vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vf_set1_f16(uint16_t h) { return _mm512_cvtph_ps(_mm256_set1_epi16((short)h)); }
static inline vf vf_load_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* 2 x 16 bfloat16 values p[0..32) as the floats of the even ones and of the odd ones. */
static inline void vf_load_bf16_pair(const uint16_t *p, vf *even, vf *odd)
{
    const __m512i u = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline vf vf_load_i8(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline void vf_store_f16(uint16_t *p, vf x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i even = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), even), 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __m512i h = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, q);
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(h));
}

/* 16x16 transpose of rows a[0..16) (in place): interleave 32-bit pairs, then
 * 64-bit pairs (lane L of u[4i + c] holds column 4L + c of rows 4i..4i+3), then
 * gather the 128-bit lanes of column 4L + c from u[c], u[4 + c], u[8 + c], u[12 + c]. */
static inline void vf_transpose(vf a[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        const __m512 even_lo = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 even_hi = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 odd_lo = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 odd_hi = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        a[c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
        a[8 + c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd);
        a[4 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
        a[12 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd);
    }
}

/* Lane i of x becomes lane i ^ s (s = 1, 2, 4 or 8): a butterfly step. */
static inline vf vf_swap_lanes(vf x, int s)
{
    switch (s) {
    case 8: return _mm512_shuffle_f32x4(x, x, 0x4e);
    case 4: return _mm512_shuffle_f32x4(x, x, 0xb1);
    case 2: return _mm512_permute_ps(x, 0x4e);
    default: return _mm512_permute_ps(x, 0xb1);
    }
}

/* r lane i = the sum of a[i]'s 16 lanes, every lane summed in the same order
 * (l + 8, l + 4, l + 2, l + 1): halves of the data at each step, 30 shuffles where a
 * transpose takes 64. The steps leave lanes in the order 0 2 1 3 8 10 9 11 4 6 5 7
 * 12 14 13 15 (an involution), so inputs are taken in that order. */
static inline vf vf_reduce_lanes(const vf a[16])
{
    static const int order[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[order[i]], a[order[i + 8]], 0x44),
                             _mm512_shuffle_f32x4(a[order[i]], a[order[i + 8]], 0xee));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], 0x88),
                             _mm512_shuffle_f32x4(b[i], b[i + 4], 0xdd));
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], 0x44),
                             _mm512_shuffle_ps(c[i], c[i + 2], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
}

#endif
