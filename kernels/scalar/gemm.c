/* Scalar reference GEMM tile: one output element, a plain dot product. */
#include "internal.h"

void mha_gemm_1x1__scalar(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                          float *tile)
{
    (void)mr;
    (void)lda;
    float sum = 0.0f;
    for (int32_t kk = 0; kk < kc; kk++)
        sum += a[kk] * w[kk];
    tile[0] = sum;
}
