/* The in-place transpose of one L2 tile (simd/transpose.h) on the neon layer. */
#include "neon/simd.h"
#include "simd/transpose.h"

size_t mha_transpose_scratch_bytes__neon(int32_t rows, int32_t cols, int32_t elem)
{
    return simd_transpose_scratch_bytes(rows, cols, elem);
}

void mha_transpose__neon(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    simd_transpose(x, rows, cols, elem, scratch);
}
