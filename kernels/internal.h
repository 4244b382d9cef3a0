/* The kernel table: every kernel's contract in one place.
 *
 * Drivers (api.c, drive_*.c) own the loops over batch, heads and blocks, run in
 * parallel through mha_parallel_for (parallel.c); kernels own the tiles. Each ISA fills one mha_kernels table
 * (kernels/<isa>/table.c) and dispatch.c picks one at first use.
 */
#ifndef MHA_INTERNAL_H
#define MHA_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "isa_list.h"
#include "mha.h"

/* Limits of the drivers' stack arrays that every table must respect; each
 * table.c checks its sizes with MHA_TABLE_LIMITS at compile time. */
#define MHA_GEMM_TILE_MAX 512  /* gemm_mr * gemm_nr */
#define MHA_ATTN_ROWS_MAX 256  /* attn_block_rows */
#define MHA_TABLE_LIMITS(mr, nr, attn_rows)                                          \
    _Static_assert((mr) * (nr) <= MHA_GEMM_TILE_MAX, "GEMM tile above the driver's"); \
    _Static_assert((attn_rows) <= MHA_ATTN_ROWS_MAX, "attention block above the driver's")

/* Packed weights for a GEMM with nn.Linear's W [n][k]: panels of nr output
 * columns, panel p holding W[p*nr + j][kk] at w[(p*k + kk)*nr + j], columns
 * past n zero-filled. With nr = 1 this is W itself. */
static inline size_t mha_packed_floats(int32_t n, int32_t k, int32_t nr)
{
    return (size_t)((n + nr - 1) / nr) * (size_t)nr * (size_t)k;
}

/* One attention block: `rows` query rows of one (b, h) against all keys of its
 * kv head. Row r reads q + r*q_stride (head_dim floats), sees keys j < kv_end[r]
 * (0 <= kv_end[r] <= seq_kv) with the additive bias (bias + r*bias_stride)[j]
 * when bias is not NULL, and writes
 *     out[r] = sum_j p_j v_j,  p = softmax_j(scale * q[r].k[j] + bias[r][j])
 * at out + r*out_stride. Key j is hidden from row r when j >= kv_end[r] or its
 * score is -inf (a -INFINITY bias, whatever q.k is): nothing of a hidden key
 * (k, v, bias) may reach the row; a NaN or Inf of a visible one flows through
 * IEEE arithmetic. A row with no visible key gets zeros. k and v are
 * [seq_kv][head_dim], contiguous.
 * Each row's result must not depend on the other rows of the block, so that
 * blocking (and thus the thread count) never changes a bit of the output.
 * scratch: attn_scratch_bytes() of the table (NULL: none), 64-byte aligned,
 * the calling thread's alone: kernels keep their tiles there, not on the stack. */
typedef struct mha_attn_block {
    int32_t rows, seq_kv, head_dim;
    const float *q;
    int64_t q_stride;
    const float *k, *v;
    const int32_t *kv_end;
    const float *bias;
    int64_t bias_stride;
    float scale;
    float *out;
    int64_t out_stride;
    void *scratch;
} mha_attn_block;

/* The largest matrix the driver hands to a transpose kernel: an L2 tile. */
#define MHA_TRANSPOSE_TILE_BYTES (1 << 18)

typedef struct mha_kernels {
    mha_isa isa;

    /* GEMM microkernel: tile[i][j] = sum_{kk < kc} a[i*lda + kk] * w[kk*gemm_nr + j]
     * for i < gemm_mr, j < gemm_nr, written to tile (gemm_mr x gemm_nr, row-major,
     * overwritten). Rows i >= mr (1 <= mr <= gemm_mr) must not read a past row
     * mr-1: they may repeat row mr-1 or hold anything. kc >= 1; w is a packed
     * panel (see mha_packed_floats) advanced to the block's first k. */
    int32_t gemm_mr, gemm_nr;
    /* Blocking of the GEMM driver, per ISA as BLIS keeps it: a work item is about
     * gemm_mc rows of A (rounded to gemm_mr) times gemm_w_bytes of packed W; k is
     * cut into equal blocks of at most gemm_kc_max. */
    int32_t gemm_mc, gemm_kc_max, gemm_w_bytes;
    void (*gemm_tile)(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                      float *tile);

    /* Attention: the driver hands blocks of at most attn_block_rows rows. */
    int32_t attn_block_rows;
    size_t (*attn_scratch_bytes)(void);
    void (*attn_block)(const mha_attn_block *blk);

    /* In-place transpose of a rows x cols matrix whose elements are `elem`
     * contiguous floats, of at most MHA_TRANSPOSE_TILE_BYTES (one batch of a small
     * head split or merge, or a tile of a large one). scratch holds
     * transpose_scratch_bytes(rows, cols, elem) bytes, 64-byte aligned, owned
     * by the calling thread. */
    size_t (*transpose_scratch_bytes)(int32_t rows, int32_t cols, int32_t elem);
    void (*transpose)(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);

    /* The vector exp of the attention: y[i] = exp(x[i]) for x[i] <= 0 (the softmax
     * range), n >= 0, within exp_ulp ulp of expf over [-87.3, 0] (the bound is
     * derived in the kernel's source, checked by tests/test_exp.c); -INFINITY
     * gives 0. NULL for the scalar reference, which calls expf. */
    void (*exp_array)(const float *x, float *y, int64_t n);
    int32_t exp_ulp;
} mha_kernels;

/* The kernels of each ISA, named <what>__<isa>; their tables are in <isa>/table.c. */
void mha_gemm_1x1__scalar(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                          float *tile);
void mha_attn_block__scalar(const mha_attn_block *blk);
size_t mha_transpose_scratch_bytes__scalar(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__scalar(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);

void mha_gemm_6x16__avx2(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                         float *tile);
void mha_attn_block__avx2(const mha_attn_block *blk);
size_t mha_attn_scratch_bytes__avx2(void);
size_t mha_transpose_scratch_bytes__avx2(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__avx2(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_exp_array__avx2(const float *x, float *y, int64_t n);

void mha_gemm_12x32__avx512(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                            float *tile);
void mha_attn_block__avx512(const mha_attn_block *blk);
size_t mha_attn_scratch_bytes__avx512(void);
size_t mha_transpose_scratch_bytes__avx512(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__avx512(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_exp_array__avx512(const float *x, float *y, int64_t n);

void mha_gemm_8x12__neon(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                         float *tile);
void mha_attn_block__neon(const mha_attn_block *blk);
void mha_exp_array__neon(const float *x, float *y, int64_t n);

#define MHA_DECLARE_TABLE_(name, value) extern const mha_kernels mha_kernels_##name;
MHA_ISA_LIST(MHA_DECLARE_TABLE_)

/* parallel.c: fn(arg, i) for every i in [0, n), on OpenMP's threads or the
 * caller's pool (mha_set_parallel_for); returns when all have run. */
void mha_parallel_for(int64_t n, void (*fn)(void *arg, int64_t i), void *arg);
/* parallel.c: items that may run at once: OpenMP's thread count, or for a
 * caller's pool the online CPUs (a pool with more threads waits for scratch). */
int64_t mha_parallel_width(void);

/* parallel.c: per-item scratch of a parallel loop, allocated before the loop (so
 * that a failure writes nothing): slots of `bytes` (64-byte aligned), one per
 * item that may run at once; take waits while all are taken. */
typedef struct mha_scratch {
    char *base;
    size_t per;
    int32_t slots;
    _Atomic uint64_t busy;
} mha_scratch;
mha_status mha_scratch_init(mha_scratch *s, size_t bytes, int64_t items);
void *mha_scratch_take(mha_scratch *s);
void mha_scratch_give(mha_scratch *s, void *slot);
void mha_scratch_free(mha_scratch *s);

/* cpu.c: does this CPU (and OS) support the ISA? Scalar is always supported. */
int mha_cpu_supports(mha_isa isa);
/* dispatch.c: the table of an ISA built in and supported here, else NULL. */
const mha_kernels *mha_kernels_for(mha_isa isa);
/* dispatch.c: the table calls use now (chosen once, thread-safely). */
const mha_kernels *mha_kernels_active(void);

/* Destination of a GEMM segment: element (m, c) of the m x n result goes to
 *   dst + (m / rows)*batch_stride + (m % rows)*row_stride
 *       + (c / cols)*block_stride + (c % cols)
 * which covers both a plain row-major matrix (rows = cols = large, strides 0)
 * and head-major [B][H][S][dh] (rows = S, cols = dh). */
typedef struct mha_gemm_seg {
    const float *w;    /* packed for the table's gemm_nr */
    const float *bias; /* [n] or NULL */
    int32_t n;
    float *dst;
    int32_t rows, cols;
    int64_t batch_stride, row_stride, block_stride;
} mha_gemm_seg;

/* drive_gemm.c: C = A W^T + bias for every segment, A being m x k with row stride
 * lda; one parallel loop over the tiles of all segments. */
void mha_gemm_run(const mha_kernels *kt, int64_t m, int32_t k, const float *a, int64_t lda,
                  const mha_gemm_seg *segs, int nsegs);

/* drive_attention.c: the attention over all (b, h) with checked arguments;
 * MHA_ERR_NOMEM (out untouched) when the kernels' scratch cannot be had. */
mha_status mha_attention_run(const mha_kernels *kt, const mha_attn_dims *d, const float *q,
                             const float *k, const float *v, float scale,
                             const mha_mask *mask, float *out, mha_layout layout);

/* drive_transpose.c: per-batch in-place transpose of rows x cols elements of elem floats;
 * MHA_ERR_NOMEM (x untouched) when the scratch cannot be allocated. */
mha_status mha_transpose_run(const mha_kernels *kt, float *x, int32_t batch, int32_t rows,
                             int32_t cols, int32_t elem);

/* pack.c: W [n][k] given in panels of nr_src columns (1: W itself) packed into
 * panels of nr_dst (see mha_packed_floats). */
void mha_pack_weights(const float *src, int32_t n, int32_t k, int32_t nr_src, float *dst,
                      int32_t nr_dst);

#endif
