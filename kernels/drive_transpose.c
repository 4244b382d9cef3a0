/* Head transpose driver: per batch, an in-place transpose of rows x cols elements
 * of elem floats, each thread with its own scratch allocated up front (so a
 * failure writes nothing).
 *
 * A large matrix is transposed in two passes so that memory is touched in long
 * runs and both cores work even for one batch. Split one dimension, say
 * rows = r1 * b: the matrix [r1][b][cols] becomes [cols][r1][b] by
 *   (1) the kernel transposing each tile [b][cols] -> [cols][b] in place (a tile
 *       fits in L2, so its cycle following stays in cache; tiles run in parallel);
 *   (2) transposing [r1][cols] of super-elements of b*elem contiguous floats by
 *       cycle following with memcpy (each move streams kilobytes). Each thread
 *       moves its own slice of every super-element, so the threads never touch
 *       the same bytes and need no synchronization.
 * Splitting cols = c1 * b instead runs the same passes in the other order:
 * [rows][c1][b] -> [c1][rows][b] (super-elements), then tiles [rows][b] -> [b][rows].
 * Any order of moves yields the same permutation, bit for bit. */
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

enum {
    TILE_BYTES = 1 << 18,      /* largest tile of pass (1), sized for L2 */
    SUPER_MIN_BYTES = 1 << 12, /* smallest super-element worth the extra pass */
    SLICE_ALIGN = 16,          /* slices of a super-element start on 64-byte lines */
};

/* Largest b dividing d (1 < b < d) with a tile of b * other elements in TILE_BYTES
 * and a super-element of b elements of at least SUPER_MIN_BYTES; 0 if none. */
static int32_t split_factor(int32_t d, int32_t other, int32_t elem)
{
    const int64_t elem_bytes = (int64_t)elem * (int64_t)sizeof(float);
    int64_t b = TILE_BYTES / (elem_bytes * other);
    if (b > d / 2)
        b = d / 2;
    for (; b > 1 && b * elem_bytes >= SUPER_MIN_BYTES; b--)
        if (d % b == 0)
            return (int32_t)b;
    return 0;
}

/* Pass (2): floats [lo, hi) of every element of an in-place r x c transpose whose
 * elements are sup floats apart; position p receives the element of
 * (p % r)*c + p / r. done has r*c bits, held hi - lo floats. */
static void transpose_slice(float *x, int64_t r, int64_t c, int64_t sup, int64_t lo, int64_t hi,
                            uint64_t *done, float *held)
{
    const int64_t n = r * c;
    const size_t bytes = (size_t)(hi - lo) * sizeof(float);
    memset(done, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));
    x += lo;
    for (int64_t start = 0; start < n; start++) {
        if (done[start / 64] >> (start % 64) & 1)
            continue;
        memcpy(held, x + start * sup, bytes);
        int64_t p = start;
        for (;;) {
            done[p / 64] |= UINT64_C(1) << (p % 64);
            const int64_t src = (p % r) * c + p / r;
            if (src == start)
                break;
            memcpy(x + p * sup, x + src * sup, bytes);
            p = src;
        }
        memcpy(x + p * sup, held, bytes);
    }
}

static size_t slice_scratch_bytes(int64_t r, int64_t c, int64_t sup)
{
    return (size_t)(r * c + 63) / 64 * sizeof(uint64_t) + (size_t)sup * sizeof(float);
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

#ifdef _OPENMP
#define THREAD_SCRATCH (scratch + per * (size_t)omp_get_thread_num())
#else
#define THREAD_SCRATCH scratch
#endif

/* Pass (2) over all batches: item i is slice i % slices of batch i / slices. */
static void slices_pass(float *x, int32_t batch, int64_t matrix, int64_t r, int64_t c,
                        int64_t sup, int slices, char *scratch, size_t per)
{
    (void)per;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < (int64_t)batch * slices; i++) {
        const int64_t s = i % slices;
        const int64_t lo = sup * s / slices / SLICE_ALIGN * SLICE_ALIGN;
        const int64_t hi = s + 1 == slices ? sup : sup * (s + 1) / slices / SLICE_ALIGN * SLICE_ALIGN;
        uint64_t *done = (uint64_t *)THREAD_SCRATCH;
        transpose_slice(x + i / slices * matrix, r, c, sup, lo, hi, done,
                        (float *)(done + (r * c + 63) / 64));
    }
}

mha_status mha_transpose_run(const mha_kernels *kt, float *x, int32_t batch, int32_t rows,
                             int32_t cols, int32_t elem)
{
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    const int64_t matrix = (int64_t)rows * cols * elem;
    const int big = matrix * (int64_t)sizeof(float) > TILE_BYTES;
    const int32_t br = big && rows >= cols ? split_factor(rows, cols, elem) : 0;
    const int32_t bc = big && !br ? split_factor(cols, rows, elem) : 0;
    /* Slices per super-element: enough to give every thread work when batch is small,
       each at least SUPER_MIN_BYTES / 4 (sup is at least SUPER_MIN_BYTES). */
    const int64_t sup = (int64_t)(br ? br : bc) * elem;
    int slices = batch >= threads ? 1 : (threads + batch - 1) / batch;
    if (slices > sup * (int64_t)sizeof(float) / (SUPER_MIN_BYTES / 4))
        slices = (int)(sup * (int64_t)sizeof(float) / (SUPER_MIN_BYTES / 4));

    size_t bytes;
    if (br)
        bytes = max_size(kt->transpose_scratch_bytes(br, cols, elem),
                         slice_scratch_bytes(rows / br, cols, sup));
    else if (bc)
        bytes = max_size(slice_scratch_bytes(rows, cols / bc, sup),
                         kt->transpose_scratch_bytes(rows, bc, elem));
    else
        bytes = kt->transpose_scratch_bytes(rows, cols, elem);
    const size_t per = (bytes + 63) / 64 * 64;
    char *scratch = aligned_alloc(64, per * (size_t)threads);
    if (!scratch)
        return MHA_ERR_NOMEM;

    if (br) {
        const int32_t r1 = rows / br;
        const int64_t tile = (int64_t)br * cols * elem;
#pragma omp parallel
        {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < (int64_t)batch * r1; t++)
                kt->transpose(x + t * tile, br, cols, elem, THREAD_SCRATCH);
            slices_pass(x, batch, matrix, r1, cols, sup, slices, scratch, per);
        }
    } else if (bc) {
        const int32_t c1 = cols / bc;
        const int64_t tile = (int64_t)rows * bc * elem;
#pragma omp parallel
        {
            slices_pass(x, batch, matrix, rows, c1, sup, slices, scratch, per);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < (int64_t)batch * c1; t++)
                kt->transpose(x + t * tile, rows, bc, elem, THREAD_SCRATCH);
        }
    } else {
#pragma omp parallel for schedule(static)
        for (int32_t b = 0; b < batch; b++)
            kt->transpose(x + b * matrix, rows, cols, elem, THREAD_SCRATCH);
    }
    free(scratch);
    return MHA_OK;
}
