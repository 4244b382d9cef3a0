/* In-place transpose of a rows x cols matrix of elem-float elements, at most one
 * L2 tile (MHA_TRANSPOSE_TILE_BYTES): position p receives the element from
 * src(p) = (p % rows)*cols + p / rows. The matrix is copied to scratch and written
 * back in destination order: two streaming passes in cache. */
#include <immintrin.h>
#include <string.h>

#include "internal.h"

/* A copy of the matrix. */
size_t mha_transpose_scratch_bytes__avx2(int32_t rows, int32_t cols, int32_t elem)
{
    return (size_t)rows * (size_t)cols * (size_t)elem * sizeof(float);
}

/* Copies one element of elem floats: 8 at a time, then a masked tail. */
static inline void copy_elem(float *dst, const float *src, int32_t elem)
{
    int32_t i = 0;
    for (; i + 8 <= elem; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
    if (i < elem) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(elem - i), lane);
        _mm256_maskstore_ps(dst + i, mask, _mm256_maskload_ps(src + i, mask));
    }
}

void mha_transpose__avx2(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    const int64_t n = (int64_t)rows * cols;
    float *copy = scratch;
    memcpy(copy, x, (size_t)n * (size_t)elem * sizeof(float));
    for (int64_t c = 0, p = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++, p++)
            copy_elem(x + p * elem, copy + (r * cols + c) * elem, elem);
}
