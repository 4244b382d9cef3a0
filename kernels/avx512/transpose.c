/* The in-place transpose of one L2 tile (simd/transpose.h) on the avx512 layer. */
#include "avx512/simd.h"
#include "simd/transpose.h"

size_t mha_transpose_scratch_bytes__avx512(int32_t rows, int32_t cols, int32_t elem)
{
    return simd_transpose_scratch_bytes(rows, cols, elem);
}

void mha_transpose__avx512(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    simd_transpose(x, rows, cols, elem, scratch);
}
