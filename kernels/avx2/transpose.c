/* In-place transpose of a rows x cols matrix of elem-float elements: position p
 * receives the element from src(p) = (p % rows)*cols + p / rows.
 *
 * A matrix that fits an L2 tile (the driver's pass over tiles) is copied to
 * scratch and written back in destination order: two streaming passes in cache.
 *
 * A larger one is cycle-followed, as the scalar reference. The positions a cycle
 * visits depend on the shape only, so a walker runs PF_AHEAD positions ahead of
 * the mover, marking the bitmap and prefetching each element it hands over
 * through a small ring; the mover finds every source in cache, and its
 * destination (the previous source) too. The walker crosses cycle boundaries, so
 * short cycles (length 9 for 16384 x 16) still overlap their memory accesses.
 * Still, elements scattered over the tensor reach only about half of memcpy's
 * bandwidth, which is why the driver splits large transposes into passes. */
#include <immintrin.h>
#include <string.h>

#include "internal.h"

enum {
    PF_AHEAD = 32,            /* positions in flight between walker and mover (power of 2) */
    PF_MAX_LINES = 16,        /* prefetch at most this many 64-byte lines of an element */
    COPY_MAX_BYTES = 1 << 18, /* a matrix this small (an L2 tile) goes through a copy */
};

/* A copy of the matrix up to COPY_MAX_BYTES; above, a bitmap of rows*cols bits
 * and one element. */
size_t mha_transpose_scratch_bytes__avx2(int32_t rows, int32_t cols, int32_t elem)
{
    size_t n = (size_t)rows * (size_t)cols;
    if (n * (size_t)elem * sizeof(float) <= COPY_MAX_BYTES)
        return n * (size_t)elem * sizeof(float);
    size_t bitmap = (n + 63) / 64 * sizeof(uint64_t);
    return bitmap + (size_t)elem * sizeof(float);
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

static inline void prefetch_elem(const float *x, int64_t p, size_t bytes)
{
    const char *e = (const char *)(x + p * (int64_t)(bytes / sizeof(float)));
    const char *end = e + (bytes < PF_MAX_LINES * 64 ? bytes : PF_MAX_LINES * 64);
    for (const char *l = (const char *)((uintptr_t)e & ~(uintptr_t)63); l < end; l += 64)
        _mm_prefetch(l, _MM_HINT_T0);
}

/* The walker: the next position the mover will visit, or -1 when all are done. A
 * position starting a new cycle is returned as -(p + 2) so the mover can tell. */
typedef struct walker {
    uint64_t *done;
    int64_t n, rows, cols;
    int64_t start; /* first position of the current cycle, -1 between cycles */
    int64_t p;     /* last position handed out */
    int64_t scan;  /* bitmap positions below scan are all marked */
} walker;

static int64_t walk_next(walker *w)
{
    if (w->start >= 0) {
        const int64_t s = (w->p % w->rows) * w->cols + w->p / w->rows;
        if (s != w->start) {
            w->done[s / 64] |= UINT64_C(1) << (s % 64);
            return w->p = s;
        }
        w->start = -1;
    }
    while (w->scan < w->n) {
        const uint64_t free_bits = ~w->done[w->scan / 64] & (~UINT64_C(0) << (w->scan % 64));
        if (!free_bits) {
            w->scan = (w->scan / 64 + 1) * 64;
            continue;
        }
        const int64_t s = w->scan / 64 * 64 + __builtin_ctzll(free_bits);
        if (s >= w->n)
            break;
        w->done[s / 64] |= UINT64_C(1) << (s % 64);
        w->scan = s + 1;
        if ((s % w->rows) * w->cols + s / w->rows == s)
            continue; /* a fixed point moves nothing */
        w->start = w->p = s;
        return -(s + 2);
    }
    return -1;
}

void mha_transpose__avx2(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch)
{
    const int64_t n = (int64_t)rows * cols;
    const size_t bytes = (size_t)elem * sizeof(float);
    if ((size_t)n * bytes <= COPY_MAX_BYTES) {
        float *copy = scratch;
        memcpy(copy, x, (size_t)n * bytes);
        for (int64_t c = 0, p = 0; c < cols; c++)
            for (int64_t r = 0; r < rows; r++, p++)
                copy_elem(x + p * elem, copy + (r * cols + c) * elem, elem);
        return;
    }
    walker w = {.done = scratch, .n = n, .rows = rows, .cols = cols, .start = -1, .scan = 0};
    float *held = (float *)(w.done + (n + 63) / 64);
    memset(w.done, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));

    /* Fill the ring, prefetching every position as the walker hands it out. */
    int64_t ring[PF_AHEAD];
    int32_t head = 0, count = 0;
    for (; count < PF_AHEAD; count++) {
        const int64_t q = walk_next(&w);
        if (q == -1)
            break;
        ring[count] = q;
        prefetch_elem(x, q < 0 ? -q - 2 : q, bytes);
    }

    /* The mover: a cycle start is held aside; each later position's element moves
     * to the previous position; the held element closes the cycle. */
    int64_t last = -1;
    while (count > 0) {
        const int64_t q = ring[head];
        const int64_t next = walk_next(&w);
        if (next == -1) {
            count--;
        } else {
            ring[head] = next;
            prefetch_elem(x, next < 0 ? -next - 2 : next, bytes);
        }
        head = (head + 1) % PF_AHEAD;

        if (q < 0) {
            if (last >= 0)
                copy_elem(x + last * elem, held, elem);
            last = -q - 2;
            copy_elem(held, x + last * elem, elem);
        } else {
            copy_elem(x + last * elem, x + q * elem, elem);
            last = q;
        }
    }
    if (last >= 0)
        copy_elem(x + last * elem, held, elem);
}
