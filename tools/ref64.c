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

/* One query row of head h against keys j < end (lengths and causality applied by
   the caller): K row j at k + j*k_stride (dk floats), V row j at v + j*v_stride
   (dv floats), bias element j at bias[j] (bias NULL: none), pos = p(i). */
typedef struct row_args {
    const float *q, *k, *v, *bias;
    int64_t k_stride, v_stride;
    int32_t dk, dv, end, pos, h;
    double scale;
    const mha_mask *mask; /* window, softcap, ALiBi, sinks; NULL: none */
} row_args;

/* Writes the row's dv outputs and returns its lse; s holds `end` scores. */
static double ref_row(const row_args *a, double *s, double *o)
{
    const mha_mask *m = a->mask;
    int32_t begin = 0; /* window: key j masked when j <= pos - window */
    if (m && m->window > 0 && (int64_t)a->pos - m->window + 1 > begin)
        begin = (int32_t)((int64_t)a->pos - m->window + 1);
    /* Keys with a -inf score (a -INFINITY bias, or -inf from the data) are hidden like
       those outside [begin, end); NaN flows through (mx stays NaN). */
    double mx = -INFINITY;
    int seen = 0;
    for (int32_t j = begin; j < a->end; j++) {
        const double bias = a->bias ? a->bias[j] : 0.0;
        if (bias == -INFINITY) {
            s[j] = -INFINITY;
            continue;
        }
        double dot = 0;
        for (int32_t e = 0; e < a->dk; e++)
            dot += (double)a->q[e] * a->k[j * a->k_stride + e];
        double x = a->scale * dot;
        if (m && m->softcap > 0)
            x = m->softcap * tanh(x / m->softcap);
        x += bias;
        if (m && m->alibi_slopes)
            x += (double)m->alibi_slopes[a->h] * (double)(j - a->pos);
        s[j] = x;
        if (x != -INFINITY) {
            seen = 1;
            mx = isnan(x) || x > mx ? x : mx;
        }
    }
    for (int32_t e = 0; e < a->dv; e++)
        o[e] = 0;
    if (!seen)
        return -INFINITY; /* zeros, sink or not */
    /* A sink is a virtual key of score sinks[h] and value 0: only the denominator
       (a sink far above every score makes it overflow to inf: zeros, the limit). */
    const double sink = m && m->sinks ? m->sinks[a->h] : -INFINITY;
    double sum = 0;
    for (int32_t j = begin; j < a->end; j++) {
        if (s[j] == -INFINITY)
            continue;
        const double p = exp(s[j] - mx);
        sum += p;
        for (int32_t e = 0; e < a->dv; e++)
            o[e] += p * a->v[j * a->v_stride + e];
    }
    const double den = sum + exp(sink - mx);
    for (int32_t e = 0; e < a->dv; e++)
        o[e] /= den;
    return mx + log(sum);
}

/* Keys j < end pass a key length, a per-row length and causality at position pos. */
static int32_t row_end(int32_t end, int32_t key_len, const mha_mask *m, int64_t qkl_index,
                       int32_t pos)
{
    if (key_len < end)
        end = key_len;
    if (m && m->query_key_lens && m->query_key_lens[qkl_index] < end)
        end = m->query_key_lens[qkl_index];
    if (m && m->causal && pos + 1 < end)
        end = pos + 1 < 0 ? 0 : pos + 1;
    return end;
}

static const float *bias_row(const mha_mask *m, int32_t b, int32_t h, int32_t i)
{
    return m && m->bias ? m->bias + b * m->bias_stride_b + h * m->bias_stride_h
                              + i * m->bias_stride_q
                        : NULL;
}

static double *out_row(double *out, mha_layout layout, int32_t b, int32_t h, int32_t i,
                       int32_t H, int32_t Sq, int32_t dv)
{
    return layout == MHA_LAYOUT_BHSD ? out + (((int64_t)b * H + h) * Sq + i) * dv
                                     : out + (((int64_t)b * Sq + i) * H + h) * dv;
}

void ref_attention(const mha_attn_dims *d, const float *q, const float *k, const float *v,
                   double scale, const mha_mask *mask, double *out, mha_layout layout)
{
    const int32_t B = d->batch, H = d->heads, Sq = d->seq_q, Skv = d->seq_kv, dh = d->head_dim;
    const int32_t dv = d->v_head_dim ? d->v_head_dim : dh;
    double *s = xmalloc((size_t)Skv * sizeof(double));
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < H; h++) {
            const int32_t kvh = h / (H / d->kv_heads);
            const int64_t kv = (int64_t)b * d->kv_heads + kvh;
            for (int32_t i = 0; i < Sq; i++) {
                const int32_t pos = i + Skv - Sq;
                const row_args a = {
                    .q = q + (((int64_t)b * H + h) * Sq + i) * dh,
                    .k = k + kv * Skv * dh, .v = v + kv * Skv * dv,
                    .bias = bias_row(mask, b, h, i), .k_stride = dh, .v_stride = dv,
                    .dk = dh, .dv = dv, .pos = pos, .h = h, .scale = scale, .mask = mask,
                    .end = row_end(Skv, mask && mask->key_lens ? mask->key_lens[b] : Skv, mask,
                                   (int64_t)b * Sq + i, pos)};
                ref_row(&a, s, out_row(out, layout, b, h, i, H, Sq, dv));
            }
        }
    free(s);
}

void ref_attention_cached(const mha_kv_cache *c, const int32_t *lens, const float *q,
                          int32_t heads, int32_t seq_q, double scale, const mha_mask *mask,
                          double *out, mha_layout layout, double *lse)
{
    const int32_t H = heads, Sq = seq_q, dh = c->head_dim;
    const int32_t dv = c->v_head_dim ? c->v_head_dim : dh;
    /* V strides all 0 mean K's strides. */
    const int vk = c->v_stride_b == 0 && c->v_stride_h == 0 && c->v_stride_s == 0;
    const int64_t vsb = vk ? c->stride_b : c->v_stride_b, vsh = vk ? c->stride_h : c->v_stride_h;
    const int64_t vss = vk ? c->stride_s : c->v_stride_s;
    double *s = xmalloc((size_t)c->capacity * sizeof(double));
    for (int32_t b = 0; b < c->batch; b++)
        for (int32_t h = 0; h < H; h++) {
            const int32_t g = h / (H / c->kv_heads);
            for (int32_t i = 0; i < Sq; i++) {
                const int32_t pos = lens[b] - Sq + i;
                const row_args a = {
                    .q = q + (((int64_t)b * H + h) * Sq + i) * dh,
                    .k = c->k + b * c->stride_b + g * c->stride_h, .v = c->v + b * vsb + g * vsh,
                    .bias = bias_row(mask, b, h, i), .k_stride = c->stride_s, .v_stride = vss,
                    .dk = dh, .dv = dv, .pos = pos, .h = h, .scale = scale, .mask = mask,
                    .end = row_end(c->capacity, lens[b], mask, (int64_t)b * Sq + i, pos)};
                const double l = ref_row(&a, s, out_row(out, layout, b, h, i, H, Sq, dv));
                if (lse)
                    lse[((int64_t)b * H + h) * Sq + i] = l;
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
    const int32_t dv = d->v_head_dim ? d->v_head_dim : dh;
    const int32_t k_in = d->k_in ? d->k_in : d->q_in, v_in = d->v_in ? d->v_in : k_in;
    const int64_t Mq = (int64_t)batch * seq_q, Mkv = (int64_t)batch * seq_kv;
    double *yq = xmalloc((size_t)Mq * H * dh * sizeof(double));
    double *yk = xmalloc((size_t)Mkv * Hkv * dh * sizeof(double));
    double *yv = xmalloc((size_t)Mkv * Hkv * dv * sizeof(double));
    linear(query, Mq, d->q_in, d->w_q, d->b_q, H * dh, yq);
    linear(key, Mkv, k_in, d->w_k, d->b_k, Hkv * dh, yk);
    linear(value, Mkv, v_in, d->w_v, d->b_v, Hkv * dv, yv);
    float *q = split_heads(yq, batch, seq_q, H, dh);
    float *k = split_heads(yk, batch, seq_kv, Hkv, dh);
    float *v = split_heads(yv, batch, seq_kv, Hkv, dv);
    const mha_attn_dims dims = {batch, H, Hkv, seq_q, seq_kv, dh, dv};
    double *merged = d->out_dim > 0 ? xmalloc((size_t)Mq * H * dv * sizeof(double)) : out;
    ref_attention(&dims, q, k, v, 1.0 / sqrt((double)dh), mask, merged, MHA_LAYOUT_BSHD);
    if (d->out_dim > 0) {
        float *mf = xmalloc((size_t)Mq * H * dv * sizeof(float));
        for (int64_t i = 0; i < Mq * H * dv; i++)
            mf[i] = (float)merged[i];
        linear(mf, Mq, H * dv, d->w_o, d->b_o, d->out_dim, out);
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
