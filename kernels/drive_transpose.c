/* Head transpose driver: one in-place transpose per batch element, each thread
 * with its own scratch allocated up front (so a failure writes nothing). */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

mha_status mha_transpose_run(const mha_kernels *kt, float *x, int32_t batch, int32_t rows,
                             int32_t cols, int32_t elem)
{
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    const size_t per = (kt->transpose_scratch_bytes(rows, cols, elem) + 63) / 64 * 64;
    char *scratch = aligned_alloc(64, per * (size_t)threads);
    if (!scratch)
        return MHA_ERR_NOMEM;

#pragma omp parallel for schedule(static)
    for (int32_t b = 0; b < batch; b++) {
#ifdef _OPENMP
        char *mine = scratch + per * (size_t)omp_get_thread_num();
#else
        char *mine = scratch;
#endif
        kt->transpose(x + (int64_t)b * rows * cols * elem, rows, cols, elem, mine);
    }
    free(scratch);
    return MHA_OK;
}
