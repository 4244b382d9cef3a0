/* Attention driver: one work item per (batch, head, block of query rows), so
 * that even batch*heads below the thread count fills the cores. Masks become a
 * per-row count of visible keys (all mask kinds hide a suffix of the keys) plus
 * the additive bias, which the kernel applies. */
#include "internal.h"

/* Keys visible to query row i of batch b form a prefix: j < kv_end. */
static int32_t visible_keys(const mha_attn_dims *d, const mha_mask *mask, int32_t b, int32_t i)
{
    int32_t end = d->seq_kv;
    if (!mask)
        return end;
    if (mask->key_lens && mask->key_lens[b] < end)
        end = mask->key_lens[b];
    if (mask->query_key_lens && mask->query_key_lens[(int64_t)b * d->seq_q + i] < end)
        end = mask->query_key_lens[(int64_t)b * d->seq_q + i];
    if (mask->causal) {
        int64_t diag = (int64_t)i + d->seq_kv - d->seq_q + 1;
        if (diag < end)
            end = diag < 0 ? 0 : (int32_t)diag;
    }
    return end;
}

/* One attention call: what every work item reads. */
typedef struct attn_call {
    const mha_kernels *kt;
    const mha_attn_dims *d;
    const float *q, *k, *v;
    float scale;
    const mha_mask *mask;
    float *out;
    mha_layout layout;
    int64_t qblocks;
    mha_scratch scratch;
} attn_call;

/* Work item: a block of query rows of one (b, h). */
static void attend_item(void *arg, int64_t item)
{
    attn_call *c = arg;
    const mha_attn_dims *d = c->d;
    const mha_mask *mask = c->mask;
    const int32_t H = d->heads, Sq = d->seq_q, Skv = d->seq_kv, dh = d->head_dim;
    const int32_t br = c->kt->attn_block_rows;
    int32_t kv_end[MHA_ATTN_ROWS_MAX];
    const int32_t b = (int32_t)(item / (H * c->qblocks));
    const int32_t h = (int32_t)(item / c->qblocks % H);
    const int32_t i0 = (int32_t)(item % c->qblocks) * br;
    const int32_t rows = Sq - i0 < br ? Sq - i0 : br;
    for (int32_t r = 0; r < rows; r++)
        kv_end[r] = visible_keys(d, mask, b, i0 + r);

    const int64_t kv_head = (int64_t)b * d->kv_heads + h / (H / d->kv_heads);
    mha_attn_block blk = {
        .rows = rows,
        .seq_kv = Skv,
        .head_dim = dh,
        .q = c->q + (((int64_t)b * H + h) * Sq + i0) * dh,
        .q_stride = dh,
        .k = c->k + kv_head * Skv * dh,
        .v = c->v + kv_head * Skv * dh,
        .kv_end = kv_end,
        .scale = c->scale,
    };
    if (mask && mask->bias) {
        blk.bias = mask->bias + b * mask->bias_stride_b + h * mask->bias_stride_h
                   + i0 * mask->bias_stride_q;
        blk.bias_stride = mask->bias_stride_q;
    }
    if (c->layout == MHA_LAYOUT_BHSD) {
        blk.out = c->out + (((int64_t)b * H + h) * Sq + i0) * dh;
        blk.out_stride = dh;
    } else {
        blk.out = c->out + (((int64_t)b * Sq + i0) * H + h) * dh;
        blk.out_stride = (int64_t)H * dh;
    }
    blk.scratch = mha_scratch_take(&c->scratch);
    c->kt->attn_block(&blk);
    mha_scratch_give(&c->scratch, blk.scratch);
}

mha_status mha_attention_run(const mha_kernels *kt, const mha_attn_dims *d, const float *q,
                             const float *k, const float *v, float scale, const mha_mask *mask,
                             float *out, mha_layout layout)
{
    const int32_t br = kt->attn_block_rows;
    attn_call c = {.kt = kt, .d = d, .q = q, .k = k, .v = v, .scale = scale, .mask = mask,
                   .out = out, .layout = layout, .qblocks = (d->seq_q + br - 1) / br};
    const int64_t items = (int64_t)d->batch * d->heads * c.qblocks;
    const size_t scratch = kt->attn_scratch_bytes ? kt->attn_scratch_bytes() : 0;
    if (mha_scratch_init(&c.scratch, scratch, items) != MHA_OK)
        return MHA_ERR_NOMEM;
    mha_parallel_for(items, attend_item, &c);
    mha_scratch_free(&c.scratch);
    return MHA_OK;
}
