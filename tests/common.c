#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(1);
    }
    return p;
}

float rng_uniform(rng *r, float lo, float hi)
{
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * 0x1.0p-24);
}

float *rand_floats(rng *r, int64_t n, float lo, float hi)
{
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = rng_uniform(r, lo, hi);
    return p;
}

float *filled_floats(int64_t n, float value)
{
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = value;
    return p;
}

static double ratio_one(double a, double r, double tol)
{
    if (isnan(a) || isnan(r))
        return isnan(a) && isnan(r) ? 0.0 : INFINITY;
    if (isinf(a) || isinf(r))
        return a == r ? 0.0 : INFINITY;
    return fabs(a - r) / (tol + tol * fabs(r));
}

double tol_ratio(const float *a, const double *r, int64_t n, double tol)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, ratio_one(a[i], r[i], tol));
    return worst;
}

double tol_ratio_f(const float *a, const float *r, int64_t n, double tol)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, ratio_one(a[i], r[i], tol));
    return worst;
}

double max_abs_err(const float *a, const float *r, int64_t n)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - r[i]));
    return worst;
}

void require_env_isa(void)
{
    const char *env = getenv("MHA_ISA");
    if (!env)
        return;
    for (int i = 0; i <= MHA_ISA_NEON; i++)
        if (strcmp(env, mha_isa_name((mha_isa)i)) == 0) {
            if (!mha_isa_available((mha_isa)i)) {
                printf("MHA_ISA=%s: not available on this CPU or build, skipping\n", env);
                exit(77);
            }
            if (mha_isa_active() != (mha_isa)i) {
                fprintf(stderr, "MHA_ISA=%s but active ISA is %s\n", env,
                        mha_isa_name(mha_isa_active()));
                exit(1);
            }
            return;
        }
    fprintf(stderr, "MHA_ISA=%s names no ISA\n", env);
    exit(1);
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
                double mx = -INFINITY;
                for (int32_t j = 0; j < end; j++) {
                    double dot = 0;
                    for (int32_t e = 0; e < dh; e++)
                        dot += (double)qi[e] * kb[(int64_t)j * dh + e];
                    s[j] = scale * dot;
                    if (mask && mask->bias)
                        s[j] += mask->bias[b * mask->bias_stride_b + h * mask->bias_stride_h
                                           + i * mask->bias_stride_q + j];
                    mx = fmax(mx, s[j]);
                }
                for (int32_t e = 0; e < dh; e++)
                    o[e] = 0;
                if (mx == -INFINITY)
                    continue;
                double sum = 0;
                for (int32_t j = 0; j < end; j++) {
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

void test_layer_init(test_layer *t, rng *r, int32_t heads, int32_t kv_heads, int32_t head_dim,
                     int32_t q_in, int32_t k_in, int32_t v_in, int32_t out_dim, int with_bias)
{
    memset(t, 0, sizeof *t);
    t->kv_heads = kv_heads ? kv_heads : heads;
    t->k_in = k_in ? k_in : q_in;
    t->v_in = v_in ? v_in : t->k_in;
    const int32_t nq = heads * head_dim, nkv = t->kv_heads * head_dim;
    float bq = 1.0f / sqrtf((float)q_in), bk = 1.0f / sqrtf((float)t->k_in);
    float bv = 1.0f / sqrtf((float)t->v_in), bo = 1.0f / sqrtf((float)nq);
    t->w_q = rand_floats(r, (int64_t)nq * q_in, -bq, bq);
    t->w_k = rand_floats(r, (int64_t)nkv * t->k_in, -bk, bk);
    t->w_v = rand_floats(r, (int64_t)nkv * t->v_in, -bv, bv);
    if (with_bias) {
        t->b_q = rand_floats(r, nq, -bq, bq);
        t->b_k = rand_floats(r, nkv, -bk, bk);
        t->b_v = rand_floats(r, nkv, -bv, bv);
    }
    if (out_dim > 0) {
        t->w_o = rand_floats(r, (int64_t)out_dim * nq, -bo, bo);
        if (with_bias)
            t->b_o = rand_floats(r, out_dim, -bo, bo);
    }
    t->desc = (mha_layer_desc){.heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                               .q_in = q_in, .k_in = k_in, .v_in = v_in, .out_dim = out_dim,
                               .w_q = t->w_q, .w_k = t->w_k, .w_v = t->w_v, .b_q = t->b_q,
                               .b_k = t->b_k, .b_v = t->b_v, .w_o = t->w_o, .b_o = t->b_o};
    if (mha_layer_create(&t->desc, &t->layer) != MHA_OK) {
        fprintf(stderr, "test: mha_layer_create failed\n");
        exit(1);
    }
}

void test_layer_free(test_layer *t)
{
    mha_layer_destroy(t->layer);
    free(t->w_q);
    free(t->w_k);
    free(t->w_v);
    free(t->b_q);
    free(t->b_k);
    free(t->b_v);
    free(t->w_o);
    free(t->b_o);
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

void ref_layer(const test_layer *t, const float *query, const float *key, const float *value,
               int32_t batch, int32_t seq_q, int32_t seq_kv, const mha_mask *mask, double *out)
{
    const mha_layer_desc *d = &t->desc;
    const int32_t H = d->heads, Hkv = t->kv_heads, dh = d->head_dim;
    const int64_t Mq = (int64_t)batch * seq_q, Mkv = (int64_t)batch * seq_kv;
    double *yq = xmalloc((size_t)Mq * H * dh * sizeof(double));
    double *yk = xmalloc((size_t)Mkv * Hkv * dh * sizeof(double));
    double *yv = xmalloc((size_t)Mkv * Hkv * dh * sizeof(double));
    linear(query, Mq, d->q_in, t->w_q, t->b_q, H * dh, yq);
    linear(key, Mkv, t->k_in, t->w_k, t->b_k, Hkv * dh, yk);
    linear(value, Mkv, t->v_in, t->w_v, t->b_v, Hkv * dh, yv);
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
        linear(mf, Mq, H * dh, t->w_o, t->b_o, d->out_dim, out);
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
