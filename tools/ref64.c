#include "ref64.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ref64: out of memory\n");
        exit(1);
    }
    return p;
}

static int32_t visible(const mha_attn_dims *d, const mha_mask *m, int32_t b, int32_t i)
{
    int32_t end = d->seq_kv;
    if (!m)
        return end;
    if (m->key_lens && m->key_lens[b] < end)
        end = m->key_lens[b];
    if (m->query_key_lens && m->query_key_lens[b * d->seq_q + i] < end)
        end = m->query_key_lens[b * d->seq_q + i];
    if (m->causal && i + d->seq_kv - d->seq_q + 1 < end)
        end = i + d->seq_kv - d->seq_q + 1 < 0 ? 0 : i + d->seq_kv - d->seq_q + 1;
    return end;
}

void ref_attention(const mha_attn_dims *d, const float *q, const float *k, const float *v,
                   double scale, const mha_mask *mask, double *out, mha_layout layout)
{
    const int32_t B = d->batch, H = d->heads, Sq = d->seq_q, Skv = d->seq_kv, dh = d->head_dim;
    double *s = xmalloc((size_t)Skv * sizeof(double));
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < H; h++) {
            const int32_t kvh = h / (H / d->kv_heads);
            const float *kb = k + ((int64_t)b * d->kv_heads + kvh) * Skv * dh;
            const float *vb = v + ((int64_t)b * d->kv_heads + kvh) * Skv * dh;
            for (int32_t i = 0; i < Sq; i++) {
                const float *qi = q + (((int64_t)b * H + h) * Sq + i) * dh;
                double *o = layout == MHA_LAYOUT_BHSD ? out + (((int64_t)b * H + h) * Sq + i) * dh
                                                      : out + (((int64_t)b * Sq + i) * H + h) * dh;
                const int32_t end = visible(d, mask, b, i);
                /* Keys with a -inf score (a -INFINITY bias, or -inf from the data) are
                   hidden like those past `end`; NaN flows through (mx stays NaN). */
                double mx = -INFINITY;
                int seen = 0;
                for (int32_t j = 0; j < end; j++) {
                    const double bias = mask && mask->bias
                                            ? mask->bias[b * mask->bias_stride_b
                                                         + h * mask->bias_stride_h
                                                         + i * mask->bias_stride_q + j]
                                            : 0.0;
                    double dot = 0;
                    for (int32_t e = 0; e < dh && bias != -INFINITY; e++)
                        dot += (double)qi[e] * kb[(int64_t)j * dh + e];
                    s[j] = bias == -INFINITY ? -INFINITY : scale * dot + bias;
                    if (s[j] != -INFINITY) {
                        seen = 1;
                        mx = isnan(s[j]) || s[j] > mx ? s[j] : mx;
                    }
                }
                for (int32_t e = 0; e < dh; e++)
                    o[e] = 0;
                if (!seen)
                    continue;
                double sum = 0;
                for (int32_t j = 0; j < end; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    double p = exp(s[j] - mx);
                    sum += p;
                    for (int32_t e = 0; e < dh; e++)
                        o[e] += p * vb[(int64_t)j * dh + e];
                }
                for (int32_t e = 0; e < dh; e++)
                    o[e] /= sum;
            }
        }
    free(s);
}

/* y [m][n] = x [m][in] W^T + b, rounded to float like the library's intermediates. */
static void linear(const float *x, int64_t m, int32_t in, const float *w, const float *b,
                   int32_t n, double *y)
{
    for (int64_t i = 0; i < m; i++)
        for (int32_t j = 0; j < n; j++) {
            double acc = b ? b[j] : 0.0;
            for (int32_t kk = 0; kk < in; kk++)
                acc += (double)x[i * in + kk] * w[(int64_t)j * in + kk];
            y[i * n + j] = acc;
        }
}

/* [B][S][H][dh] doubles -> [B][H][S][dh] floats */
static float *split_heads(const double *x, int32_t B, int32_t S, int32_t H, int32_t dh)
{
    float *y = xmalloc((size_t)B * S * H * dh * sizeof(float));
    for (int32_t b = 0; b < B; b++)
        for (int32_t s = 0; s < S; s++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t e = 0; e < dh; e++)
                    y[(((int64_t)b * H + h) * S + s) * dh + e] =
                        (float)x[(((int64_t)b * S + s) * H + h) * dh + e];
    return y;
}

void ref_layer(const mha_layer_desc *d, const float *query, const float *key, const float *value,
               int32_t batch, int32_t seq_q, int32_t seq_kv, const mha_mask *mask, double *out)
{
    const int32_t H = d->heads, Hkv = d->kv_heads ? d->kv_heads : d->heads, dh = d->head_dim;
    const int32_t k_in = d->k_in ? d->k_in : d->q_in, v_in = d->v_in ? d->v_in : k_in;
    const int64_t Mq = (int64_t)batch * seq_q, Mkv = (int64_t)batch * seq_kv;
    double *yq = xmalloc((size_t)Mq * H * dh * sizeof(double));
    double *yk = xmalloc((size_t)Mkv * Hkv * dh * sizeof(double));
    double *yv = xmalloc((size_t)Mkv * Hkv * dh * sizeof(double));
    linear(query, Mq, d->q_in, d->w_q, d->b_q, H * dh, yq);
    linear(key, Mkv, k_in, d->w_k, d->b_k, Hkv * dh, yk);
    linear(value, Mkv, v_in, d->w_v, d->b_v, Hkv * dh, yv);
    float *q = split_heads(yq, batch, seq_q, H, dh);
    float *k = split_heads(yk, batch, seq_kv, Hkv, dh);
    float *v = split_heads(yv, batch, seq_kv, Hkv, dh);
    const mha_attn_dims dims = {batch, H, Hkv, seq_q, seq_kv, dh};
    double *merged = d->out_dim > 0 ? xmalloc((size_t)Mq * H * dh * sizeof(double)) : out;
    ref_attention(&dims, q, k, v, 1.0 / sqrt((double)dh), mask, merged, MHA_LAYOUT_BSHD);
    if (d->out_dim > 0) {
        float *mf = xmalloc((size_t)Mq * H * dh * sizeof(float));
        for (int64_t i = 0; i < Mq * H * dh; i++)
            mf[i] = (float)merged[i];
        linear(mf, Mq, H * dh, d->w_o, d->b_o, d->out_dim, out);
        free(mf);
        free(merged);
    }
    free(yq);
    free(yk);
    free(yv);
    free(q);
    free(k);
    free(v);
}
