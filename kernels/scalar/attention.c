/* Scalar reference attention, straight from the math, two passes per row:
 *   s_j = scale * q.k_j + bias_j  for visible j;  m = max_j s_j
 *   out = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)
 * Dot products are recomputed in the second pass so nothing grows with seq_kv.
 * Non-finite data: a key is hidden when j >= kv_end or its score is -inf (a
 * -INFINITY bias, whatever q.k is, or -inf from the data): it gets weight 0 and
 * neither its K beyond that nor its V is used. Every other key is visible, and a
 * NaN or Inf it brings flows through IEEE arithmetic (a NaN score keeps m NaN).
 * A row with no visible key gets zeros. */
#include <math.h>
#include <string.h>

#include "internal.h"

static float score(const mha_attn_block *blk, const float *q, const float *bias, int32_t j)
{
    if (bias && bias[j] == -INFINITY)
        return -INFINITY;
    const float *kj = blk->k + (int64_t)j * blk->head_dim;
    float dot = 0.0f;
    for (int32_t d = 0; d < blk->head_dim; d++)
        dot += q[d] * kj[d];
    float s = blk->scale * dot;
    return bias ? s + bias[j] : s;
}

static void attend_row(const mha_attn_block *blk, const float *q, int32_t kv_end,
                       const float *bias, float *out)
{
    const int32_t dh = blk->head_dim;
    float m = -INFINITY;
    int seen = 0;
    for (int32_t j = 0; j < kv_end; j++) {
        const float s = score(blk, q, bias, j);
        if (s == -INFINITY)
            continue;
        seen = 1;
        m = isnan(s) || s > m ? s : m;
    }

    memset(out, 0, (size_t)dh * sizeof(float));
    if (!seen)
        return; /* no visible key: zeros */

    float sum = 0.0f;
    for (int32_t j = 0; j < kv_end; j++) {
        const float s = score(blk, q, bias, j);
        if (s == -INFINITY)
            continue;
        const float p = expf(s - m);
        const float *vj = blk->v + (int64_t)j * dh;
        sum += p;
        for (int32_t d = 0; d < dh; d++)
            out[d] += p * vj[d];
    }
    for (int32_t d = 0; d < dh; d++)
        out[d] /= sum;
}
void mha_attn_block__scalar(const mha_attn_block *blk)
{
    for (int32_t r = 0; r < blk->rows; r++)
        attend_row(blk, blk->q + r * blk->q_stride, blk->kv_end[r],
                   blk->bias ? blk->bias + r * blk->bias_stride : NULL,
                   blk->out + r * blk->out_stride);
}
