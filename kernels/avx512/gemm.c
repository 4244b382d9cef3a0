/* AVX-512 GEMM microkernel: a 12x32 tile of C = A W^T held in 24 zmm accumulators
 * (12 rows x 2 vectors of 16 columns). Per k step: 2 loads of the packed W panel row
 * (32 floats), 12 broadcasts of A[i][k] (vbroadcastss, each feeding 2 FMAs), 24 FMAs,
 * 2 prefetches; besides, 15 scalar instructions of loop control per 2 steps (GCC 12
 * -O2/-O3: 13 pointer adds, cmp, jne), no spills. One broadcast register for 2 FMAs
 * beats 2 embedded-broadcast FMAs ({1to16}: 26 load uops per 24 FMAs instead of 14;
 * measured 5-10% slower).
 * Two 512-bit FMA pipes with a 4-cycle latency need >= 8 independent chains; 24 keep
 * both busy, and 24 + 2 W + up to 6 broadcast registers fit the 32 zmm. The shape:
 * 14x32 (28 chains) runs out of general registers for the 14 row pointers (GCC
 * reloads them from the stack in the loop) and was no faster; 8x48 loads fewer
 * bytes per FMA but its 48 columns split 64- and 128-wide heads, sending tiles to
 * the driver's scattered epilogue; 6x64 and 12x32 measured the same. 32 columns
 * divide every power-of-two head_dim >= 32. The sum over k runs in increasing k
 * for every element. */
#include <immintrin.h>

#include "internal.h"

/* The W panel (kc x 32 floats, 96 KiB for k = 768) streams past the A rows. Warm in
 * L2 the hardware prefetchers keep up (prefetching measured +-2%, noise); the first
 * row tile of a work item reads it from L3, where prefetching 2 KiB (16 k steps)
 * ahead measured +9% (kernel over 72 cold panels: 155 -> 170 GFLOP/s, 1 thread). */
enum { W_PREFETCH_FLOATS = 512 };

/* One row of a k step: broadcast A[i][kk] and accumulate it times W[kk][0..31]. The
 * empty asm keeps b live past both FMAs; otherwise GCC 12 writes the second FMA into
 * b's register, rotating the accumulators through registers and adding 5 vmovaps per
 * 2 k steps to the loop. */
#define GEMM_ROW(i, kk)                                                                 \
    do {                                                                                \
        const __m512 b = _mm512_set1_ps(a##i[kk]);                                      \
        c##i##0 = _mm512_fmadd_ps(b, w0, c##i##0);                                      \
        c##i##1 = _mm512_fmadd_ps(b, w1, c##i##1);                                      \
        __asm__("" ::"v"(b));                                                           \
    } while (0)

/* One k step over the 12 rows. */
#define GEMM_STEP(kk)                                                                   \
    do {                                                                                \
        const __m512 w0 = _mm512_loadu_ps(w + (size_t)(kk) * 32);                       \
        const __m512 w1 = _mm512_loadu_ps(w + (size_t)(kk) * 32 + 16);                  \
        GEMM_ROW(0, kk);                                                                \
        GEMM_ROW(1, kk);                                                                \
        GEMM_ROW(2, kk);                                                                \
        GEMM_ROW(3, kk);                                                                \
        GEMM_ROW(4, kk);                                                                \
        GEMM_ROW(5, kk);                                                                \
        GEMM_ROW(6, kk);                                                                \
        GEMM_ROW(7, kk);                                                                \
        GEMM_ROW(8, kk);                                                                \
        GEMM_ROW(9, kk);                                                                \
        GEMM_ROW(10, kk);                                                               \
        GEMM_ROW(11, kk);                                                               \
    } while (0)

void mha_gemm_12x32__avx512(int32_t mr, int32_t kc, const float *a, int64_t lda,
                            const float *w, float *tile)
{
    /* Rows past mr - 1 repeat row mr - 1 so that no read goes beyond it. */
    const float *a0 = a;
    const float *a1 = a + (mr > 1 ? 1 : mr - 1) * lda;
    const float *a2 = a + (mr > 2 ? 2 : mr - 1) * lda;
    const float *a3 = a + (mr > 3 ? 3 : mr - 1) * lda;
    const float *a4 = a + (mr > 4 ? 4 : mr - 1) * lda;
    const float *a5 = a + (mr > 5 ? 5 : mr - 1) * lda;
    const float *a6 = a + (mr > 6 ? 6 : mr - 1) * lda;
    const float *a7 = a + (mr > 7 ? 7 : mr - 1) * lda;
    const float *a8 = a + (mr > 8 ? 8 : mr - 1) * lda;
    const float *a9 = a + (mr > 9 ? 9 : mr - 1) * lda;
    const float *a10 = a + (mr > 10 ? 10 : mr - 1) * lda;
    const float *a11 = a + (mr > 11 ? 11 : mr - 1) * lda;

    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
    __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
    __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps();
    __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
    __m512 c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps();
    __m512 c70 = _mm512_setzero_ps(), c71 = _mm512_setzero_ps();
    __m512 c80 = _mm512_setzero_ps(), c81 = _mm512_setzero_ps();
    __m512 c90 = _mm512_setzero_ps(), c91 = _mm512_setzero_ps();
    __m512 c100 = _mm512_setzero_ps(), c101 = _mm512_setzero_ps();
    __m512 c110 = _mm512_setzero_ps(), c111 = _mm512_setzero_ps();

    /* Unrolled by 2; the pointers advance so that every address is pointer +
       constant (GCC turns them into one shared index). k stays in order. The 4
       prefetches cover the 256 bytes of W of the 2 steps; they may run past the
       panel's end: they never fault. */
    int32_t kk = kc;
    for (; kk >= 2; kk -= 2) {
        _mm_prefetch((const char *)(w + W_PREFETCH_FLOATS), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + W_PREFETCH_FLOATS + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + W_PREFETCH_FLOATS + 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + W_PREFETCH_FLOATS + 48), _MM_HINT_T0);
        GEMM_STEP(0);
        GEMM_STEP(1);
        a0 += 2, a1 += 2, a2 += 2, a3 += 2, a4 += 2, a5 += 2;
        a6 += 2, a7 += 2, a8 += 2, a9 += 2, a10 += 2, a11 += 2, w += 64;
    }
    if (kk > 0)
        GEMM_STEP(0);

    _mm512_storeu_ps(tile + 0, c00);
    _mm512_storeu_ps(tile + 16, c01);
    _mm512_storeu_ps(tile + 32, c10);
    _mm512_storeu_ps(tile + 48, c11);
    _mm512_storeu_ps(tile + 64, c20);
    _mm512_storeu_ps(tile + 80, c21);
    _mm512_storeu_ps(tile + 96, c30);
    _mm512_storeu_ps(tile + 112, c31);
    _mm512_storeu_ps(tile + 128, c40);
    _mm512_storeu_ps(tile + 144, c41);
    _mm512_storeu_ps(tile + 160, c50);
    _mm512_storeu_ps(tile + 176, c51);
    _mm512_storeu_ps(tile + 192, c60);
    _mm512_storeu_ps(tile + 208, c61);
    _mm512_storeu_ps(tile + 224, c70);
    _mm512_storeu_ps(tile + 240, c71);
    _mm512_storeu_ps(tile + 256, c80);
    _mm512_storeu_ps(tile + 272, c81);
    _mm512_storeu_ps(tile + 288, c90);
    _mm512_storeu_ps(tile + 304, c91);
    _mm512_storeu_ps(tile + 320, c100);
    _mm512_storeu_ps(tile + 336, c101);
    _mm512_storeu_ps(tile + 352, c110);
    _mm512_storeu_ps(tile + 368, c111);
}
