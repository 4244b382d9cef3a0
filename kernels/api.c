/* Public entry points: argument checks (all before any write), the layer's
 * packed weights and workspace, and the calls into the drivers. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MHA_ALIGN 64

const char *mha_version(void)
{
    return MHA_VERSION;
}

const char *mha_status_str(mha_status s)
{
    switch (s) {
    case MHA_OK:
        return "success";
    case MHA_ERR_ARG:
        return "invalid argument (NULL pointer, value out of range or workspace too small)";
    case MHA_ERR_SHAPE:
        return "invalid shape (dimension <= 0, heads not dividing, or size overflow)";
    case MHA_ERR_MASK:
        return "invalid mask (length outside [0, seq_kv] or negative stride)";
    case MHA_ERR_UNSUPPORTED:
        return "ISA not built into this library or not supported by this CPU";
    case MHA_ERR_NOMEM:
        return "out of memory";
    }
    return "unknown status";
}

/* The largest count of floats: it and its bytes fit in int64_t, size_t and ptrdiff_t. */
#define COUNT_LIMIT ((int64_t)(PTRDIFF_MAX < INT64_MAX ? PTRDIFF_MAX : INT64_MAX) / 4)

/* *acc *= x for positive factors; 0 when the product leaves [1, COUNT_LIMIT]. */
static int mul_ok(int64_t *acc, int64_t x)
{
    const int64_t limit = COUNT_LIMIT;
    if (x <= 0 || *acc > limit / x)
        return 0;
    *acc *= x;
    return 1;
}

/* Number of floats in a tensor of the given positive dims, or -1 on overflow. */
static int64_t count(int n, const int32_t *dims)
{
    int64_t c = 1;
    for (int i = 0; i < n; i++)
        if (!mul_ok(&c, dims[i]))
            return -1;
    return c;
}

#define COUNT(...) count(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t), (int32_t[]){__VA_ARGS__})

/* dv of a value head: v_head_dim, or dk when it is 0. */
static int32_t value_dim(int32_t v_head_dim, int32_t dk)
{
    return v_head_dim ? v_head_dim : dk;
}

static mha_status check_dims(const mha_attn_dims *d)
{
    if (d->batch <= 0 || d->heads <= 0 || d->kv_heads <= 0 || d->seq_q <= 0 || d->seq_kv <= 0
        || d->head_dim <= 0 || d->v_head_dim < 0 || d->heads % d->kv_heads != 0)
        return MHA_ERR_SHAPE;
    const int32_t dv = value_dim(d->v_head_dim, d->head_dim);
    if (COUNT(d->batch, d->heads, d->seq_q, d->head_dim) < 0
        || COUNT(d->batch, d->heads, d->seq_q, dv) < 0
        || COUNT(d->batch, d->kv_heads, d->seq_kv, d->head_dim) < 0
        || COUNT(d->batch, d->kv_heads, d->seq_kv, dv) < 0
        || COUNT(d->batch, d->seq_q, d->seq_kv) < 0)
        return MHA_ERR_SHAPE;
    return MHA_OK;
}

/* The mask of a call of batch x heads x seq_q rows against keys j < seq_kv. */
static mha_status check_mask(const mha_mask *m, int32_t batch, int32_t heads, int32_t seq_q,
                             int32_t seq_kv)
{
    if (!m)
        return MHA_OK;
    if (m->key_lens)
        for (int32_t b = 0; b < batch; b++)
            if (m->key_lens[b] < 0 || m->key_lens[b] > seq_kv)
                return MHA_ERR_MASK;
    if (m->query_key_lens)
        for (int64_t i = 0; i < (int64_t)batch * seq_q; i++)
            if (m->query_key_lens[i] < 0 || m->query_key_lens[i] > seq_kv)
                return MHA_ERR_MASK;
    if (m->window < 0 || !(m->softcap >= 0.0f) || isinf(m->softcap))
        return MHA_ERR_MASK;
    if (m->bias) {
        if (m->bias_stride_b < 0 || m->bias_stride_h < 0 || m->bias_stride_q < 0)
            return MHA_ERR_MASK;
        /* The largest index read must be representable. */
        const int64_t strides[3] = {m->bias_stride_b, m->bias_stride_h, m->bias_stride_q};
        const int32_t extents[3] = {batch, heads, seq_q};
        int64_t last = seq_kv - 1, term;
        for (int i = 0; i < 3; i++)
            if (__builtin_mul_overflow(strides[i], (int64_t)extents[i] - 1, &term)
                || __builtin_add_overflow(last, term, &last) || last > PTRDIFF_MAX / 4)
                return MHA_ERR_MASK;
    }
    return MHA_OK;
}

mha_status mha_attention(const mha_attn_dims *dims, const float *q, const float *k, const float *v,
                         float scale, const mha_mask *mask, float *out, mha_layout out_layout)
{
    if (!dims || !q || !k || !v || !out)
        return MHA_ERR_ARG;
    if (out_layout != MHA_LAYOUT_BHSD && out_layout != MHA_LAYOUT_BSHD)
        return MHA_ERR_ARG;
    mha_status st = check_dims(dims);
    if (st == MHA_OK)
        st = check_mask(mask, dims->batch, dims->heads, dims->seq_q, dims->seq_kv);
    if (st != MHA_OK)
        return st;
    const int32_t dk = dims->head_dim, dv = value_dim(dims->v_head_dim, dk);
    const int64_t S = dims->seq_kv;
    const mha_attn_args a = {
        .batch = dims->batch, .heads = dims->heads, .kv_heads = dims->kv_heads,
        .seq_q = dims->seq_q, .seq_kv = dims->seq_kv, .dk = dk, .dv = dv,
        .q = q, .k = k, .v = v,
        .k_stride_b = dims->kv_heads * S * dk, .k_stride_h = S * dk, .k_stride_s = dk,
        .v_stride_b = dims->kv_heads * S * dv, .v_stride_h = S * dv, .v_stride_s = dv,
        .scale = scale, .mask = mask, .out = out, .layout = out_layout,
    };
    return mha_attention_run(mha_kernels_active(), &a);
}

/* ---- KV cache ---- */

/* A cache with v_head_dim and the V strides resolved. */
static mha_status check_cache(const mha_kv_cache *c, mha_kv_cache *r)
{
    if (!c || !c->k || !c->v)
        return MHA_ERR_ARG;
    if (c->batch <= 0 || c->kv_heads <= 0 || c->head_dim <= 0 || c->capacity <= 0
        || c->v_head_dim < 0)
        return MHA_ERR_SHAPE;
    *r = *c;
    r->v_head_dim = value_dim(c->v_head_dim, c->head_dim);
    if (!c->v_stride_b && !c->v_stride_h && !c->v_stride_s)
        r->v_stride_b = c->stride_b, r->v_stride_h = c->stride_h, r->v_stride_s = c->stride_s;
    const int64_t strides[2][3] = {{r->stride_b, r->stride_h, r->stride_s},
                                   {r->v_stride_b, r->v_stride_h, r->v_stride_s}};
    const int32_t extents[3] = {c->batch, c->kv_heads, c->capacity};
    for (int t = 0; t < 2; t++) {
        /* The last float of the last row must be representable. */
        int64_t last = t ? r->v_head_dim : r->head_dim, term;
        for (int i = 0; i < 3; i++) {
            if (strides[t][i] < 0)
                return MHA_ERR_ARG;
            if (__builtin_mul_overflow(strides[t][i], (int64_t)extents[i] - 1, &term)
                || __builtin_add_overflow(last, term, &last) || last > COUNT_LIMIT)
                return MHA_ERR_SHAPE;
        }
    }
    return MHA_OK;
}

/* lens[b] + seq_new within [0, capacity] for every b (seq_new 0 for reads). */
static mha_status check_lens(const mha_kv_cache *c, const int32_t *lens, int32_t seq_new)
{
    for (int32_t b = 0; b < c->batch; b++)
        if (lens[b] < 0 || lens[b] > c->capacity - seq_new)
            return MHA_ERR_SHAPE;
    return MHA_OK;
}

/* Rows [B][Hkv][n][width] of src into rows lens[b].. of one side of the cache. */
static void cache_write(const mha_kv_cache *c, const int32_t *lens, float *base, int64_t sb,
                        int64_t sh, int64_t ss, int32_t width, const float *src, int32_t n)
{
    for (int32_t b = 0; b < c->batch; b++)
        for (int32_t g = 0; g < c->kv_heads; g++)
            for (int32_t j = 0; j < n; j++)
                memcpy(base + b * sb + g * sh + (int64_t)(lens[b] + j) * ss,
                       src + (((int64_t)b * c->kv_heads + g) * n + j) * width,
                       (size_t)width * sizeof(float));
}

static void cache_append(const mha_kv_cache *c, const int32_t *lens, const float *k_new,
                         const float *v_new, int32_t n)
{
    cache_write(c, lens, c->k, c->stride_b, c->stride_h, c->stride_s, c->head_dim, k_new, n);
    cache_write(c, lens, c->v, c->v_stride_b, c->v_stride_h, c->v_stride_s, c->v_head_dim, v_new, n);
}

mha_status mha_kv_append(const mha_kv_cache *cache, const int32_t *lens, const float *k_new,
                         const float *v_new, int32_t seq_new)
{
    mha_kv_cache c;
    mha_status st = check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    if (!lens || !k_new || !v_new)
        return MHA_ERR_ARG;
    if (seq_new <= 0 || seq_new > c.capacity)
        return MHA_ERR_SHAPE;
    st = check_lens(&c, lens, seq_new);
    if (st != MHA_OK)
        return st;
    cache_append(&c, lens, k_new, v_new, seq_new);
    return MHA_OK;
}

/* The driver's view of attention over the resolved cache c (arguments checked). */
static mha_attn_args cached_view(const mha_kv_cache *c, const int32_t *lens, const float *q,
                                 int32_t heads, int32_t seq_q, float scale, const mha_mask *mask,
                                 float *out, mha_layout layout, float *lse)
{
    return (mha_attn_args){
        .batch = c->batch, .heads = heads, .kv_heads = c->kv_heads, .seq_q = seq_q,
        .seq_kv = c->capacity, .dk = c->head_dim, .dv = c->v_head_dim, .lens = lens,
        .q = q, .k = c->k, .v = c->v,
        .k_stride_b = c->stride_b, .k_stride_h = c->stride_h, .k_stride_s = c->stride_s,
        .v_stride_b = c->v_stride_b, .v_stride_h = c->v_stride_h, .v_stride_s = c->v_stride_s,
        .scale = scale, .mask = mask, .out = out, .layout = layout, .lse = lse,
    };
}

mha_status mha_attention_cached(const mha_kv_cache *cache, const int32_t *lens, const float *q,
                                int32_t heads, int32_t seq_q, float scale, const mha_mask *mask,
                                float *out, mha_layout out_layout, float *lse)
{
    mha_kv_cache c;
    mha_status st = check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    if (!lens || !q || !out)
        return MHA_ERR_ARG;
    if (out_layout != MHA_LAYOUT_BHSD && out_layout != MHA_LAYOUT_BSHD)
        return MHA_ERR_ARG;
    if (heads <= 0 || seq_q <= 0 || heads % c.kv_heads != 0
        || COUNT(c.batch, heads, seq_q, c.head_dim) < 0
        || COUNT(c.batch, heads, seq_q, c.v_head_dim) < 0)
        return MHA_ERR_SHAPE;
    if (mask && mask->key_lens)
        return MHA_ERR_MASK;
    st = check_mask(mask, c.batch, heads, seq_q, c.capacity);
    if (st == MHA_OK)
        st = check_lens(&c, lens, 0);
    if (st != MHA_OK)
        return st;
    const mha_attn_args a = cached_view(&c, lens, q, heads, seq_q, scale, mask, out, out_layout, lse);
    return mha_attention_run(mha_kernels_active(), &a);
}

static mha_status heads_transpose(float *x, int32_t batch, int32_t seq, int32_t heads,
                                  int32_t head_dim, int split)
{
    if (!x)
        return MHA_ERR_ARG;
    if (batch <= 0 || seq <= 0 || heads <= 0 || head_dim <= 0
        || COUNT(batch, seq, heads, head_dim) < 0)
        return MHA_ERR_SHAPE;
    if (heads == 1 || seq == 1)
        return MHA_OK; /* the permutation is the identity */
    return mha_transpose_run(mha_kernels_active(), x, batch, split ? seq : heads,
                             split ? heads : seq, head_dim);
}

mha_status mha_heads_split(float *x, int32_t batch, int32_t seq, int32_t heads, int32_t head_dim)
{
    return heads_transpose(x, batch, seq, heads, head_dim, 1);
}

mha_status mha_heads_merge(float *x, int32_t batch, int32_t seq, int32_t heads, int32_t head_dim)
{
    return heads_transpose(x, batch, seq, heads, head_dim, 0);
}

/* ---- layer ---- */

/* The weights packed for one panel width nr: Wq, Wk and Wv one after another
   (each padded to whole panels), and Wo (NULL without an output projection). */
typedef struct packed_weights {
    int32_t nr;
    float *w_qkv, *w_o;
    size_t off_k, off_v;
} packed_weights;

/* A layer keeps one packed copy: the one for the ISA active at mha_layer_create
   (pack[0]). A call on an ISA of another gemm_nr (after mha_isa_force) repacks
   pack[0] for that width on first use, under `lock`, and publishes the copy in
   the next free slot; slots are only ever appended, so readers scan them without
   the lock, and copies are freed by mha_layer_destroy alone. ISAs of one gemm_nr
   share a copy, and there are at most MHA_ISA_COUNT widths. */
struct mha_layer {
    int32_t heads, kv_heads, head_dim, v_dim, q_in, k_in, v_in, out_dim;
    float *b_q, *b_k, *b_v, *b_o;
    _Atomic(packed_weights *) pack[MHA_ISA_COUNT];
    pthread_mutex_t lock;
    int lock_ready;
};

static float *copy_floats(const float *src, int64_t n, int *failed)
{
    if (!src)
        return NULL;
    float *dst = malloc((size_t)n * sizeof(float));
    if (!dst) {
        *failed = 1;
        return NULL;
    }
    memcpy(dst, src, (size_t)n * sizeof(float));
    return dst;
}

static void packed_free(packed_weights *p)
{
    if (!p)
        return;
    free(p->w_qkv);
    free(p->w_o);
    free(p);
}

/* Allocates (uninitialised) room for L's weights packed for width nr; NULL when out
   of memory. The sizes were bounded for any nr <= MHA_GEMM_TILE_MAX at create. */
static packed_weights *packed_alloc(const mha_layer *L, int32_t nr)
{
    const int32_t nq = L->heads * L->head_dim, nkv = L->kv_heads * L->head_dim;
    const int32_t nv = L->kv_heads * L->v_dim, no = L->heads * L->v_dim;
    const size_t fq = mha_packed_floats(nq, L->q_in, nr), fk = mha_packed_floats(nkv, L->k_in, nr);
    const size_t fv = mha_packed_floats(nv, L->v_in, nr);
    packed_weights *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nr = nr;
    p->off_k = fq;
    p->off_v = fq + fk;
    p->w_qkv = malloc((fq + fk + fv) * sizeof(float));
    if (L->out_dim > 0)
        p->w_o = malloc(mha_packed_floats(L->out_dim, no, nr) * sizeof(float));
    if (!p->w_qkv || (L->out_dim > 0 && !p->w_o)) {
        packed_free(p);
        return NULL;
    }
    return p;
}

/* Packs L's four weight matrices, each given in panels of nr_src (1: nn.Linear's
   [out][in] itself), into dst's width; w[3] (Wo) is ignored without out_dim. */
static void pack_layer(const mha_layer *L, const float *const w[4], int32_t nr_src,
                       packed_weights *dst)
{
    const int32_t nq = L->heads * L->head_dim, nkv = L->kv_heads * L->head_dim;
    const int32_t nv = L->kv_heads * L->v_dim, no = L->heads * L->v_dim;
    mha_pack_weights(w[0], nq, L->q_in, nr_src, dst->w_qkv, dst->nr);
    mha_pack_weights(w[1], nkv, L->k_in, nr_src, dst->w_qkv + dst->off_k, dst->nr);
    mha_pack_weights(w[2], nv, L->v_in, nr_src, dst->w_qkv + dst->off_v, dst->nr);
    if (L->out_dim > 0)
        mha_pack_weights(w[3], L->out_dim, no, nr_src, dst->w_o, dst->nr);
}

/* L's weights packed for width nr: the published copy, else a repack of pack[0]
   made once under the lock; NULL when that copy cannot be allocated. */
static const packed_weights *layer_packed(const mha_layer *layer, int32_t nr)
{
    mha_layer *L = (mha_layer *)layer; /* allocated mutable by mha_layer_create */
    for (int i = 0; i < MHA_ISA_COUNT; i++) {
        packed_weights *p = atomic_load_explicit(&L->pack[i], memory_order_acquire);
        if (!p)
            break;
        if (p->nr == nr)
            return p;
    }
    const packed_weights *found = NULL;
    pthread_mutex_lock(&L->lock);
    int slot = 0;
    for (; slot < MHA_ISA_COUNT; slot++) {
        packed_weights *p = atomic_load_explicit(&L->pack[slot], memory_order_acquire);
        if (!p || p->nr == nr) {
            found = p;
            break;
        }
    }
    if (!found && slot < MHA_ISA_COUNT) {
        const packed_weights *src = atomic_load_explicit(&L->pack[0], memory_order_acquire);
        packed_weights *p = packed_alloc(L, nr);
        if (p) {
            const float *const w[4] = {src->w_qkv, src->w_qkv + src->off_k,
                                       src->w_qkv + src->off_v, src->w_o};
            pack_layer(L, w, src->nr, p);
            atomic_store_explicit(&L->pack[slot], p, memory_order_release);
            found = p;
        }
    }
    pthread_mutex_unlock(&L->lock);
    return found;
}

void mha_layer_destroy(mha_layer *layer)
{
    if (!layer)
        return;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        packed_free(atomic_load_explicit(&layer->pack[i], memory_order_relaxed));
    if (layer->lock_ready)
        pthread_mutex_destroy(&layer->lock);
    free(layer->b_q);
    free(layer->b_k);
    free(layer->b_v);
    free(layer->b_o);
    free(layer);
}

/* Floats of W [n][k] packed for the widest panels a table may have (n < INT32_MAX / 64),
   an upper bound for every gemm_nr; -1 on overflow. */
static int64_t packed_count_max(int32_t n, int32_t k)
{
    const int32_t nr = MHA_GEMM_TILE_MAX;
    return COUNT((n + nr - 1) / nr, nr, k);
}

mha_status mha_layer_create(const mha_layer_desc *desc, mha_layer **out)
{
    if (!desc || !out || !desc->w_q || !desc->w_k || !desc->w_v)
        return MHA_ERR_ARG;
    const int32_t heads = desc->heads, dh = desc->head_dim, out_dim = desc->out_dim;
    const int32_t dv = value_dim(desc->v_head_dim, dh);
    const int32_t kv_heads = desc->kv_heads ? desc->kv_heads : heads;
    const int32_t q_in = desc->q_in, k_in = desc->k_in ? desc->k_in : q_in;
    const int32_t v_in = desc->v_in ? desc->v_in : k_in;
    if (heads <= 0 || kv_heads <= 0 || dh <= 0 || dv <= 0 || q_in <= 0 || k_in <= 0 || v_in <= 0
        || out_dim < 0 || desc->kv_heads < 0 || desc->k_in < 0 || desc->v_in < 0
        || heads % kv_heads != 0)
        return MHA_ERR_SHAPE;
    if (out_dim > 0 && !desc->w_o)
        return MHA_ERR_ARG;
    /* Every product is checked before it is formed. Widths stay int32 even when
       padded to whole panels, and the packed sizes fit for any panel width. */
    const int64_t padded[4] = {COUNT(heads, dh, 64), COUNT(kv_heads, dh, 64),
                               COUNT(kv_heads, dv, 64), COUNT(heads, dv, 64)};
    for (int i = 0; i < 4; i++)
        if (padded[i] < 0 || padded[i] > INT32_MAX)
            return MHA_ERR_SHAPE;
    if (COUNT(out_dim > 0 ? out_dim : 1, 64) > INT32_MAX)
        return MHA_ERR_SHAPE;
    const int32_t nq = heads * dh, nkv = kv_heads * dh, nv = kv_heads * dv, no = heads * dv;
    const int64_t pq = packed_count_max(nq, q_in), pk = packed_count_max(nkv, k_in);
    const int64_t pv = packed_count_max(nv, v_in);
    if (pq < 0 || pk < 0 || pv < 0 || pq > COUNT_LIMIT - pk - pv
        || (out_dim > 0 && packed_count_max(out_dim, no) < 0))
        return MHA_ERR_SHAPE;

    mha_layer *L = calloc(1, sizeof *L);
    if (!L)
        return MHA_ERR_NOMEM;
    L->heads = heads, L->kv_heads = kv_heads, L->head_dim = dh, L->v_dim = dv, L->q_in = q_in;
    L->k_in = k_in, L->v_in = v_in, L->out_dim = out_dim;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        atomic_init(&L->pack[i], NULL);
    int failed = pthread_mutex_init(&L->lock, NULL) != 0;
    L->lock_ready = !failed;
    L->b_q = copy_floats(desc->b_q, nq, &failed);
    L->b_k = copy_floats(desc->b_k, nkv, &failed);
    L->b_v = copy_floats(desc->b_v, nv, &failed);
    if (out_dim > 0)
        L->b_o = copy_floats(desc->b_o, out_dim, &failed);

    packed_weights *p = failed ? NULL : packed_alloc(L, mha_kernels_active()->gemm_nr);
    if (!p) {
        mha_layer_destroy(L);
        return MHA_ERR_NOMEM;
    }
    const float *const w[4] = {desc->w_q, desc->w_k, desc->w_v, desc->w_o};
    pack_layer(L, w, 1, p);
    atomic_store_explicit(&L->pack[0], p, memory_order_release);
    *out = L;
    return MHA_OK;
}

/* Head-major destination [B][heads][seq][dh] of a projection. */
static mha_gemm_seg head_major(const float *w, const float *bias, float *dst, int32_t heads,
                               int32_t seq, int32_t dh)
{
    return (mha_gemm_seg){.w = w, .bias = bias, .n = heads * dh, .dst = dst, .rows = seq,
                          .cols = dh, .batch_stride = (int64_t)heads * seq * dh,
                          .row_stride = dh, .block_stride = (int64_t)seq * dh};
}

/* The Q, K and V projections into segs (Q, K, V destinations): one GEMM over the
   packed [Wq;Wk;Wv] for self-attention, K and V fused when value == key. */
static void qkv_gemms(const mha_kernels *kt, const mha_layer *L, const mha_gemm_seg segs[3],
                      const float *query, const float *key, const float *value, int32_t batch,
                      int32_t seq_q, int32_t seq_kv)
{
    const int kv_fused = value == key && L->k_in == L->v_in;
    if (kv_fused && key == query && L->q_in == L->k_in && seq_q == seq_kv) {
        mha_gemm_run(kt, (int64_t)batch * seq_q, L->q_in, query, L->q_in, segs, 3);
        return;
    }
    mha_gemm_run(kt, (int64_t)batch * seq_q, L->q_in, query, L->q_in, segs, 1);
    if (kv_fused) {
        mha_gemm_run(kt, (int64_t)batch * seq_kv, L->k_in, key, L->k_in, segs + 1, 2);
    } else {
        mha_gemm_run(kt, (int64_t)batch * seq_kv, L->k_in, key, L->k_in, segs + 1, 1);
        mha_gemm_run(kt, (int64_t)batch * seq_kv, L->v_in, value, L->v_in, segs + 2, 1);
    }
}

/* pw: L's weights packed for kt->gemm_nr; q, k, v head-major. */
static void qkv_run(const mha_kernels *kt, const mha_layer *L, const packed_weights *pw,
                    const float *query, const float *key, const float *value, int32_t batch,
                    int32_t seq_q, int32_t seq_kv, float *q, float *k, float *v)
{
    const mha_gemm_seg segs[3] = {
        head_major(pw->w_qkv, L->b_q, q, L->heads, seq_q, L->head_dim),
        head_major(pw->w_qkv + pw->off_k, L->b_k, k, L->kv_heads, seq_kv, L->head_dim),
        head_major(pw->w_qkv + pw->off_v, L->b_v, v, L->kv_heads, seq_kv, L->v_dim),
    };
    qkv_gemms(kt, L, segs, query, key, value, batch, seq_q, seq_kv);
}

/* Float counts of a forward pass's intermediates, or 0 on a bad shape. */
typedef struct fwd_sizes {
    int64_t q, k, v, merged;
    size_t arena; /* the attention's memory (mha_attention_arena_bytes) */
} fwd_sizes;

static mha_status forward_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, int32_t seq_kv,
                                fwd_sizes *s)
{
    if (batch <= 0 || seq_q <= 0 || seq_kv <= 0)
        return MHA_ERR_SHAPE;
    s->q = COUNT(batch, seq_q, L->heads, L->head_dim);
    s->k = COUNT(batch, seq_kv, L->kv_heads, L->head_dim);
    s->v = COUNT(batch, seq_kv, L->kv_heads, L->v_dim);
    const int64_t merged = COUNT(batch, seq_q, L->heads, L->v_dim);
    s->merged = L->out_dim > 0 ? merged : 0;
    if (s->q < 0 || s->k < 0 || s->v < 0 || merged < 0
        || COUNT(batch, seq_q, L->out_dim > 0 ? L->out_dim : 1) < 0
        || COUNT(batch, seq_q, L->q_in) < 0 || COUNT(batch, seq_kv, L->k_in) < 0
        || COUNT(batch, seq_kv, L->v_in) < 0 || COUNT(batch, seq_q, seq_kv) < 0)
        return MHA_ERR_SHAPE;
    s->arena = mha_attention_arena_bytes(batch, L->heads, L->kv_heads, seq_q, L->v_dim);
    return MHA_OK;
}

static size_t aligned_bytes(int64_t floats)
{
    return ((size_t)floats * sizeof(float) + MHA_ALIGN - 1) / MHA_ALIGN * MHA_ALIGN;
}

/* The workspace: q, k, v, merged and the attention's arena one after another,
   64-byte aligned, plus `extra` bytes after them. */
static size_t workspace_bytes(const fwd_sizes *s, size_t extra)
{
    return MHA_ALIGN + aligned_bytes(s->q) + aligned_bytes(s->k) + aligned_bytes(s->v)
           + aligned_bytes(s->merged) + s->arena + extra;
}

typedef struct workspace_parts {
    float *q, *k, *v, *merged;
    void *arena, *extra;
    void *owned; /* allocated by the call, else NULL */
} workspace_parts;

/* Carves the caller's workspace, or allocates `need` bytes when it is NULL. */
static mha_status workspace_take(void *workspace, size_t need, const fwd_sizes *s,
                                 workspace_parts *w)
{
    w->owned = NULL;
    if (!workspace) {
        w->owned = workspace = malloc(need);
        if (!workspace)
            return MHA_ERR_NOMEM;
    }
    char *base = (char *)(((uintptr_t)workspace + MHA_ALIGN - 1) & ~(uintptr_t)(MHA_ALIGN - 1));
    w->q = (float *)base;
    w->k = (float *)(base += aligned_bytes(s->q));
    w->v = (float *)(base += aligned_bytes(s->k));
    w->merged = (float *)(base += aligned_bytes(s->v));
    w->arena = base += aligned_bytes(s->merged);
    w->extra = base + s->arena;
    return MHA_OK;
}

/* What a layer call needs before it writes anything, in this order: a workspace of
   `need` bytes if the caller gives one (MHA_ERR_ARG), the weights packed for this
   call's ISA (repacking may fail), the workspace allocated when none is given. */
static mha_status layer_begin(const mha_layer *layer, void *workspace, size_t workspace_size,
                              size_t need, const fwd_sizes *s, const mha_kernels **kt,
                              const packed_weights **pw, workspace_parts *w)
{
    if (workspace && workspace_size < need)
        return MHA_ERR_ARG;
    *kt = mha_kernels_active();
    *pw = layer_packed(layer, (*kt)->gemm_nr);
    if (!*pw)
        return MHA_ERR_NOMEM;
    return workspace_take(workspace, need, s, w);
}

size_t mha_layer_workspace_size(const mha_layer *layer, int32_t batch, int32_t seq_q,
                                int32_t seq_kv)
{
    fwd_sizes s;
    if (!layer || forward_sizes(layer, batch, seq_q, seq_kv, &s) != MHA_OK)
        return 0;
    return workspace_bytes(&s, 0);
}

mha_status mha_qkv_project(const mha_layer *layer, const float *query, const float *key,
                           const float *value, int32_t batch, int32_t seq_q, int32_t seq_kv,
                           float *q, float *k, float *v)
{
    if (!layer || !query || !key || !value || !q || !k || !v)
        return MHA_ERR_ARG;
    fwd_sizes s;
    mha_status st = forward_sizes(layer, batch, seq_q, seq_kv, &s);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt = mha_kernels_active();
    const packed_weights *pw = layer_packed(layer, kt->gemm_nr);
    if (!pw)
        return MHA_ERR_NOMEM;
    qkv_run(kt, layer, pw, query, key, value, batch, seq_q, seq_kv, q, k, v);
    return MHA_OK;
}

/* out = merged Wo^T + bo, merged being [batch*seq][heads*dv]. */
static void out_projection(const mha_kernels *kt, const mha_layer *L, const packed_weights *pw,
                           const float *merged, int32_t batch, int32_t seq, float *out)
{
    const int32_t no = L->heads * L->v_dim;
    const mha_gemm_seg seg = {.w = pw->w_o, .bias = L->b_o, .n = L->out_dim, .dst = out,
                              .rows = seq, .cols = L->out_dim,
                              .batch_stride = (int64_t)seq * L->out_dim,
                              .row_stride = L->out_dim};
    mha_gemm_run(kt, (int64_t)batch * seq, no, merged, no, &seg, 1);
}

mha_status mha_layer_forward(const mha_layer *layer, const float *query, const float *key,
                             const float *value, int32_t batch, int32_t seq_q, int32_t seq_kv,
                             const mha_mask *mask, float *out, void *workspace,
                             size_t workspace_size)
{
    if (!layer || !query || !key || !value || !out)
        return MHA_ERR_ARG;
    fwd_sizes s;
    mha_status st = forward_sizes(layer, batch, seq_q, seq_kv, &s);
    if (st != MHA_OK)
        return st;
    st = check_mask(mask, batch, layer->heads, seq_q, seq_kv);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt;
    const packed_weights *pw;
    workspace_parts w;
    st = layer_begin(layer, workspace, workspace_size, workspace_bytes(&s, 0), &s, &kt, &pw, &w);
    if (st != MHA_OK)
        return st;

    const int32_t dk = layer->head_dim, dv = layer->v_dim, Hkv = layer->kv_heads;
    const mha_attn_args a = {
        .batch = batch, .heads = layer->heads, .kv_heads = Hkv, .seq_q = seq_q,
        .seq_kv = seq_kv, .dk = dk, .dv = dv, .q = w.q, .k = w.k, .v = w.v,
        .k_stride_b = (int64_t)Hkv * seq_kv * dk, .k_stride_h = (int64_t)seq_kv * dk,
        .k_stride_s = dk, .v_stride_b = (int64_t)Hkv * seq_kv * dv,
        .v_stride_h = (int64_t)seq_kv * dv, .v_stride_s = dv,
        .scale = 1.0f / sqrtf((float)dk), .mask = mask,
        .out = layer->out_dim > 0 ? w.merged : out, .layout = MHA_LAYOUT_BSHD,
    };
    mha_attn_plan plan;
    st = mha_attention_prepare(kt, &a, w.arena, s.arena, &plan);
    if (st == MHA_OK) {
        qkv_run(kt, layer, pw, query, key, value, batch, seq_q, seq_kv, w.q, w.k, w.v);
        mha_attention_exec(&plan);
        if (layer->out_dim > 0)
            out_projection(kt, layer, pw, w.merged, batch, seq_q, out);
    }
    free(w.owned);
    return st;
}

/* ---- decoder step ---- */

/* Do the K and V rows of the cache lie in disjoint address ranges? */
static int cache_sides_disjoint(const mha_kv_cache *c)
{
    const int64_t k_end = (c->batch - 1) * c->stride_b + (c->kv_heads - 1) * c->stride_h
                          + (int64_t)(c->capacity - 1) * c->stride_s + c->head_dim;
    const int64_t v_end = (c->batch - 1) * c->v_stride_b + (c->kv_heads - 1) * c->v_stride_h
                          + (int64_t)(c->capacity - 1) * c->v_stride_s + c->v_head_dim;
    return c->k + k_end <= c->v || c->v + v_end <= c->k;
}

/* A step's intermediates: the forward pass's with seq_kv = seq_q, plus the new lens. */
static mha_status step_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, fwd_sizes *s,
                             size_t *bytes)
{
    mha_status st = forward_sizes(L, batch, seq_q, seq_q, s);
    if (st != MHA_OK)
        return st;
    *bytes = workspace_bytes(s, (size_t)batch * sizeof(int32_t));
    return MHA_OK;
}

size_t mha_layer_step_workspace_size(const mha_layer *layer, int32_t batch, int32_t seq_q)
{
    fwd_sizes s;
    size_t bytes;
    if (!layer || step_sizes(layer, batch, seq_q, &s, &bytes) != MHA_OK)
        return 0;
    return bytes;
}

mha_status mha_layer_step(const mha_layer *layer, const float *x, int32_t seq_q,
                          const mha_kv_cache *cache, int32_t *lens, const mha_mask *mask,
                          float *out, void *workspace, size_t workspace_size)
{
    if (!layer || !x || !lens || !out)
        return MHA_ERR_ARG;
    mha_kv_cache c;
    mha_status st = check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    const int32_t B = c.batch, H = layer->heads, Hkv = layer->kv_heads;
    if (c.kv_heads != Hkv || c.head_dim != layer->head_dim || c.v_head_dim != layer->v_dim
        || layer->k_in != layer->q_in || layer->v_in != layer->q_in || seq_q <= 0
        || seq_q > c.capacity)
        return MHA_ERR_SHAPE;
    fwd_sizes s;
    size_t need;
    st = step_sizes(layer, B, seq_q, &s, &need);
    if (st == MHA_OK)
        st = check_lens(&c, lens, seq_q);
    if (st == MHA_OK && mask && mask->key_lens)
        st = MHA_ERR_MASK;
    if (st == MHA_OK)
        st = check_mask(mask, B, H, seq_q, c.capacity);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt;
    const packed_weights *pw;
    workspace_parts w;
    st = layer_begin(layer, workspace, workspace_size, need, &s, &kt, &pw, &w);
    if (st != MHA_OK)
        return st;
    int32_t *new_lens = w.extra;
    int same_lens = 1;
    for (int32_t b = 0; b < B; b++) {
        new_lens[b] = lens[b] + seq_q;
        same_lens &= lens[b] == lens[0];
    }
    const mha_attn_args a = cached_view(&c, new_lens, w.q, H, seq_q, 1.0f / sqrtf((float)c.head_dim),
                                        mask, layer->out_dim > 0 ? w.merged : out,
                                        MHA_LAYOUT_BSHD, NULL);
    mha_attn_plan plan;
    st = mha_attention_prepare(kt, &a, w.arena, s.arena, &plan);
    if (st != MHA_OK) {
        free(w.owned);
        return st;
    }

    /* Nothing can fail from here on. New K and V rows go straight into the cache
       from the GEMM when every sequence appends at the same row and K and V do not
       share memory; else through the workspace, K then V. */
    mha_gemm_seg segs[3] = {
        head_major(pw->w_qkv, layer->b_q, w.q, H, seq_q, c.head_dim),
        head_major(pw->w_qkv + pw->off_k, layer->b_k, w.k, Hkv, seq_q, c.head_dim),
        head_major(pw->w_qkv + pw->off_v, layer->b_v, w.v, Hkv, seq_q, c.v_head_dim),
    };
    const int direct = same_lens && cache_sides_disjoint(&c);
    if (direct) {
        segs[1] = (mha_gemm_seg){.w = segs[1].w, .bias = layer->b_k, .n = segs[1].n,
                                 .dst = c.k + lens[0] * c.stride_s, .rows = seq_q,
                                 .cols = c.head_dim, .batch_stride = c.stride_b,
                                 .row_stride = c.stride_s, .block_stride = c.stride_h};
        segs[2] = (mha_gemm_seg){.w = segs[2].w, .bias = layer->b_v, .n = segs[2].n,
                                 .dst = c.v + lens[0] * c.v_stride_s, .rows = seq_q,
                                 .cols = c.v_head_dim, .batch_stride = c.v_stride_b,
                                 .row_stride = c.v_stride_s, .block_stride = c.v_stride_h};
    }
    qkv_gemms(kt, layer, segs, x, x, x, B, seq_q, seq_q);
    if (!direct)
        cache_append(&c, lens, w.k, w.v, seq_q);
    mha_attention_exec(&plan);
    if (layer->out_dim > 0)
        out_projection(kt, layer, pw, w.merged, B, seq_q, out);
    for (int32_t b = 0; b < B; b++)
        lens[b] = new_lens[b];
    free(w.owned);
    return MHA_OK;
}
