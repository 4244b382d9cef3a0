#include "ref64.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ref64: out of memory\n");
        exit(1);
    }
    return p;
}

/* binary16 and bfloat16 decoded from their fields, independently of the library. */
static double half_value(uint16_t h)
{
    const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double mag = e == 0x1f ? (m ? NAN : INFINITY)
                       : e       ? ldexp(1024 + m, e - 25)
                                 : ldexp(m, -24);
    return sign ? -mag : mag;
}

static double bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double ref_value(mha_dtype t, const void *row, int64_t i)
{
    switch (t) {
    case MHA_F16: return half_value(((const uint16_t *)row)[i]);
    case MHA_BF16: return bf16_value(((const uint16_t *)row)[i]);
    case MHA_Q8_0: {
        const uint8_t *blk = (const uint8_t *)row + i / 32 * 34;
        return half_value((uint16_t)(blk[0] | blk[1] << 8)) * (int8_t)blk[2 + i % 32];
    }
    default: return ((const float *)row)[i];
    }
}

/* Bytes of one element (of a 32-value block for q8_0): the unit of strides. */
double ref_ulp(mha_dtype t, double r)
{
    const int bits = t == MHA_F16 ? 10 : t == MHA_BF16 ? 7 : 23;
    const int emin = t == MHA_F16 ? -14 : -126;
    int e = r == 0.0 ? emin : (int)floor(log2(fabs(r)));
    e = e < emin ? emin : e;
    return ldexp(1.0, e - bits);
}

static int64_t unit_bytes(mha_dtype t)
{
    return t == MHA_Q8_0 ? 34 : t == MHA_F32 ? 4 : 2;
}

/* A [B][H][S][d] tensor read through strides (in units), or a paged cache side. */
typedef struct tensor {
    const void *base;
    mha_dtype t;
    int64_t sb, sh, ss;
    const int32_t *table; /* paged: [B][max_blocks] */
    int32_t block_size, max_blocks;
} tensor;

static const void *row_of(const tensor *x, int32_t b, int32_t h, int32_t s)
{
    int64_t at = h * x->sh;
    if (x->table)
        at += x->table[(int64_t)b * x->max_blocks + s / x->block_size] * x->sb
              + (int64_t)(s % x->block_size) * x->ss;
    else
        at += b * x->sb + (int64_t)s * x->ss;
    return (const char *)x->base + at * unit_bytes(x->t);
}

/* One query row (its dk values q) of head h, kv head g of sequence b, against keys
   begin <= j < end of k and v; bias row (NULL: none); pos = p(i). */
typedef struct row_args {
    const double *q;
    const tensor *k, *v;
    const float *bias;
    int32_t b, g, dk, dv, begin, end, pos, h;
    double scale;
    const mha_mask *mask; /* softcap, ALiBi, sinks; NULL: none */
} row_args;

/* Writes the row's dv outputs and returns its lse; s holds `end` scores. */
static double ref_row(const row_args *a, double *s, double *o)
{
    const mha_mask *m = a->mask;
    /* Keys with a -inf score (a -INFINITY bias, or -inf from the data) are hidden like
       those outside [begin, end); NaN flows through (mx stays NaN). */
    double mx = -INFINITY;
    int seen = 0;
    for (int32_t j = a->begin; j < a->end; j++) {
        const double bias = a->bias ? a->bias[j] : 0.0;
        if (bias == -INFINITY) {
            s[j] = -INFINITY;
            continue;
        }
        const void *kr = row_of(a->k, a->b, a->g, j);
        double dot = 0;
        for (int32_t e = 0; e < a->dk; e++)
            dot += a->q[e] * ref_value(a->k->t, kr, e);
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
    for (int32_t j = a->begin; j < a->end; j++) {
        if (s[j] == -INFINITY)
            continue;
        const double p = exp(s[j] - mx);
        const void *vr = row_of(a->v, a->b, a->g, j);
        sum += p;
        for (int32_t e = 0; e < a->dv; e++)
            o[e] += p * ref_value(a->v->t, vr, e);
    }
    const double den = sum + exp(sink - mx);
    for (int32_t e = 0; e < a->dv; e++)
        o[e] /= den;
    return mx + log(sum);
}

/* The keys row i of sequence b sees with `keys` keys: [begin, end), at position pos. */
static void row_range(const mha_mask *m, int32_t b, int32_t i, int32_t Sq, int32_t keys,
                      int32_t *begin, int32_t *end, int32_t *pos)
{
    const int64_t p = m && m->q_offsets ? (int64_t)m->q_offsets[b] + i : (int64_t)keys - Sq + i;
    int64_t lo = m && m->key_starts ? m->key_starts[b] : 0, hi = keys;
    if (m && m->key_lens && m->key_lens[b] < hi)
        hi = m->key_lens[b];
    if (m && m->query_key_lens && m->query_key_lens[(int64_t)b * Sq + i] < hi)
        hi = m->query_key_lens[(int64_t)b * Sq + i];
    if (m && m->causal && p + 1 < hi)
        hi = p + 1;
    if (m && m->window > 0 && p - m->window + 1 > lo)
        lo = p - m->window + 1;
    *end = (int32_t)(hi < 0 ? 0 : hi);
    *begin = (int32_t)(lo < 0 ? 0 : lo > *end ? *end : lo);
    *pos = (int32_t)p;
}

static const float *bias_row(const mha_mask *m, int32_t b, int32_t h, int32_t i)
{
    return m && m->bias ? m->bias + b * m->bias_stride_b + h * m->bias_stride_h
                              + i * m->bias_stride_q
                        : NULL;
}

/* Every row: q [B][H][Sq][dk] through qt, out dense [B][H][Sq][dv] through os (in
   doubles), lse [B][H][Sq]; lens NULL: nkeys keys per sequence. */
static void ref_all(int32_t B, int32_t H, int32_t Hkv, int32_t Sq, int32_t nkeys,
                    const int32_t *lens, int32_t dk, int32_t dv, const tensor *qt,
                    const tensor *k, const tensor *v, double scale, const mha_mask *mask,
                    double *out, const mha_strides *os, double *lse)
{
    double *s = xmalloc((size_t)nkeys * sizeof(double)), *q = xmalloc((size_t)dk * sizeof(double));
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < H; h++)
            for (int32_t i = 0; i < Sq; i++) {
                const void *qr = row_of(qt, b, h, i);
                for (int32_t e = 0; e < dk; e++)
                    q[e] = ref_value(qt->t, qr, e);
                row_args a = {.q = q, .k = k, .v = v, .bias = bias_row(mask, b, h, i), .b = b,
                              .g = h / (H / Hkv), .dk = dk, .dv = dv, .h = h, .scale = scale,
                              .mask = mask};
                row_range(mask, b, i, Sq, lens ? lens[b] : nkeys, &a.begin, &a.end, &a.pos);
                const double l = ref_row(&a, s, out + b * os->b + h * os->h + i * os->s);
                if (lse)
                    lse[((int64_t)b * H + h) * Sq + i] = l;
            }
    free(s);
    free(q);
}

static mha_strides dense(int32_t H, int32_t S, int32_t d)
{
    return (mha_strides){(int64_t)H * S * d, (int64_t)S * d, d};
}

static mha_strides out_strides(mha_layout layout, int32_t H, int32_t Sq, int32_t dv)
{
    return layout == MHA_LAYOUT_BHSD ? dense(H, Sq, dv)
                                     : (mha_strides){(int64_t)Sq * H * dv, dv, (int64_t)H * dv};
}

void ref_attention_strided(const mha_attn_dims *d, const void *q, const mha_strides *qs,
                           const void *k, const mha_strides *ks, const void *v,
                           const mha_strides *vs, double scale, const mha_mask *mask,
                           double *out, double *lse)
{
    const int32_t H = d->heads, Hkv = d->kv_heads, Sq = d->seq_q, Skv = d->seq_kv;
    const int32_t dk = d->head_dim, dv = d->v_head_dim ? d->v_head_dim : dk;
    const mha_strides q_st = qs ? *qs : dense(H, Sq, dk), k_st = ks ? *ks : dense(Hkv, Skv, dk);
    const mha_strides v_st = vs ? *vs : dense(Hkv, Skv, dv), o_st = dense(H, Sq, dv);
    const tensor qt = {.base = q, .t = d->dtype, .sb = q_st.b, .sh = q_st.h, .ss = q_st.s};
    const tensor kt = {.base = k, .t = d->dtype, .sb = k_st.b, .sh = k_st.h, .ss = k_st.s};
    const tensor vt = {.base = v, .t = d->dtype, .sb = v_st.b, .sh = v_st.h, .ss = v_st.s};
    ref_all(d->batch, H, Hkv, Sq, Skv, NULL, dk, dv, &qt, &kt, &vt, scale, mask, out, &o_st, lse);
}

void ref_attention(const mha_attn_dims *d, const float *q, const float *k, const float *v,
                   double scale, const mha_mask *mask, double *out, mha_layout layout)
{
    const int32_t H = d->heads, Hkv = d->kv_heads, Sq = d->seq_q, Skv = d->seq_kv;
    const int32_t dk = d->head_dim, dv = d->v_head_dim ? d->v_head_dim : dk;
    const mha_strides q_st = dense(H, Sq, dk), k_st = dense(Hkv, Skv, dk), v_st = dense(Hkv, Skv, dv);
    const mha_strides o_st = out_strides(layout, H, Sq, dv);
    const tensor qt = {.base = q, .t = d->dtype, .sb = q_st.b, .sh = q_st.h, .ss = q_st.s};
    const tensor kt = {.base = k, .t = d->dtype, .sb = k_st.b, .sh = k_st.h, .ss = k_st.s};
    const tensor vt = {.base = v, .t = d->dtype, .sb = v_st.b, .sh = v_st.h, .ss = v_st.s};
    ref_all(d->batch, H, Hkv, Sq, Skv, NULL, dk, dv, &qt, &kt, &vt, scale, mask, out, &o_st, NULL);
}

void ref_attention_cached_strided(const mha_kv_cache *c, const int32_t *lens, const void *q,
                                  const mha_strides *qs, int32_t heads, int32_t seq_q,
                                  double scale, const mha_mask *mask, double *out,
                                  const mha_strides *os, double *lse)
{
    const int32_t dk = c->head_dim, dv = c->v_head_dim ? c->v_head_dim : dk;
    /* V strides all 0 mean K's strides. */
    const int vk = c->v_stride_b == 0 && c->v_stride_h == 0 && c->v_stride_s == 0;
    const tensor kt = {c->k, c->dtype, c->stride_b, c->stride_h, c->stride_s, c->block_table,
                       c->block_size, c->max_blocks};
    const tensor vt = {c->v, c->dtype, vk ? c->stride_b : c->v_stride_b,
                       vk ? c->stride_h : c->v_stride_h, vk ? c->stride_s : c->v_stride_s,
                       c->block_table, c->block_size, c->max_blocks};
    const mha_strides q_st = qs ? *qs : dense(heads, seq_q, dk);
    const tensor qt = {.base = q, .t = c->io_dtype, .sb = q_st.b, .sh = q_st.h, .ss = q_st.s};
    const mha_strides o_st = os ? *os : dense(heads, seq_q, dv);
    ref_all(c->batch, heads, c->kv_heads, seq_q, c->capacity, lens, dk, dv, &qt, &kt, &vt, scale,
            mask, out, &o_st, lse);
}

void ref_attention_cached(const mha_kv_cache *c, const int32_t *lens, const float *q,
                          int32_t heads, int32_t seq_q, double scale, const mha_mask *mask,
                          double *out, mha_layout layout, double *lse)
{
    const int32_t dv = c->v_head_dim ? c->v_head_dim : c->head_dim;
    const mha_strides os = out_strides(layout, heads, seq_q, dv);
    ref_attention_cached_strided(c, lens, q, NULL, heads, seq_q, scale, mask, out, &os, lse);
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
    const mha_attn_dims dims = {batch, H, Hkv, seq_q, seq_kv, dh, dv, MHA_F32};
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
