#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "guard.h"

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
    return test_cache_init_as(t, kind, MHA_F32, MHA_F32, 0, batch, kv_heads, head_dim, v_head_dim,
                              capacity, NULL);
}

/* A side's allocation: CACHE_GUARD floats, `units` units of the type, CACHE_GUARD floats. */
static float *side_alloc(size_t *floats, int64_t units, int64_t unit_bytes, void **start)
{
    *floats = (size_t)((units * unit_bytes + 3) / 4) + 2 * CACHE_GUARD;
    float *buf = xmalloc(*floats * sizeof(float));
    memset(buf, CACHE_FILL, *floats * sizeof(float));
    *start = buf + CACHE_GUARD;
    return buf;
}

int test_cache_init_as(test_cache *t, cache_kind kind, mha_dtype dtype, mha_dtype io_dtype,
                       int32_t block_size, int32_t batch, int32_t kv_heads, int32_t head_dim,
                       int32_t v_head_dim, int32_t capacity, rng *r)
{
    const int32_t dk = head_dim, dv = v_head_dim ? v_head_dim : head_dim;
    const int32_t per = mha_dtype_block_values(dtype);
    if ((kind == CACHE_LATENT && dv > dk) || dk % per || dv % per
        || (block_size > 0 && capacity % block_size))
        return 0;
    memset(t, 0, sizeof *t);
    mha_kv_cache *c = &t->c;
    *c = (mha_kv_cache){.batch = batch, .kv_heads = kv_heads, .head_dim = dk,
                        .capacity = capacity, .v_head_dim = v_head_dim, .dtype = dtype,
                        .io_dtype = io_dtype};
    /* Rows of a sequence, or of a block; sequences, or pool blocks (shuffled, with
       two spare ones that no entry names). */
    const int32_t rows = block_size > 0 ? block_size : capacity;
    const int32_t seqs = block_size > 0 ? batch * (capacity / block_size) + 2 : batch;
    const int64_t all = (int64_t)seqs * kv_heads * rows;
    const int32_t uk = dk / per, uv = dv / per; /* units per row */
    int64_t kw = uk, vw = uv;                  /* units per row of each allocation */
    switch (kind) {
    case CACHE_BHSD:
    case CACHE_LATENT:
        c->stride_b = (int64_t)kv_heads * rows * uk, c->stride_h = (int64_t)rows * uk;
        c->stride_s = uk;
        c->v_stride_b = (int64_t)kv_heads * rows * uv, c->v_stride_h = (int64_t)rows * uv;
        c->v_stride_s = uv;
        if (kind == CACHE_LATENT) {
            c->v_stride_b = c->stride_b, c->v_stride_h = c->stride_h, c->v_stride_s = c->stride_s;
            vw = 0;
        }
        break;
    case CACHE_BSHD:
        c->stride_b = (int64_t)rows * kv_heads * uk, c->stride_h = uk;
        c->stride_s = (int64_t)kv_heads * uk;
        c->v_stride_b = (int64_t)rows * kv_heads * uv, c->v_stride_h = uv;
        c->v_stride_s = (int64_t)kv_heads * uv;
        break;
    default: /* CACHE_PADDED */
        kw = vw = (uk > uv ? uk : uv) + 3;
        c->stride_b = (int64_t)kv_heads * rows * kw, c->stride_h = (int64_t)rows * kw;
        c->stride_s = kw;
        break;
    }
    const int64_t ub = mha_dtype_block_bytes(dtype);
    t->kbuf = side_alloc(&t->kn, all * kw, ub, &c->k);
    if (vw) {
        t->vbuf = side_alloc(&t->vn, all * vw, ub, &c->v);
    } else {
        t->vbuf = t->kbuf, t->vn = t->kn;
        c->v = c->k;
    }
    if (block_size > 0) {
        const int32_t per_seq = capacity / block_size;
        int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)seqs);
        for (int32_t i = 0; i < seqs; i++)
            perm[i] = i;
        for (int32_t i = seqs - 1; r && i > 0; i--) {
            const int32_t k = (int32_t)rng_uniform(r, 0.0f, (float)i + 0.999f), tmp = perm[i];
            perm[i] = perm[k], perm[k] = tmp;
        }
        t->table = xmalloc(sizeof(int32_t) * (size_t)(batch * per_seq));
        memcpy(t->table, perm, sizeof(int32_t) * (size_t)(batch * per_seq));
        free(perm);
        c->block_table = t->table, c->block_size = block_size, c->max_blocks = per_seq;
        c->num_blocks = seqs;
    }
    return 1;
}

/* Row j of sequence b, kv head g of one side, through the table of a paged cache. */
static void *side_row(const mha_kv_cache *c, void *base, int64_t sb, int64_t sh, int64_t ss,
                      int32_t b, int32_t g, int32_t j)
{
    int64_t at = g * sh;
    if (c->block_table)
        at += c->block_table[(int64_t)b * c->max_blocks + j / c->block_size] * sb
              + (int64_t)(j % c->block_size) * ss;
    else
        at += b * sb + (int64_t)j * ss;
    return (char *)base + at * mha_dtype_block_bytes(c->dtype);
}

void *cache_k_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j)
{
    return side_row(c, c->k, c->stride_b, c->stride_h, c->stride_s, b, g, j);
}

void *cache_v_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j)
{
    if (c->v_stride_b == 0 && c->v_stride_h == 0 && c->v_stride_s == 0)
        return side_row(c, c->v, c->stride_b, c->stride_h, c->stride_s, b, g, j);
    return side_row(c, c->v, c->v_stride_b, c->v_stride_h, c->v_stride_s, b, g, j);
}

void test_cache_fill(test_cache *t, rng *r, const int32_t *lens)
{
    const mha_kv_cache *c = &t->c;
    const int32_t dv = c->v_head_dim ? c->v_head_dim : c->head_dim;
    float *x = xmalloc(sizeof(float) * (size_t)(c->head_dim > dv ? c->head_dim : dv));
    for (int32_t b = 0; b < c->batch; b++)
        for (int32_t g = 0; g < c->kv_heads; g++)
            for (int32_t j = 0; j < lens[b]; j++) {
                for (int32_t e = 0; e < c->head_dim; e++)
                    x[e] = rng_uniform(r, -1, 1);
                typed_store(c->dtype, cache_k_row(c, b, g, j), x, c->head_dim);
                for (int32_t e = 0; e < dv; e++)
                    x[e] = rng_uniform(r, -1, 1);
                typed_store(c->dtype, cache_v_row(c, b, g, j), x, dv);
            }
    free(x);
}

void test_cache_free(test_cache *t)
{
    if (t->vbuf != t->kbuf)
        free(t->vbuf);
    free(t->kbuf);
    free(t->table);
}

void typed_store(mha_dtype t, void *dst, const float *x, int32_t d)
{
    for (int32_t e = 0; e < d; e += t == MHA_Q8_0 ? MHA_Q8_BLOCK : 1)
        switch (t) {
        case MHA_F16: ((uint16_t *)dst)[e] = mha_f32_to_f16(x[e]); break;
        case MHA_BF16: ((uint16_t *)dst)[e] = mha_f32_to_bf16(x[e]); break;
        case MHA_Q8_0: mha_quantize_q8_0(x + e, (uint8_t *)dst + e / MHA_Q8_BLOCK * MHA_Q8_BYTES); break;
        default: ((float *)dst)[e] = x[e]; break;
        }
}

const char *typed_row(const typed_rows *tr, int32_t j)
{
    if (!tr->table)
        return tr->mem + (int64_t)j * tr->stride;
    return tr->mem + (int64_t)tr->table[j / tr->block_size] * tr->block_stride
           + (int64_t)(j % tr->block_size) * tr->stride;
}

void typed_rows_init(typed_rows *tr, mha_dtype t, const float *x, int64_t ld, int32_t rows,
                     int32_t d, int32_t pad_units, int32_t block_size, int32_t spare, rng *r)
{
    memset(tr, 0, sizeof *tr);
    tr->t = t, tr->rows = rows, tr->block_size = block_size;
    const int64_t unit = mha_dtype_block_bytes(t);
    tr->stride = mha_row_bytes(t, d) + pad_units * unit;
    int32_t slots = rows; /* rows of storage */
    if (block_size > 0) {
        const int32_t used = (rows + block_size - 1) / block_size;
        tr->nblocks = used + spare;
        tr->block_stride = tr->stride * block_size;
        slots = tr->nblocks * block_size;
        tr->table = xmalloc(sizeof(int32_t) * (size_t)(used ? used : 1));
        int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)tr->nblocks);
        for (int32_t i = 0; i < tr->nblocks; i++)
            perm[i] = i;
        for (int32_t i = tr->nblocks - 1; i > 0; i--) { /* shuffled pool */
            const int32_t k = (int32_t)rng_uniform(r, 0.0f, (float)i + 0.999f), tmp = perm[i];
            perm[i] = perm[k], perm[k] = tmp;
        }
        memcpy(tr->table, perm, sizeof(int32_t) * (size_t)used);
        free(perm);
    }
    /* The last row ends flush against the guard: no padding after it. */
    tr->bytes = (size_t)(slots * tr->stride - pad_units * unit);
    tr->mem = guard_alloc_bytes(tr->bytes, GUARD_AFTER);
    memset(tr->mem, 0xff, tr->bytes); /* NaN in every f32, f16, bf16 and q8_0 scale */
    for (int32_t j = 0; j < rows; j++)
        typed_store(t, (char *)typed_row(tr, j), x + j * ld, d);
}

void typed_rows_free(typed_rows *tr)
{
    guard_free_bytes(tr->mem, tr->bytes, GUARD_AFTER);
    free(tr->table);
}

void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* Runs items of the current job; returns when none is left to take. */
static void pool_work(test_pool *p)
{
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const int64_t i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->lock);
        if (i < 0)
            return;
        p->fn(p->arg, i);
        pthread_mutex_lock(&p->lock);
        if (++p->done == p->n)
            pthread_cond_broadcast(&p->idle);
        pthread_mutex_unlock(&p->lock);
    }
}

static void *pool_thread(void *arg)
{
    test_pool *p = arg;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->quit && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        seen = p->generation;
        const int quit = p->quit;
        pthread_mutex_unlock(&p->lock);
        if (quit)
            return NULL;
        pool_work(p);
    }
}

void test_pool_parallel_for(void *pool, int64_t n, void (*fn)(void *, int64_t), void *arg)
{
    test_pool *p = pool;
    pthread_mutex_lock(&p->job_lock);
    pthread_mutex_lock(&p->lock);
    p->fn = fn, p->arg = arg, p->n = n, p->next = 0, p->done = 0;
    p->generation++;
    p->jobs++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pool_work(p);
    pthread_mutex_lock(&p->lock);
    while (p->done < p->n)
        pthread_cond_wait(&p->idle, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->job_lock);
}

int test_pool_start(test_pool *p, int workers, size_t stack_bytes)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->threads = xmalloc(sizeof(pthread_t) * (size_t)workers);
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, stack_bytes))
        return -1;
    for (; p->workers < workers; p->workers++)
        if (pthread_create(&p->threads[p->workers], &attr, pool_thread, p)) {
            pthread_attr_destroy(&attr);
            test_pool_stop(p);
            return -1;
        }
    pthread_attr_destroy(&attr);
    return 0;
}

void test_pool_stop(test_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->workers; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
}

/* One unit in the last place of r in type t (1 ulp of f32 for f32). */
double typed_ratio(mha_dtype t, const double *a, const double *r, int64_t n, double tol)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(r[i]) || isinf(a[i]) || isinf(r[i])) {
            if (!(isnan(a[i]) && isnan(r[i])) && a[i] != r[i])
                return INFINITY;
            continue;
        }
        const double slack = (t == MHA_F32 ? 0.0 : ref_ulp(t, r[i])) + tol * (1.0 + fabs(r[i]));
        worst = fmax(worst, fabs(a[i] - r[i]) / slack);
    }
    return worst;
}

void *xcalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p)
        abort();
    return p;
}

void *typed_rand(rng *r, mha_dtype t, int64_t n)
{
    float *x = rand_floats(r, n, -1, 1);
    void *y = xcalloc((size_t)mha_row_bytes(t, n));
    typed_store(t, y, x, (int32_t)n);
    free(x);
    return y;
}

double *typed_decode(mha_dtype t, const void *x, int64_t n)
{
    double *d = xcalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = ref_value(t, x, i);
    return d;
}
