/* Scalar reference attention, straight from the math, two passes per row:
 *   s_j = score of visible key j (scale * q.k_j, softcap, + bias + ALiBi);  m = max_j s_j
 *   out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m))
 * Dot products are recomputed in the second pass so nothing grows with seq_kv.
 * K and V values are read one at a time as kernels/dtype.h converts them.
 * Non-finite data: a key is hidden when it lies outside [kv_begin, kv_end) or its
 * score is -inf (a -INFINITY bias, whatever q.k is, or -inf from the data): it
 * gets weight 0 and neither its K beyond that nor its V is used. Every other key
 * is visible, and a NaN or Inf it brings flows through IEEE arithmetic (a NaN
 * score keeps m NaN). A row with no visible key gets zeros. */
#include <math.h>
#include <string.h>

#include "internal.h"

/* One row's view of the block. */
typedef struct row {
    const float *q, *bias;
    float slope, sink;
    int32_t pos, begin, end;
    int has_alibi, has_sink;
} row;

static float score(const mha_attn_block *blk, const row *rw, int32_t j)
{
    if (rw->bias && rw->bias[j] == -INFINITY)
        return -INFINITY;
    const char *kj = mha_row(&blk->k, j);
    float dot = 0.0f;
    for (int32_t d = 0; d < blk->dk; d++)
        dot += rw->q[d] * mha_load_value(blk->kv_type, kj, d);
    float s = blk->scale * dot;
    if (blk->softcap > 0.0f)
        s = blk->softcap * tanhf(s / blk->softcap);
    if (rw->bias)
        s += rw->bias[j];
    if (rw->has_alibi)
        s += rw->slope * (float)(j - rw->pos);
    return s;
}

static void attend_row(const mha_attn_block *blk, const row *rw, float *out, float *lse)
{
    const int32_t dv = blk->dv;
    float m = -INFINITY;
    int seen = 0;
    for (int32_t j = rw->begin; j < rw->end; j++) {
        const float s = score(blk, rw, j);
        if (s == -INFINITY)
            continue;
        seen = 1;
        m = isnan(s) || s > m ? s : m;
    }

    memset(out, 0, (size_t)dv * sizeof(float));
    if (lse)
        *lse = -INFINITY;
    if (!seen)
        return; /* no visible key: zeros */

    float sum = 0.0f;
    for (int32_t j = rw->begin; j < rw->end; j++) {
        const float s = score(blk, rw, j);
        if (s == -INFINITY)
            continue;
        const float p = expf(s - m);
        const char *vj = mha_row(&blk->v, j);
        sum += p;
        for (int32_t d = 0; d < dv; d++)
            out[d] += p * mha_load_value(blk->kv_type, vj, d);
    }
    if (lse)
        *lse = m + logf(sum);
    const float denom = rw->has_sink ? sum + expf(rw->sink - m) : sum;
    for (int32_t d = 0; d < dv; d++)
        out[d] /= denom;
}

void mha_attn_block__scalar(const mha_attn_block *blk)
{
    for (int32_t r = 0; r < blk->rows; r++) {
        row rw = {
            .q = blk->q + mha_row_offset(blk, r, blk->q_stride, blk->q_group_stride),
            .bias = blk->bias ? blk->bias + mha_row_offset(blk, r, blk->bias_stride,
                                                           blk->bias_group_stride)
                              : NULL,
            .begin = blk->kv_begin ? blk->kv_begin[r] : 0,
            .end = blk->kv_end[r],
            .has_alibi = blk->alibi_slope != NULL,
            .has_sink = blk->sink != NULL,
        };
        if (rw.has_alibi)
            rw.slope = blk->alibi_slope[r], rw.pos = blk->alibi_pos[r];
        if (rw.has_sink)
            rw.sink = blk->sink[r];
        attend_row(blk, &rw, blk->out + mha_row_offset(blk, r, blk->out_stride, blk->out_group_stride),
                   blk->lse ? blk->lse + r : NULL);
    }
}
