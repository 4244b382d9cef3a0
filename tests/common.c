#ifdef _OPENMP
#include <omp.h>
#endif

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

void require_env_isa(void)
{
    const char *env = getenv("MHA_ISA");
    if (!env)
        return;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
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

void test_layer_init(test_layer *t, rng *r, int32_t heads, int32_t kv_heads, int32_t head_dim,
                     int32_t q_in, int32_t k_in, int32_t v_in, int32_t out_dim, int with_bias)
{
    test_layer_init_v(t, r, heads, kv_heads, head_dim, 0, q_in, k_in, v_in, out_dim, with_bias);
}

void test_layer_init_v(test_layer *t, rng *r, int32_t heads, int32_t kv_heads, int32_t head_dim,
                       int32_t v_head_dim, int32_t q_in, int32_t k_in, int32_t v_in,
                       int32_t out_dim, int with_bias)
{
    memset(t, 0, sizeof *t);
    t->kv_heads = kv_heads ? kv_heads : heads;
    t->k_in = k_in ? k_in : q_in;
    t->v_in = v_in ? v_in : t->k_in;
    t->dv = v_head_dim ? v_head_dim : head_dim;
    const int32_t nq = heads * head_dim, nk = t->kv_heads * head_dim, nv = t->kv_heads * t->dv;
    float bq = 1.0f / sqrtf((float)q_in), bk = 1.0f / sqrtf((float)t->k_in);
    float bv = 1.0f / sqrtf((float)t->v_in), bo = 1.0f / sqrtf((float)(heads * t->dv));
    t->w_q = rand_floats(r, (int64_t)nq * q_in, -bq, bq);
    t->w_k = rand_floats(r, (int64_t)nk * t->k_in, -bk, bk);
    t->w_v = rand_floats(r, (int64_t)nv * t->v_in, -bv, bv);
    if (with_bias) {
        t->b_q = rand_floats(r, nq, -bq, bq);
        t->b_k = rand_floats(r, nk, -bk, bk);
        t->b_v = rand_floats(r, nv, -bv, bv);
    }
    if (out_dim > 0) {
        t->w_o = rand_floats(r, (int64_t)out_dim * heads * t->dv, -bo, bo);
        if (with_bias)
            t->b_o = rand_floats(r, out_dim, -bo, bo);
    }
    t->desc = (mha_layer_desc){.heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                               .q_in = q_in, .k_in = k_in, .v_in = v_in, .out_dim = out_dim,
                               .w_q = t->w_q, .w_k = t->w_k, .w_v = t->w_v, .b_q = t->b_q,
                               .b_k = t->b_k, .b_v = t->b_v, .w_o = t->w_o, .b_o = t->b_o,
                               .v_head_dim = v_head_dim};
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

const char *cache_kind_name(cache_kind kind)
{
    static const char *const names[CACHE_KINDS] = {"bhsd", "bshd", "latent", "padded"};
    return names[kind];
}

int test_cache_init(test_cache *t, cache_kind kind, int32_t batch, int32_t kv_heads,
                    int32_t head_dim, int32_t v_head_dim, int32_t capacity)
{
    const int32_t dk = head_dim, dv = v_head_dim ? v_head_dim : head_dim;
    if (kind == CACHE_LATENT && dv > dk)
        return 0;
    memset(t, 0, sizeof *t);
    mha_kv_cache *c = &t->c;
    *c = (mha_kv_cache){.batch = batch, .kv_heads = kv_heads, .head_dim = dk,
                        .capacity = capacity, .v_head_dim = v_head_dim};
    const int64_t rows = (int64_t)batch * kv_heads * capacity;
    int64_t kw = dk, vw = dv; /* floats per row of each allocation */
    switch (kind) {
    case CACHE_BHSD:
    case CACHE_LATENT:
        c->stride_b = (int64_t)kv_heads * capacity * dk, c->stride_h = (int64_t)capacity * dk;
        c->stride_s = dk;
        c->v_stride_b = (int64_t)kv_heads * capacity * dv, c->v_stride_h = (int64_t)capacity * dv;
        c->v_stride_s = dv;
        if (kind == CACHE_LATENT) {
            c->v_stride_b = c->stride_b, c->v_stride_h = c->stride_h, c->v_stride_s = c->stride_s;
            vw = 0;
        }
        break;
    case CACHE_BSHD:
        c->stride_b = (int64_t)capacity * kv_heads * dk, c->stride_h = dk;
        c->stride_s = (int64_t)kv_heads * dk;
        c->v_stride_b = (int64_t)capacity * kv_heads * dv, c->v_stride_h = dv;
        c->v_stride_s = (int64_t)kv_heads * dv;
        break;
    default: /* CACHE_PADDED */
        kw = vw = (dk > dv ? dk : dv) + 3;
        c->stride_b = (int64_t)kv_heads * capacity * kw, c->stride_h = (int64_t)capacity * kw;
        c->stride_s = kw;
        break;
    }
    t->kn = (size_t)(rows * kw) + 2 * CACHE_GUARD;
    t->kbuf = xmalloc(t->kn * sizeof(float));
    memset(t->kbuf, CACHE_FILL, t->kn * sizeof(float));
    c->k = t->kbuf + CACHE_GUARD;
    if (vw) {
        t->vn = (size_t)(rows * vw) + 2 * CACHE_GUARD;
        t->vbuf = xmalloc(t->vn * sizeof(float));
        memset(t->vbuf, CACHE_FILL, t->vn * sizeof(float));
        c->v = t->vbuf + CACHE_GUARD;
    } else {
        t->vbuf = t->kbuf, t->vn = t->kn;
        c->v = c->k;
    }
    return 1;
}

float *cache_k_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j)
{
    return c->k + b * c->stride_b + g * c->stride_h + j * c->stride_s;
}

float *cache_v_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j)
{
    if (c->v_stride_b == 0 && c->v_stride_h == 0 && c->v_stride_s == 0)
        return c->v + b * c->stride_b + g * c->stride_h + j * c->stride_s;
    return c->v + b * c->v_stride_b + g * c->v_stride_h + j * c->v_stride_s;
}

void test_cache_fill(test_cache *t, rng *r, const int32_t *lens)
{
    const mha_kv_cache *c = &t->c;
    const int32_t dv = c->v_head_dim ? c->v_head_dim : c->head_dim;
    for (int32_t b = 0; b < c->batch; b++)
        for (int32_t g = 0; g < c->kv_heads; g++)
            for (int32_t j = 0; j < lens[b]; j++) {
                float *kr = cache_k_row(c, b, g, j), *vr = cache_v_row(c, b, g, j);
                for (int32_t e = 0; e < c->head_dim; e++)
                    kr[e] = rng_uniform(r, -1, 1);
                for (int32_t e = 0; e < dv; e++)
                    vr[e] = rng_uniform(r, -1, 1);
            }
}

void test_cache_free(test_cache *t)
{
    if (t->vbuf != t->kbuf)
        free(t->vbuf);
    free(t->kbuf);
}

void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}
