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

#include "dtype.h"
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

/* The K or V rows of a block, key j < seq_kv at the byte address mha_row(r, j):
 *   base + j*stride                                         without a table;
 *   base + table[row / block_size]*block_stride + (row % block_size)*stride,
 *     row = first + j,                                     with a block table
 * (a paged cache: base is the pool, with the kv head's offset). */
typedef struct mha_rows {
    const char *base;
    int64_t stride, block_stride;
    const int32_t *table;
    int32_t block_size, first;
} mha_rows;

static inline const char *mha_row(const mha_rows *r, int32_t j)
{
    if (!r->table)
        return r->base + (int64_t)j * r->stride;
    const int32_t row = r->first + j;
    return r->base + (int64_t)r->table[row / r->block_size] * r->block_stride
           + (int64_t)(row % r->block_size) * r->stride;
}

/* One attention block: `rows` query rows against the keys of one kv head. The
 * rows come in groups of group_rows (one group per query head sharing the kv
 * head, GQA); row r is row r % group_rows of group r / group_rows, and every
 * per-row pointer below adds mha_row_offset(blk, r, stride, group_stride).
 *
 * Row r reads its query at q (+ q_stride, q_group_stride; dk floats) and sees
 * the keys kv_begin[r] <= j < kv_end[r] (kv_begin NULL: 0; 0 <= kv_begin[r],
 * kv_end[r] <= seq_kv), key j's row at mha_row(&k, j) (dk values of kv_type) and
 * its value at mha_row(&v, j) (dv values of kv_type; a q8_0 row holds whole
 * blocks, dk and dv multiples of 32), read exactly as mha.h converts them. Its
 * scores, in this order:
 *     s = scale * q.k_j
 *     s = softcap * tanh(s / softcap)              when softcap > 0
 *     s = s + bias[j]                              bias row at bias (+ bias_stride,
 *                                                  bias_group_stride), when not NULL
 *     s = s + alibi_slope[r] * (float)(j - alibi_pos[r])   when alibi_slope is not NULL
 * and it writes, at out (+ out_stride, out_group_stride; dv floats),
 *     out = sum_j p_j v_j / (sum_j p_j + exp(sink[r] - m)),  p_j = exp(s_j - m)
 * over its visible keys, m their largest score, the sink term only when sink is
 * not NULL. A key whose score is -inf (a -INFINITY bias, whatever q.k is) is
 * hidden too: nothing of a hidden key (k, v, bias) may reach the row; a NaN or
 * Inf of a visible one flows through IEEE arithmetic. A row with no visible key
 * gets zeros. lse, when not NULL, gets lse[r] = m + log(sum_j p_j) (the sink
 * not included), -INFINITY for a row with no visible key.
 * A row's result may depend on the block's shape (rows, group_rows, seq_kv,
 * dk, dv: the driver cuts blocks from the call's shapes alone), never on the
 * other rows' data, so that the thread count never changes a bit of the output.
 * scratch: attn_scratch_bytes() of the table (NULL: none), 64-byte aligned,
 * the calling thread's alone: kernels keep their tiles and per-row state there;
 * the stack holds only registers' worth of vectors. kv_far: where the call's K
 * and V fit, a hint for prefetching them: KV_IN_L2 (a core's L2), KV_PAST_L2 (past
 * it, within 3/4 of the L3 that CPU 0 shares) or KV_PAST_L3. */
enum { KV_IN_L2, KV_PAST_L2, KV_PAST_L3 };
typedef struct mha_attn_block {
    int32_t rows, group_rows, seq_kv, dk, dv;
    const float *q;
    int64_t q_stride, q_group_stride;
    int q_bf16; /* every q value is a bfloat16 (the call's q was MHA_BF16) */
    int q_staged; /* q rows are the driver's converted copy, still in cache */
    mha_rows k, v;
    mha_dtype kv_type;
    int kv_far;
    const int32_t *kv_begin, *kv_end;
    const float *bias;
    int64_t bias_stride, bias_group_stride;
    float scale, softcap;
    const float *alibi_slope;
    const int32_t *alibi_pos;
    const float *sink;
    float *out;
    int64_t out_stride, out_group_stride;
    float *lse;
    void *scratch;
} mha_attn_block;

/* Offset of row r of a block along a tensor with the given row and group strides. */
static inline int64_t mha_row_offset(const mha_attn_block *blk, int32_t r, int64_t stride,
                                     int64_t group_stride)
{
    return (int64_t)(r / blk->group_rows) * group_stride + (int64_t)(r % blk->group_rows) * stride;
}

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

    /* Attention: the driver hands blocks of at most attn_block_rows rows; a call of
     * fewer than attn_serial_flops FLOP runs its items on the calling thread (about
     * 2 us of one core of the slowest CPU the ISA runs on, where waking the workers
     * costs more than they save; 0: never). */
    int32_t attn_block_rows;
    int32_t attn_serial_flops;
    size_t (*attn_scratch_bytes)(void);
    void (*attn_block)(const mha_attn_block *blk);

    /* In-place transpose of a rows x cols matrix whose elements are `elem`
     * contiguous floats, of at most MHA_TRANSPOSE_TILE_BYTES (one batch of a small
     * head split or merge, or a tile of a large one). scratch holds
     * transpose_scratch_bytes(rows, cols, elem) bytes, 64-byte aligned, owned
     * by the calling thread. */
    size_t (*transpose_scratch_bytes)(int32_t rows, int32_t cols, int32_t elem);
    void (*transpose)(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);

    /* dst[0..n) of type `to` = src[0..n) of type `from`, the bits of kernels/dtype.h's
     * scalar conversions: to is f32, f16 or bf16; from any type (q8_0: n a multiple
     * of 32). Reads and writes nothing past the n values. */
    void (*convert)(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n);
} mha_kernels;

/* The kernels of each ISA, named <what>__<isa>; their tables are in <isa>/table.c. */
void mha_gemm_1x1__scalar(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                          float *tile);
void mha_attn_block__scalar(const mha_attn_block *blk);
size_t mha_transpose_scratch_bytes__scalar(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__scalar(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_convert__scalar(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n);

void mha_gemm_6x16__avx2(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                         float *tile);
void mha_attn_block__avx2(const mha_attn_block *blk);
size_t mha_attn_scratch_bytes__avx2(void);
size_t mha_transpose_scratch_bytes__avx2(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__avx2(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_convert__avx2(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n);

void mha_gemm_12x32__avx512(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                            float *tile);
void mha_attn_block__avx512(const mha_attn_block *blk);
size_t mha_attn_scratch_bytes__avx512(void);
size_t mha_transpose_scratch_bytes__avx512(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__avx512(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_convert__avx512(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n);

void mha_gemm_8x12__neon(int32_t mr, int32_t kc, const float *a, int64_t lda, const float *w,
                         float *tile);
void mha_attn_block__neon(const mha_attn_block *blk);
size_t mha_attn_scratch_bytes__neon(void);
size_t mha_transpose_scratch_bytes__neon(int32_t rows, int32_t cols, int32_t elem);
void mha_transpose__neon(float *x, int32_t rows, int32_t cols, int32_t elem, void *scratch);
void mha_convert__neon(mha_dtype to, void *dst, mha_dtype from, const void *src, int64_t n);

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
 * item that may run at once, up to MHA_SCRATCH_SLOTS_MAX; take waits while all
 * are taken. */
enum { MHA_SCRATCH_SLOTS_MAX = 1024 };
typedef struct mha_scratch {
    char *base;
    size_t per;
    int32_t slots;
    int owned; /* base was allocated by init */
    _Atomic uint64_t busy[MHA_SCRATCH_SLOTS_MAX / 64]; /* a bit per slot in use */
} mha_scratch;
mha_status mha_scratch_init(mha_scratch *s, size_t bytes, int64_t items);
/* The same in the caller's memory (64-byte aligned, at least one slot of bytes):
 * as many slots as fit, up to what init would allocate. */
void mha_scratch_place(mha_scratch *s, size_t bytes, int64_t items, void *mem, size_t mem_bytes);
void *mha_scratch_take(mha_scratch *s);
void mha_scratch_give(mha_scratch *s, void *slot);
void mha_scratch_free(mha_scratch *s);

/* cpu.c: does this CPU (and OS) support the ISA? Scalar is always supported.
 * The features are detected at the first call only. */
int mha_cpu_supports(mha_isa isa);
/* cpu.c: nonzero when the CPU has AVX512-BF16 (read with the ISAs, once). */
int mha_cpu_avx512_bf16(void);
/* cpu.c: nonzero when the CPU has AMX-BF16 and the process may use its tiles (once). */
int mha_cpu_amx_bf16(void);
/* cpu.c: bytes of the L3 that CPU 0 shares (read at the first call only). */
int64_t mha_cpu_l3_bytes(void);
/* dispatch.c: the table of an ISA built in and supported here, else NULL. */
const mha_kernels *mha_kernels_for(mha_isa isa);
/* dispatch.c: the table calls use now (chosen once, thread-safely). */
const mha_kernels *mha_kernels_active(void);

/* Destination of a GEMM segment: element (m, c) of the m x n result goes to
 *   dst + (m / rows)*batch_stride + (m % rows)*row_stride
 *       + (c / cols)*block_stride + (c % cols)
 * (elements of dst_type: f32, or f16 / bf16 rounded once from the whole sum, which
 * needs k <= gemm_kc_max), which covers both a plain row-major matrix (rows = cols
 * = large, strides 0) and head-major [B][H][S][dh] (rows = S, cols = dh). */
typedef struct mha_gemm_seg {
    const float *w;    /* packed for the table's gemm_nr */
    const float *bias; /* [n] or NULL */
    int32_t n;
    void *dst;
    mha_dtype dst_type;
    int32_t rows, cols;
    int64_t batch_stride, row_stride, block_stride;
} mha_gemm_seg;

/* drive_gemm.c: C = A W^T + bias for every segment, A being m x k with row stride
 * lda; one parallel loop over the tiles of all segments (1 <= nsegs <=
 * MHA_GEMM_SEGS_MAX: Q, K and V). */
#define MHA_GEMM_SEGS_MAX 3
void mha_gemm_run(const mha_kernels *kt, int64_t m, int32_t k, const float *a, int64_t lda,
                  const mha_gemm_seg *segs, int nsegs);

/* drive_attention.c: an attention call, checked. Sequence b has lens[b] keys (lens
 * NULL: seq_kv each), row i sitting at position keys - seq_q + i unless
 * mask->q_offsets says otherwise; seq_kv bounds every key index (the bias extent).
 * q [B][heads][seq_q][dk] and out [B][heads][seq_q][dv] are io_type elements at
 * their strides (elements); lse NULL or [B][heads][seq_q]. The K row of key j of
 * sequence b and kv head g is at byte k + b*k_stride_b + g*k_stride_h +
 * j*k_stride_s (dk values of kv_type), V alike (dv values); with a block_table
 * ([batch][max_blocks]), key j is row j % block_size of pool block
 * block_table[b*max_blocks + j / block_size], k_stride_b being the pool's block
 * stride. */
typedef struct mha_attn_args {
    int32_t batch, heads, kv_heads, seq_q, seq_kv, dk, dv;
    const int32_t *lens;
    mha_dtype io_type, kv_type;
    const void *q;
    mha_strides q_st;
    void *out;
    mha_strides out_st;
    const void *k, *v;
    int64_t k_stride_b, k_stride_h, k_stride_s, v_stride_b, v_stride_h, v_stride_s; /* bytes */
    const int32_t *block_table;
    int32_t block_size, max_blocks;
    float scale;
    const mha_mask *mask;
    float *lse;
} mha_attn_args;

/* How a call is cut: blocks of head_run heads x row_run rows, each against
 * `chunks` chunks of chunk_len keys, with the memory that needs. */
typedef struct mha_attn_plan {
    const mha_kernels *kt;
    mha_attn_args a;
    int32_t head_run, row_run, qblocks, hgroups, chunks, chunk_len;
    int64_t blocks;
    int kv_far;                 /* where K and V of the call fit: KV_IN_L2, KV_PAST_L2 or KV_PAST_L3 */
    int serial;                 /* so little work that the calling thread runs every item */
    mha_scratch scratch;
    float *part_out, *part_lse; /* per chunk, when chunks > 1 */
    _Atomic int32_t *merged;    /* per block, its chunks done (the last one merges) */
    void *owned;                /* what prepare allocated for them */
} mha_attn_plan;

/* Cuts the call and takes all the memory it needs, so that a caller can check
 * before writing anything: from arena when it is not NULL (arena_bytes, 64-byte
 * aligned, at least mha_attention_arena_bytes of the call's sizes), else from the
 * heap (MHA_ERR_NOMEM, nothing allocated, when that fails). exec runs the plan
 * and releases it, release only releases it. */
mha_status mha_attention_prepare(const mha_kernels *kt, const mha_attn_args *a, void *arena,
                                 size_t arena_bytes, mha_attn_plan *p);
/* An arena size that serves every available ISA and any lens for a call of these
 * sizes on f32 q and out (the layer calls'): partial results of split keys plus
 * one scratch slot per item that may run at once (mha_parallel_width, at the time
 * of asking). The layer calls compute
 * their workspace size again at each call, so a workspace sized before the thread
 * count rose is refused (MHA_ERR_ARG), never shared by more threads than slots. */
size_t mha_attention_arena_bytes(int32_t batch, int32_t heads, int32_t kv_heads, int32_t seq_q,
                                 int32_t dv);
void mha_attention_exec(mha_attn_plan *p);
void mha_attention_release(mha_attn_plan *p);
/* prepare then exec. */
mha_status mha_attention_run(const mha_kernels *kt, const mha_attn_args *a);

/* drive_transpose.c: per-batch in-place transpose of rows x cols elements of elem floats;
 * MHA_ERR_NOMEM (x untouched) when the scratch cannot be allocated. */
mha_status mha_transpose_run(const mha_kernels *kt, float *x, int32_t batch, int32_t rows,
                             int32_t cols, int32_t elem);

/* pack.c: W [n][k] given in panels of nr_src columns (1: W itself) packed into
 * panels of nr_dst (see mha_packed_floats). */
void mha_pack_weights(const float *src, int32_t n, int32_t k, int32_t nr_src, float *dst,
                      int32_t nr_dst);

#endif
