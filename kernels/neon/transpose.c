/* NEON in-place transpose of a rows x cols matrix of elem-float elements, per
 * the transpose contract in internal.h. Cycle following as in the scalar
 * reference: the element at p = r*cols + c moves to c*rows + r, so position p
 * receives the one from (p % rows)*cols + p / rows. A bitmap of rows*cols bits
 * marks positions already filled and one element is held aside in scratch.
 * Elements are head_dim floats (usually 64 or more, whole cache lines), so
 * each move is a vector copy of 16, then 4, then 1 float at a time. */
#include <arm_neon.h>
#include <string.h>

#include "internal.h"

static inline void copy_elem(float *dst, const float *src, int32_t elem)
{
    int32_t i = 0;
    for (; i + 16 <= elem; i += 16) {
        const float32x4x4_t x = vld1q_f32_x4(src + i);
        vst1q_f32_x4(dst + i, x);
    }
    for (; i + 4 <= elem; i += 4)
        vst1q_f32(dst + i, vld1q_f32(src + i));
    for (; i < elem; i++)
        dst[i] = src[i];
}

size_t mha_transpose_scratch_bytes__neon(int32_t rows, int32_t cols, int32_t elem)
{
    const size_t n = (size_t)rows * (size_t)cols;
    return (n + 63) / 64 * sizeof(uint64_t) + (size_t)elem * sizeof(float);
}

void mha_transpose__neon(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    const int64_t n = (int64_t)rows * cols;
    uint64_t *done = scratch;
    float *held = (float *)(done + (n + 63) / 64);
    memset(done, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));

    for (int64_t start = 0; start < n; start++) {
        if (done[start / 64] >> (start % 64) & 1)
            continue;
        done[start / 64] |= UINT64_C(1) << (start % 64);
        int64_t src = (start % rows) * cols + start / rows;
        if (src == start)
            continue; /* a fixed point: nothing moves */
        copy_elem(held, x + start * elem, elem);
        int64_t p = start;
        do {
            copy_elem(x + p * elem, x + src * elem, elem);
            p = src;
            done[p / 64] |= UINT64_C(1) << (p % 64);
            src = (p % rows) * cols + p / rows;
        } while (src != start);
        copy_elem(x + p * elem, held, elem);
    }
}
