/* The in-place transpose of one L2 tile, written once over the SIMD layer (an
 * ISA's transpose.c includes its simd.h, then this, and wraps the two
 * functions under its names). A rows x cols matrix of elem-float elements, at
 * most MHA_TRANSPOSE_TILE_BYTES: position p receives the element from
 * src(p) = (p % rows)*cols + p / rows. The matrix is copied to scratch and
 * written back in destination order: two streaming passes in cache. */
#ifndef MHA_SIMD_TRANSPOSE_H
#define MHA_SIMD_TRANSPOSE_H

#include <string.h>

#include "internal.h"

/* A copy of the matrix. */
static size_t simd_transpose_scratch_bytes(int32_t rows, int32_t cols, int32_t elem)
{
    return (size_t)rows * (size_t)cols * (size_t)elem * sizeof(float);
}

/* Copies one element of elem floats: whole vectors, then a masked tail. */
static inline void copy_elem(float *dst, const float *src, int32_t elem)
{
    int32_t i = 0;
    for (; i + VF_LANES <= elem; i += VF_LANES)
        vf_storeu(dst + i, vf_loadu(src + i));
    if (i < elem)
        vf_storeu_n(dst + i, elem - i, vf_loadu_n(src + i, elem - i));
}

static void simd_transpose(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    const int64_t n = (int64_t)rows * cols;
    float *copy = scratch;
    memcpy(copy, x, (size_t)n * (size_t)elem * sizeof(float));
    for (int64_t c = 0, p = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++, p++)
            copy_elem(x + p * elem, copy + (r * cols + c) * elem, elem);
}

#endif
