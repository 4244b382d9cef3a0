/* The shared data kernels on the avx2 layer: the in-place transpose of one L2
 * tile (simd/transpose.h) and the element-type conversions (simd/convert.h). */
#include "avx2/simd.h"
#include "simd/convert.h"
#include "simd/transpose.h"

size_t mha_transpose_scratch_bytes__avx2(int32_t rows, int32_t cols, int32_t elem)
{
    return simd_transpose_scratch_bytes(rows, cols, elem);
}

void mha_transpose__avx2(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    simd_transpose(x, rows, cols, elem, scratch);
}

void mha_convert__avx2(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n)
{
    simd_convert(to, dst, from, src, n);
}
