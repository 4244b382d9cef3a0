/* The SIMD layer of the shared kernels (kernels/simd/) for AArch64 NEON: 4 float
 * lanes, 32 vector registers; a lane mask is a vector of all-ones or zero lanes. */
#ifndef MHA_NEON_SIMD_H
#define MHA_NEON_SIMD_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#define VF_LANES 4
#define VF_REGS 32
typedef float32x4_t vf;
typedef int32x4_t vi;
typedef uint32x4_t vm;

static inline vf vf_load(const float *p) { return vld1q_f32(p); }
static inline vf vf_loadu(const float *p) { return vld1q_f32(p); }
static inline void vf_store(float *p, vf x) { vst1q_f32(p, x); }
static inline void vf_storeu(float *p, vf x) { vst1q_f32(p, x); }
/* The cache line of p into L2. asm volatile: GCC treats helpers made only of
   __builtin_prefetch as side-effect free and deletes their calls. */
static inline void prefetch_l2(const void *p) { __asm__ volatile("prfm pldl2keep, %0" : : "Q"(*(const char *)p)); }
/* The cache line of p into L1 (prfm pldl1keep). */
static inline void prefetch_l1(const void *p) { __asm__ volatile("prfm pldl1keep, %0" : : "Q"(*(const char *)p)); }
static inline vf vf_set1(float x) { return vdupq_n_f32(x); }
static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
/* max as x86's maxps: b when either is NaN, so that the shared code keeps
   one NaN rule (a NaN score is caught where it is used, not by max). */
static inline vf vf_max(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
/* x rounded to an integer, ties to even. */
static inline vf vf_round(vf x) { return vrndnq_f32(x); }
/* 2^n for integral n in [-127, 127]: n + 127 in the exponent field (2^-127 gives +0). */
static inline vf vf_pow2i(vf n)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}

/* x, kept in a register: a value the compiler would otherwise reload each time. */
static inline void vf_keep(vf *x) { __asm__("" : "+w"(*x)); }

/* The first n lanes (0 <= n <= 4), through a buffer: NEON has no masked
   loads, and nothing past p + n may be touched. */
static inline vf vf_loadu_n(const float *p, int32_t n)
{
    float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(buf, p, (size_t)n * sizeof(float));
    return vld1q_f32(buf);
}
static inline void vf_storeu_n(float *p, int32_t n, vf x)
{
    float buf[4];
    vst1q_f32(buf, x);
    memcpy(p, buf, (size_t)n * sizeof(float));
}

static inline vi vi_load(const int32_t *p) { return vld1q_s32(p); }
static inline vm vi_gt(vi a, int32_t b) { return vcgtq_s32(a, vdupq_n_s32(b)); }
static inline vm vf_eq(vf a, vf b) { return vceqq_f32(a, b); }
static inline int vm_all(vm m) { return vminvq_u32(m) != 0; }
static inline int vm_empty(vm m) { return vmaxvq_u32(m) == 0; }
static inline vm vm_none(void) { return vdupq_n_u32(0); }
static inline vm vm_or(vm a, vm b) { return vorrq_u32(a, b); }
static inline vf vf_select(vm m, vf if_set, vf if_clear) { return vbslq_f32(m, if_set, if_clear); }
static inline vm vm_andnot(vm a, vm b) { return vbicq_u32(a, b); } /* a and not b */
static inline vm vf_lt(vf a, vf b) { return vcltq_f32(a, b); }
static inline vf vf_abs(vf x) { return vabsq_f32(x); }
/* |mag| with the sign of sgn, for mag >= 0. */
static inline vf vf_copysign(vf mag, vf sgn) { return vbslq_f32(vdupq_n_u32(0x80000000u), sgn, mag); }

/* The element types' vectors (kernels/dtype.h): 4 binary16 or bfloat16 values, or
   int8 values, to floats exactly (fcvtl; bf16 by a shift), and floats
   to binary16 (fcvtn, nearest even) and bfloat16 (nearest even, NaN quieted:
   integer operations). */
static inline vf vf_load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline vf vf_set1_f16(uint16_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))); }
static inline vf vf_load_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
/* 2 x 4 bfloat16 values p[0..8) as the floats of the even ones and of the odd ones. */
static inline void vf_load_bf16_pair(const uint16_t *p, vf *even, vf *odd)
{
    const uint32x4_t u = vreinterpretq_u32_u16(vld1q_u16(p));
    *even = vreinterpretq_f32_u32(vshlq_n_u32(u, 16));
    *odd = vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xffff0000u)));
}
static inline vf vf_load_i8(const int8_t *p)
{
    int32_t w;
    memcpy(&w, p, 4); /* exactly the 4 bytes: nothing past them may be read */
    const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}
static inline void vf_store_f16(uint16_t *p, vf x) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x))); }
static inline void vf_store_bf16(uint16_t *p, vf x)
{
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t even = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), even), 16);
    const uint32x4_t q = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    vst1_u16(p, vmovn_u32(vbslq_u32(vmvnq_u32(vceqq_f32(x, x)), q, r)));
}

/* 4x4 transpose of rows a[0..4) (in place). */
static inline void vf_transpose(vf a[4])
{
    const float32x4_t t0 = vtrn1q_f32(a[0], a[1]), t1 = vtrn2q_f32(a[0], a[1]);
    const float32x4_t t2 = vtrn1q_f32(a[2], a[3]), t3 = vtrn2q_f32(a[2], a[3]);
    a[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    a[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    a[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    a[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* Lane i of x becomes lane i ^ s (s = 1 or 2): a butterfly step. */
static inline vf vf_swap_lanes(vf x, int s)
{
    return s == 2 ? vextq_f32(x, x, 2) : vrev64q_f32(x);
}

/* r lane i = the sum of a[i]'s 4 lanes, every lane summed in the same order
 * ((l0 + l1) + (l2 + l3)): two rounds of pairwise adds. */
static inline vf vf_reduce_lanes(const vf a[4])
{
    return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}

#endif
