/* Attention driver for mha_attention and mha_attention_cached.
 *
 * A work item is one block: the query heads that share a kv head (GQA) and a
 * run of their query rows, so that each K and V row is read once for all of
 * them; with many query rows, a block is one head's run of attn_block_rows.
 * When blocks are too few to fill the threads (decode: few sequences, one row
 * each, long caches), the keys are cut into chunks too (flash-decoding): each
 * chunk writes its rows' normalised partial output and log-sum-exp, and the
 * chunk of a block that finishes last merges the block's chunks, in chunk order,
 * within the same parallel loop. How the work is cut (blocks, chunk count and
 * length) depends only on the call's shapes and lens, never on the thread
 * count, so results are bitwise identical for any number of threads; a call
 * whose shapes have the work yields up to SPLIT_ITEMS items.
 *
 * Masks become a per-row range of visible keys [kv_begin, kv_end) (key lengths,
 * causality and the window each cut one side), plus the bias, ALiBi and sinks
 * that the kernel applies. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Keys are cut when a call has fewer than SPLIT_BELOW blocks: into chunks of at
 * least CHUNK_MIN keys until there are SPLIT_BELOW items, and further, in chunks
 * of at least CHUNK_LONG keys, up to SPLIT_ITEMS items (the threads a long cache
 * can fill; shorter chunks cost their setup and merge on small machines). */
enum {
    SPLIT_BELOW = 64,
    SPLIT_ITEMS = 256,
    CHUNK_MIN = 256,
    CHUNK_LONG = 1024,
    CHUNK_ALIGN = 64,          /* chunk lengths are multiples of this */
    KV_FAR_BYTES = 512 * 1024, /* K and V beyond this are past a core's L2 (Zen 1's) */
};

/* Per-row arrays of a block, in the item's heap scratch (the stack stays small). */
typedef struct block_rows {
    int32_t kv_begin[MHA_ATTN_ROWS_MAX], kv_end[MHA_ATTN_ROWS_MAX];
    int32_t alibi_pos[MHA_ATTN_ROWS_MAX];
    float alibi_slope[MHA_ATTN_ROWS_MAX], sink[MHA_ATTN_ROWS_MAX], lse[MHA_ATTN_ROWS_MAX];
    float shift[MHA_ATTN_ROWS_MAX]; /* alibi_shift of each row */
} block_rows;

static size_t rows_bytes(void)
{
    return (sizeof(block_rows) + 63) / 64 * 64;
}

/* The keys of sequence b: lens[b] for the cache, seq_kv otherwise. */
static int32_t seq_keys(const mha_attn_args *a, int32_t b)
{
    return a->lens ? a->lens[b] : a->seq_kv;
}

/* The largest number of keys of any sequence. */
static int32_t max_keys(const mha_attn_args *a)
{
    int32_t m = 0;
    for (int32_t b = 0; b < a->batch; b++)
        m = seq_keys(a, b) > m ? seq_keys(a, b) : m;
    return m;
}

/* The cut of a call with `keys` keys at most per sequence, for blocks of at most
 * br rows: p's head_run .. chunk_len. */
static void cut(mha_attn_plan *p, int32_t br, int32_t batch, int32_t heads, int32_t kv_heads,
                int32_t seq_q, int32_t keys)
{
    const int32_t G = heads / kv_heads;
    if (seq_q >= br) {
        p->head_run = 1, p->row_run = br;
        p->qblocks = (seq_q + br - 1) / br;
    } else {
        p->row_run = seq_q, p->qblocks = 1;
        p->head_run = br / seq_q < G ? br / seq_q : G;
    }
    p->hgroups = (G + p->head_run - 1) / p->head_run;
    p->blocks = (int64_t)batch * kv_heads * p->hgroups * p->qblocks;
    p->chunks = 1;
    p->chunk_len = keys;
    if (p->blocks < SPLIT_BELOW && keys >= 2 * CHUNK_MIN) {
        int64_t n = (SPLIT_BELOW + p->blocks - 1) / p->blocks;
        int64_t more = (SPLIT_ITEMS + p->blocks - 1) / p->blocks;
        n = n < keys / CHUNK_MIN ? n : keys / CHUNK_MIN;
        more = more < keys / CHUNK_LONG ? more : keys / CHUNK_LONG;
        n = n > more ? n : more;
        int64_t len = (keys + n - 1) / n;
        len = (len + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
        p->chunk_len = (int32_t)len;
        p->chunks = (int32_t)((keys + len - 1) / len);
    }
}

/* Bytes of the partial results (outputs, then lse, then a chunk counter per
 * block) of a cut with chunks > 1. */
static size_t partial_bytes(const mha_attn_plan *p, int32_t dv)
{
    if (p->chunks == 1)
        return 0;
    const int64_t rows = p->blocks * p->chunks * p->head_run * p->row_run;
    return ((size_t)rows * (size_t)(dv + 1) * sizeof(float)
            + (size_t)p->blocks * sizeof(_Atomic int32_t) + 63) / 64 * 64;
}

/* Places the partial results at mem (partial_bytes of them). */
static void place_partials(mha_attn_plan *p, void *mem)
{
    const int64_t rows = p->blocks * p->chunks * p->head_run * p->row_run;
    p->part_out = mem;
    p->part_lse = p->part_out + rows * p->a.dv;
    p->merged = (_Atomic int32_t *)(p->part_lse + rows);
}

/* Floats of a slot's staged q and out rows: a block's rows converted to f32 when
 * q and out are 16-bit (the kernels take f32 rows). */
static size_t staged_floats(const mha_kernels *kt, const mha_attn_args *a)
{
    return a && a->io_type != MHA_F32 ? (size_t)kt->attn_block_rows * (size_t)(a->dk + a->dv) : 0;
}

static size_t kernel_bytes(const mha_kernels *kt)
{
    return kt->attn_scratch_bytes ? (kt->attn_scratch_bytes() + 63) / 64 * 64 : 0;
}

/* A slot: the block's rows, the kernel's scratch, the staged q and out rows. */
static size_t slot_bytes(const mha_kernels *kt, const mha_attn_args *a)
{
    return rows_bytes() + kernel_bytes(kt) + staged_floats(kt, a) * sizeof(float);
}

size_t mha_attention_arena_bytes(int32_t batch, int32_t heads, int32_t kv_heads, int32_t seq_q,
                                 int32_t dv)
{
    size_t partials = 0, slot = 0;
    for (int isa = 0; isa < MHA_ISA_COUNT; isa++) {
        const mha_kernels *kt = mha_kernels_for((mha_isa)isa);
        if (!kt)
            continue;
        /* The most chunks any lens gives: as if every sequence had many keys. */
        mha_attn_plan p;
        cut(&p, kt->attn_block_rows, batch, heads, kv_heads, seq_q, INT32_MAX);
        partials = partial_bytes(&p, dv) > partials ? partial_bytes(&p, dv) : partials;
        slot = slot_bytes(kt, NULL) > slot ? slot_bytes(kt, NULL) : slot;
    }
    const int64_t width = mha_parallel_width();
    const size_t slots = (size_t)(width < 1                       ? 1
                                  : width > MHA_SCRATCH_SLOTS_MAX ? MHA_SCRATCH_SLOTS_MAX
                                                                  : width);
    return partials + slots * ((slot + 63) / 64 * 64);
}

mha_status mha_attention_prepare(const mha_kernels *kt, const mha_attn_args *a, void *arena,
                                 size_t arena_bytes, mha_attn_plan *p)
{
    memset(p, 0, sizeof *p);
    p->kt = kt;
    p->a = *a;
    const int32_t keys = max_keys(a);
    cut(p, kt->attn_block_rows, a->batch, a->heads, a->kv_heads, a->seq_q, keys);
    p->serial = 2.0 * a->batch * a->heads * a->seq_q * (double)keys * (a->dk + a->dv)
                < kt->attn_serial_flops;
    const double kv_bytes = (double)a->batch * a->kv_heads * keys
                            * (double)(mha_row_bytes(a->kv_type, a->dk) + mha_row_bytes(a->kv_type, a->dv));
    /* K and V that take more than 3/4 of the L3 do not stay there between calls: the
       L3 holds the rest of the process too (Zen 4, 32 MiB L3, decode B=1 Skv=4096 over
       32 MiB of f32 K and V: 1.14-1.3x faster read as past L3) */
    p->kv_far = kv_bytes <= KV_FAR_BYTES                        ? KV_IN_L2
                : kv_bytes <= 0.75 * (double)mha_cpu_l3_bytes() ? KV_PAST_L2
                                                                : KV_PAST_L3;
    const int64_t items = p->blocks * p->chunks;
    const size_t partials = partial_bytes(p, a->dv);
    if (arena) {
        if (partials)
            place_partials(p, arena);
        mha_scratch_place(&p->scratch, slot_bytes(kt, a), items, (char *)arena + partials,
                          arena_bytes - partials);
        return MHA_OK;
    }
    if (mha_scratch_init(&p->scratch, slot_bytes(kt, a), items) != MHA_OK)
        return MHA_ERR_NOMEM;
    if (partials) {
        p->owned = malloc(partials);
        if (!p->owned) {
            mha_attention_release(p);
            return MHA_ERR_NOMEM;
        }
        place_partials(p, p->owned);
    }
    return MHA_OK;
}

void mha_attention_release(mha_attn_plan *p)
{
    mha_scratch_free(&p->scratch);
    free(p->owned);
    p->owned = NULL;
}

/* A block's place in the call. */
typedef struct block_at {
    int32_t b, g, h0, heads, i0, rows; /* heads h0.. of kv head g, rows i0.. of each */
} block_at;

static block_at locate(const mha_attn_plan *p, int64_t blk)
{
    const mha_attn_args *a = &p->a;
    block_at at;
    const int32_t qb = (int32_t)(blk % p->qblocks), hg = (int32_t)(blk / p->qblocks % p->hgroups);
    const int64_t bg = blk / p->qblocks / p->hgroups;
    at.b = (int32_t)(bg / a->kv_heads);
    at.g = (int32_t)(bg % a->kv_heads);
    const int32_t G = a->heads / a->kv_heads;
    at.h0 = at.g * G + hg * p->head_run;
    at.heads = G - hg * p->head_run < p->head_run ? G - hg * p->head_run : p->head_run;
    at.i0 = qb * p->row_run;
    at.rows = a->seq_q - at.i0 < p->row_run ? a->seq_q - at.i0 : p->row_run;
    return at;
}

static int32_t clamp(int64_t x, int32_t lo, int32_t hi)
{
    return x < lo ? lo : x > hi ? hi : (int32_t)x;
}

/* The keys row i of sequence b sees, [begin, end), and its position p(i); ALiBi
 * is measured from ref, the row's last visible key (p(i) when it sees none). */
typedef struct row_keys {
    int64_t begin, end, pos, ref;
} row_keys;

static row_keys visible(const mha_attn_args *a, int32_t b, int32_t i)
{
    const mha_mask *mask = a->mask;
    const int32_t Sq = a->seq_q;
    row_keys k = {.begin = 0, .end = seq_keys(a, b)};
    k.pos = mask && mask->q_offsets ? (int64_t)mask->q_offsets[b] + i : k.end - Sq + i;
    if (mask) {
        if (mask->key_lens && mask->key_lens[b] < k.end)
            k.end = mask->key_lens[b];
        if (mask->query_key_lens && mask->query_key_lens[(int64_t)b * Sq + i] < k.end)
            k.end = mask->query_key_lens[(int64_t)b * Sq + i];
        if (mask->causal && k.pos + 1 < k.end)
            k.end = k.pos + 1;
        if (mask->key_starts)
            k.begin = mask->key_starts[b];
        if (mask->window > 0 && k.pos - mask->window + 1 > k.begin)
            k.begin = k.pos - mask->window + 1;
    }
    k.ref = k.begin < k.end ? k.end - 1 : k.pos;
    return k;
}

/* ALiBi adds slope * (j - p) to the scores. The kernels add slope * (j - ref)
 * instead, small for the keys that matter even when they lie far from p (cut
 * off by lengths), and the constant slope * (ref - p) that softmax cancels is
 * put back where it does not cancel: in lse and against the sink. */
static float alibi_shift(const mha_attn_args *a, int32_t h, const row_keys *k)
{
    return a->mask && a->mask->alibi_slopes ? a->mask->alibi_slopes[h] * (float)(k->ref - k->pos)
                                            : 0.0f;
}

/* The K or V rows of kv head g of sequence b from key c0 on (mha_row). */
static mha_rows kv_rows(const mha_attn_args *a, const void *base, int64_t sb, int64_t sh,
                        int64_t ss, int32_t b, int32_t g, int32_t c0)
{
    const char *x = base;
    if (!a->block_table)
        return (mha_rows){.base = x + b * sb + g * sh + c0 * ss, .stride = ss};
    return (mha_rows){.base = x + g * sh, .stride = ss, .block_stride = sb,
                      .table = a->block_table + (int64_t)b * a->max_blocks,
                      .block_size = a->block_size, .first = c0};
}

/* The merge of block bi's chunks, row by row, in chunk order:
 *   L = log sum_c exp(lse_c);  out = sum_c exp(lse_c - M) O_c / (sum_c exp(lse_c - M) + exp(sink - M))
 * with M the largest lse_c; a row that saw no key in any chunk gets zeros. The sum
 * builds in the first chunk's partial row, then goes to out in its type. */
static void merge_block(const mha_attn_plan *p, int64_t bi)
{
    const mha_attn_args *a = &p->a;
    const block_at at = locate(p, bi);
    const int32_t H = a->heads, Sq = a->seq_q, dv = a->dv, C = p->chunks;
    const int64_t rows = (int64_t)p->head_run * p->row_run;
    const size_t es = (size_t)mha_dtype_block_bytes(a->io_type);
    for (int32_t r = 0; r < at.heads * at.rows; r++) {
        const int32_t h = at.h0 + r / at.rows, i = at.i0 + r % at.rows;
        const float *lse = p->part_lse + bi * C * rows + r;
        float *o = p->part_out + bi * C * rows * dv + (int64_t)r * dv;
        char *out = (char *)a->out + (at.b * a->out_st.b + h * a->out_st.h + i * a->out_st.s) * es;
        float m = -INFINITY;
        for (int32_t c = 0; c < C; c++)
            m = isnan(lse[c * rows]) || lse[c * rows] > m ? lse[c * rows] : m;
        float total = -INFINITY;
        if (m != -INFINITY) {
            float sum = 0.0f;
            for (int32_t c = 0; c < C; c++) {
                const float w = expf(lse[c * rows] - m);
                sum += w;
                for (int32_t d = 0; d < dv; d++)
                    o[d] = (c ? o[d] : 0.0f) + w * o[c * rows * dv + d];
            }
            const row_keys k = visible(a, at.b, i);
            const float shift = alibi_shift(a, h, &k);
            total = m + logf(sum) + shift;
            const float den =
                a->mask && a->mask->sinks ? sum + expf(a->mask->sinks[h] - shift - m) : sum;
            for (int32_t d = 0; d < dv; d++)
                o[d] /= den;
        } else {
            memset(o, 0, (size_t)dv * sizeof(float));
        }
        p->kt->convert(a->io_type, out, MHA_F32, o, dv);
        if (a->lse)
            a->lse[((int64_t)at.b * H + h) * Sq + i] = total;
    }
}

/* Rows r < n of a block (row r is row r % rows of its head r / rows) between the
 * tensor t of type `type` and strides st and the f32 rows f (pitch d): to f32, or
 * from f32 when `store`. The rows QPF ahead are asked for as the loop goes: a
 * [B][S][H][d] view scatters a head's rows (H*d apart), where the hardware's
 * prefetchers do not follow (bf16, B=32 S=128 H=12 on Zen 5: strided q and out ran
 * at 0.89-0.92 of dense's speed, now 0.93-0.99). */
enum { QPF = 8 };
static void convert_rows(const mha_kernels *kt, int32_t rows, int32_t n, mha_dtype type, char *t,
                         mha_strides st, int32_t d, float *f, int store)
{
    const int64_t es = mha_dtype_block_bytes(type), bytes = mha_row_bytes(type, d);
#define ROW_(r) (t + (((r) / rows) * st.h + ((r) % rows) * st.s) * es)
    for (int32_t r = 0; r < n; r++) {
        if (r + QPF < n) {
            const char *ahead = ROW_(r + QPF);
            for (int64_t c = 0; c < bytes; c += 64) {
                if (store)
                    __builtin_prefetch(ahead + c, 1);
                else
                    __builtin_prefetch(ahead + c, 0);
            }
        }
        if (store)
            kt->convert(type, ROW_(r), MHA_F32, f + (int64_t)r * d, d);
        else
            kt->convert(MHA_F32, f + (int64_t)r * d, type, ROW_(r), d);
    }
#undef ROW_
}

/* Work item: block blk / chunks, keys of chunk blk % chunks; the block's last
 * chunk to finish merges them. */
static void attend_item(void *arg, int64_t item)
{
    const mha_attn_plan *p = arg;
    const mha_attn_args *a = &p->a;
    const mha_mask *mask = a->mask;
    const int64_t bi = item / p->chunks;
    const int32_t c = (int32_t)(item % p->chunks);
    const block_at at = locate(p, bi);
    const int32_t H = a->heads, Sq = a->seq_q, len = seq_keys(a, at.b);
    const int32_t c0 = c * p->chunk_len;
    const int32_t cn = clamp((int64_t)len - c0, 0, p->chunk_len);
    const int split = p->chunks > 1;

    char *slot = mha_scratch_take((mha_scratch *)&p->scratch);
    block_rows *br = (block_rows *)slot;
    const int begins = mask && (mask->window > 0 || mask->key_starts);
    const int32_t nrows = at.heads * at.rows;
    /* A row's keys are the same in every head; without causality, a window, per-row
       lengths or ALiBi, in every row too. */
    const int same = !mask || !(mask->causal || mask->window > 0 || mask->query_key_lens
                                || mask->alibi_slopes);
    row_keys k = {0};
    int32_t end = 0, begin = 0;
    for (int32_t ii = 0; ii < at.rows; ii++) {
        if (ii == 0 || !same) {
            k = visible(a, at.b, at.i0 + ii);
            end = clamp(k.end - c0, 0, cn), begin = clamp(k.begin - c0, 0, end);
        }
        for (int32_t t = 0, r = ii; t < at.heads; t++, r += at.rows) {
            const int32_t h = at.h0 + t;
            br->kv_end[r] = end;
            br->kv_begin[r] = begin;
            br->shift[r] = alibi_shift(a, h, &k);
            if (mask && mask->alibi_slopes) {
                br->alibi_slope[r] = mask->alibi_slopes[h];
                br->alibi_pos[r] = (int32_t)(k.ref - c0);
            }
            if (mask && mask->sinks)
                br->sink[r] = mask->sinks[h] - br->shift[r];
        }
    }

    /* q and out rows of the block: in place when f32, else staged as f32 rows in
       the slot (q converted before the kernel, out after it). */
    const size_t es = (size_t)mha_dtype_block_bytes(a->io_type);
    const char *q0 = (const char *)a->q + (at.b * a->q_st.b + at.h0 * a->q_st.h + at.i0 * a->q_st.s) * es;
    char *o0 = (char *)a->out + (at.b * a->out_st.b + at.h0 * a->out_st.h + at.i0 * a->out_st.s) * es;
    float *staged = (float *)(slot + rows_bytes() + kernel_bytes(p->kt));
    const int typed = a->io_type != MHA_F32;
    if (typed)
        convert_rows(p->kt, at.rows, nrows, a->io_type, (char *)q0, a->q_st, a->dk, staged, 0);
    mha_attn_block blk = {
        .rows = nrows,
        .group_rows = at.rows,
        .seq_kv = cn,
        .dk = a->dk,
        .dv = a->dv,
        .q = typed ? staged : (const float *)q0,
        .q_stride = typed ? a->dk : a->q_st.s,
        .q_group_stride = typed ? (int64_t)at.rows * a->dk : a->q_st.h,
        .q_bf16 = a->io_type == MHA_BF16,
        .q_staged = typed,
        .k = kv_rows(a, a->k, a->k_stride_b, a->k_stride_h, a->k_stride_s, at.b, at.g, c0),
        .v = kv_rows(a, a->v, a->v_stride_b, a->v_stride_h, a->v_stride_s, at.b, at.g, c0),
        .kv_type = a->kv_type,
        .kv_far = p->kv_far,
        .kv_begin = begins ? br->kv_begin : NULL,
        .kv_end = br->kv_end,
        .scale = a->scale,
        .softcap = mask ? mask->softcap : 0.0f,
        .alibi_slope = mask && mask->alibi_slopes ? br->alibi_slope : NULL,
        .alibi_pos = br->alibi_pos,
        .sink = mask && mask->sinks && !split ? br->sink : NULL,
        .scratch = p->kt->attn_scratch_bytes ? slot + rows_bytes() : NULL,
    };
    if (mask && mask->bias) {
        blk.bias = mask->bias + at.b * mask->bias_stride_b + at.h0 * mask->bias_stride_h
                   + at.i0 * mask->bias_stride_q + c0;
        blk.bias_stride = mask->bias_stride_q;
        blk.bias_group_stride = mask->bias_stride_h;
    }
    if (split) {
        const int64_t rows = (int64_t)p->head_run * p->row_run;
        blk.out = p->part_out + item * rows * a->dv;
        blk.out_stride = a->dv;
        blk.out_group_stride = (int64_t)at.rows * a->dv;
        blk.lse = p->part_lse + item * rows;
    } else if (typed) {
        blk.out = staged + (int64_t)nrows * a->dk;
        blk.out_stride = a->dv;
        blk.out_group_stride = (int64_t)at.rows * a->dv;
        blk.lse = a->lse ? br->lse : NULL;
    } else {
        blk.out = (float *)o0;
        blk.out_stride = a->out_st.s;
        blk.out_group_stride = a->out_st.h;
        blk.lse = a->lse ? br->lse : NULL;
    }
    p->kt->attn_block(&blk);
    if (!split && typed)
        convert_rows(p->kt, at.rows, nrows, a->io_type, o0, a->out_st, a->dv, blk.out, 1);
    if (!split && a->lse)
        for (int32_t r = 0; r < nrows; r++)
            a->lse[((int64_t)at.b * H + at.h0 + r / at.rows) * Sq + at.i0 + r % at.rows] =
                br->lse[r] + br->shift[r];
    mha_scratch_give((mha_scratch *)&p->scratch, slot);
    /* acq_rel: the last chunk sees every other chunk's partial results */
    if (split && atomic_fetch_add_explicit(&p->merged[bi], 1, memory_order_acq_rel) == p->chunks - 1)
        merge_block(p, bi);
}

void mha_attention_exec(mha_attn_plan *p)
{
    for (int64_t bi = 0; p->chunks > 1 && bi < p->blocks; bi++)
        atomic_init(&p->merged[bi], 0);
    if (p->serial) /* the same items in order: the same results */
        for (int64_t i = 0; i < p->blocks * p->chunks; i++)
            attend_item(p, i);
    else
        mha_parallel_for(p->blocks * p->chunks, attend_item, p);
    mha_attention_release(p);
}

mha_status mha_attention_run(const mha_kernels *kt, const mha_attn_args *a)
{
    mha_attn_plan p;
    const mha_status st = mha_attention_prepare(kt, a, NULL, 0, &p);
    if (st == MHA_OK)
        mha_attention_exec(&p);
    return st;
}
