/* The SIMD layer of the shared kernels (simd/flash_attention.h) for AVX-512
 * F/BW/DQ/VL: 16 float lanes; a lane mask is an opmask register. */
#ifndef MHA_AVX512_SIMD_H
#define MHA_AVX512_SIMD_H

#include <immintrin.h>
#include <stdint.h>

#define VF_LANES 16
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vm;

static inline vf vf_load(const float *p) { return _mm512_load_ps(p); } /* 64-byte aligned */
static inline vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm512_store_ps(p, x); }
static inline void vf_storeu(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

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

/* exp(x) for x <= 0, the construction of the AVX2 layer lane for lane (same
 * operations, so the same results): x = n ln2 + r with |r| <= ln2/2 (n rounded
 * by the 1.5*2^23 trick; Cody-Waite ln2 in a 9-bit head and a tail), exp(r) =
 * 1 + r + r^2 p(r) with the degree-5 minimax p of Cephes' expf, 2^n inserted in
 * the exponent field. x < ln(FLT_MIN) gives 0 (so -INFINITY gives 0), NaN stays
 * NaN, exp(0) = 1 exactly.
 * Measured over every float in [-87.3, 0] against glibc expf: max error 1 ulp. */
static inline vf vf_exp(vf x)
{
    const __m512 magic = _mm512_set1_ps(12583039.0f);
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                                   _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654475f), _CMP_NLT_UQ);
    return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
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

#endif
