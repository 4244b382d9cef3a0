/* Packing of GEMM weights into panels (see mha_packed_floats), from nn.Linear's
 * W [n][k] (panels of 1) or from another width: a layer keeps one packed copy and
 * derives the copy for another ISA's gemm_nr from it, since the caller's
 * unpacked weights are gone by then. */
#include "internal.h"

void mha_pack_weights(const float *src, int32_t n, int32_t k, int32_t nr_src, float *dst,
                        int32_t nr_dst)
{
    const int32_t panels = (n + nr_dst - 1) / nr_dst;
    const size_t src_panel = (size_t)k * (size_t)nr_src;
    for (int32_t p = 0; p < panels; p++) {
        float *out = dst + (size_t)p * (size_t)k * (size_t)nr_dst;
        /* Column c of W: panel c / nr_src, lane c % nr_src of the source. */
        for (int32_t j = 0; j < nr_dst; j++) {
            const int32_t c = p * nr_dst + j;
            if (c >= n) {
                for (int32_t kk = 0; kk < k; kk++)
                    out[(size_t)kk * nr_dst + j] = 0.0f;
                continue;
            }
            const float *col = src + (size_t)(c / nr_src) * src_panel + (size_t)(c % nr_src);
            for (int32_t kk = 0; kk < k; kk++)
                out[(size_t)kk * nr_dst + j] = col[(size_t)kk * nr_src];
        }
    }
}
