/* The reference data kernels. The in-place transpose of a rows x cols matrix of
 * elem-float elements by cycle following: the element at position p = r*cols + c
 * moves to c*rows + r, so position p receives the element from (p % rows)*cols +
 * p / rows. A bitmap of rows*cols bits marks positions already filled; one
 * element is held aside. */
#include <string.h>

#include "internal.h"

size_t mha_transpose_scratch_bytes__scalar(int32_t rows, int32_t cols, int32_t elem)
{
    size_t n = (size_t)rows * (size_t)cols;
    size_t bitmap = (n + 63) / 64 * sizeof(uint64_t);
    return bitmap + (size_t)elem * sizeof(float);
}

void mha_transpose__scalar(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    const int64_t n = (int64_t)rows * cols;
    const size_t bytes = (size_t)elem * sizeof(float);
    uint64_t *done = scratch;
    float *held = (float *)(done + (n + 63) / 64);
    memset(done, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));

    for (int64_t start = 0; start < n; start++) {
        if (done[start / 64] >> (start % 64) & 1)
            continue;
        memcpy(held, x + start * elem, bytes);
        int64_t p = start;
        for (;;) {
            done[p / 64] |= UINT64_C(1) << (p % 64);
            int64_t src = (p % rows) * cols + p / rows;
            if (src == start)
                break;
            memcpy(x + p * elem, x + src * elem, bytes);
            p = src;
        }
        memcpy(x + p * elem, held, bytes);
    }
}

/* The reference conversions of kernels/dtype.h, one value at a time. */
void mha_convert__scalar(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = mha_load_value(from, src, i);
        if (to == MHA_F16)
            ((uint16_t *)dst)[i] = mha_f32_to_f16(x);
        else if (to == MHA_BF16)
            ((uint16_t *)dst)[i] = mha_f32_to_bf16(x);
        else
            ((float *)dst)[i] = x;
    }
}
