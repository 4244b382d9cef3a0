/* NEON GEMM microkernel, 8 rows x 12 columns, per the gemm_tile contract in
 * internal.h: tile[i][j] = sum_{k < kc} a[i*lda + k] * w[k*12 + j].
 *
 * The tile lives in 24 q-register accumulators ci0, ci1, ci2 (row i, columns
 * 0-3, 4-7, 8-11). A is not packed, so each row's next 4 k's come in one
 * vector load and are multiplied in by lane (vfmaq_laneq_f32). Eight such A
 * vectors, 3 W vectors and 24 accumulators would need 35 of the 32 registers,
 * so a group of 4 k's runs in two halves of 4 rows, the second reloading the
 * same W vectors from L1: per k step 2 A loads + 6 W vector loads feed 24
 * FMAs, in 31 registers. Broadcasting A instead (ld1r per row) would cost
 * 8 + 3 = 11 loads per k step. A tail of kc % 4 k's uses broadcasts.
 *
 * Rows i >= mr repeat row mr-1 (clamped pointers), so nothing past row mr-1
 * is read. GCC's pre-allocation scheduler spills this tile (see meson.build:
 * -fno-schedule-insns), and the empty asm on w keeps it from merging the two
 * halves' W loads, which would also exceed the register file. */
#include <arm_neon.h>

#include "internal.h"

enum { NR = 12 };

#define ZERO3(i) float32x4_t c##i##0 = vdupq_n_f32(0.0f), c##i##1 = c##i##0, c##i##2 = c##i##0

/* Row i takes lane s of its A vector ai times W row s (w0..w2). */
#define FMA_LANE(i, s)                               \
    c##i##0 = vfmaq_laneq_f32(c##i##0, w0, a##i, s); \
    c##i##1 = vfmaq_laneq_f32(c##i##1, w1, a##i, s); \
    c##i##2 = vfmaq_laneq_f32(c##i##2, w2, a##i, s)

/* Rows r..u take k step k+s. */
#define KSTEP(r, t, u, v, s)                                                                   \
    do {                                                                                       \
        const float32x4_t w0 = vld1q_f32(w + (s) * NR), w1 = vld1q_f32(w + (s) * NR + 4),      \
                          w2 = vld1q_f32(w + (s) * NR + 8);                                    \
        FMA_LANE(r, s); FMA_LANE(t, s); FMA_LANE(u, s); FMA_LANE(v, s);                        \
    } while (0)

/* Rows r, t, u, v take k steps k..k+3. */
#define QUAD(r, t, u, v)                                                                       \
    do {                                                                                       \
        const float32x4_t a##r = vld1q_f32(p##r + k), a##t = vld1q_f32(p##t + k),              \
                          a##u = vld1q_f32(p##u + k), a##v = vld1q_f32(p##v + k);              \
        KSTEP(r, t, u, v, 0); KSTEP(r, t, u, v, 1); KSTEP(r, t, u, v, 2); KSTEP(r, t, u, v, 3); \
    } while (0)

/* Row i takes one k step: a[i][k] broadcast times W row k. */
#define FMA_DUP(i)                                          \
    do {                                                    \
        const float32x4_t x = vld1q_dup_f32(p##i + k);      \
        c##i##0 = vfmaq_f32(c##i##0, w0, x);                \
        c##i##1 = vfmaq_f32(c##i##1, w1, x);                \
        c##i##2 = vfmaq_f32(c##i##2, w2, x);                \
    } while (0)

#define STORE3(i)                                 \
    vst1q_f32(tile + (i) * NR, c##i##0);          \
    vst1q_f32(tile + (i) * NR + 4, c##i##1);      \
    vst1q_f32(tile + (i) * NR + 8, c##i##2)

void mha_gemm_8x12__neon(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                         float *tile)
{
    const float *p0 = a;
    const float *p1 = p0 + (mr > 1 ? lda : 0), *p2 = p1 + (mr > 2 ? lda : 0);
    const float *p3 = p2 + (mr > 3 ? lda : 0), *p4 = p3 + (mr > 4 ? lda : 0);
    const float *p5 = p4 + (mr > 5 ? lda : 0), *p6 = p5 + (mr > 6 ? lda : 0);
    const float *p7 = p6 + (mr > 7 ? lda : 0);
    ZERO3(0); ZERO3(1); ZERO3(2); ZERO3(3); ZERO3(4); ZERO3(5); ZERO3(6); ZERO3(7);

    int32_t k = 0;
    for (; k + 4 <= kc; k += 4, w += 4 * NR) {
        QUAD(0, 1, 2, 3);
        __asm__("" : "+r"(w));
        QUAD(4, 5, 6, 7);
    }
    for (; k < kc; k++, w += NR) {
        const float32x4_t w0 = vld1q_f32(w), w1 = vld1q_f32(w + 4), w2 = vld1q_f32(w + 8);
        FMA_DUP(0); FMA_DUP(1); FMA_DUP(2); FMA_DUP(3);
        FMA_DUP(4); FMA_DUP(5); FMA_DUP(6); FMA_DUP(7);
    }

    STORE3(0); STORE3(1); STORE3(2); STORE3(3); STORE3(4); STORE3(5); STORE3(6); STORE3(7);
}
