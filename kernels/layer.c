/* The layer object: weights packed once (repacked on first use for an ISA of
 * another panel width), and the calls that run it: the QKV projection, the
 * forward pass and the decoder step (their memory comes from workspace.c). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"


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

const packed_weights *mha_layer_packed(const mha_layer *layer, int32_t nr)
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

mha_status mha_qkv_project(const mha_layer *layer, const float *query, const float *key,
                           const float *value, int32_t batch, int32_t seq_q, int32_t seq_kv,
                           float *q, float *k, float *v)
{
    if (!layer || !query || !key || !value || !q || !k || !v)
        return MHA_ERR_ARG;
    fwd_sizes s;
    mha_status st = mha_forward_sizes(layer, batch, seq_q, seq_kv, &s);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt = mha_kernels_active();
    const packed_weights *pw = mha_layer_packed(layer, kt->gemm_nr);
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
    mha_status st = mha_forward_sizes(layer, batch, seq_q, seq_kv, &s);
    if (st != MHA_OK)
        return st;
    st = mha_check_mask(mask, batch, layer->heads, seq_q, seq_kv);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt;
    const packed_weights *pw;
    workspace_parts w;
    st = mha_layer_begin(layer, workspace, workspace_size, mha_workspace_bytes(&s, 0), &s, &kt, &pw, &w);
    if (st != MHA_OK)
        return st;

    const int32_t dk = layer->head_dim, dv = layer->v_dim, H = layer->heads, Hkv = layer->kv_heads;
    const int64_t f = sizeof(float);
    const mha_attn_args a = {
        .batch = batch, .heads = H, .kv_heads = Hkv, .seq_q = seq_q,
        .seq_kv = seq_kv, .dk = dk, .dv = dv, .q = w.q, .k = w.k, .v = w.v,
        .q_st = {(int64_t)H * seq_q * dk, (int64_t)seq_q * dk, dk},
        .k_stride_b = f * Hkv * seq_kv * dk, .k_stride_h = f * seq_kv * dk,
        .k_stride_s = f * dk, .v_stride_b = f * Hkv * seq_kv * dv,
        .v_stride_h = f * seq_kv * dv, .v_stride_s = f * dv,
        .scale = 1.0f / sqrtf((float)dk), .mask = mask,
        .out = layer->out_dim > 0 ? w.merged : out,
        .out_st = {(int64_t)seq_q * H * dv, dv, (int64_t)H * dv}, /* merged heads */
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

/* Do the K and V rows of the cache lie in disjoint address ranges? */
static int cache_sides_disjoint(const mha_kv_cache *c)
{
    const int64_t es = mha_dtype_block_bytes(c->dtype);
    const int64_t k_end = (c->batch - 1) * c->stride_b + (c->kv_heads - 1) * c->stride_h
                          + (int64_t)(c->capacity - 1) * c->stride_s + c->head_dim;
    const int64_t v_end = (c->batch - 1) * c->v_stride_b + (c->kv_heads - 1) * c->v_stride_h
                          + (int64_t)(c->capacity - 1) * c->v_stride_s + c->v_head_dim;
    const char *k = c->k, *v = c->v;
    return k + k_end * es <= v || v + v_end * es <= k;
}

/* Can the GEMM's epilogue write the step's K and V rows into the cache itself? When
   every sequence appends at the same row of contiguous rows, K and V do not share
   memory, and the rows are f32, or 16-bit rounded once from a single k block. */
static int step_direct(const mha_kernels *kt, const mha_layer *L, const mha_kv_cache *c,
                       int same_lens)
{
    return same_lens && !c->block_table && cache_sides_disjoint(c)
           && (c->dtype == MHA_F32
               || ((c->dtype == MHA_F16 || c->dtype == MHA_BF16) && L->q_in <= kt->gemm_kc_max));
}

mha_status mha_layer_step(const mha_layer *layer, const float *x, int32_t seq_q,
                          const mha_kv_cache *cache, int32_t *lens, const mha_mask *mask,
                          float *out, void *workspace, size_t workspace_size)
{
    if (!layer || !x || !lens || !out)
        return MHA_ERR_ARG;
    mha_kv_cache c;
    mha_status st = mha_check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    const int32_t B = c.batch, H = layer->heads, Hkv = layer->kv_heads;
    if (c.io_dtype != MHA_F32)
        return MHA_ERR_ARG;
    if (c.kv_heads != Hkv || c.head_dim != layer->head_dim || c.v_head_dim != layer->v_dim
        || layer->k_in != layer->q_in || layer->v_in != layer->q_in || seq_q <= 0
        || seq_q > c.capacity)
        return MHA_ERR_SHAPE;
    fwd_sizes s;
    size_t need;
    st = mha_step_sizes(layer, B, seq_q, &s, &need);
    if (st == MHA_OK)
        st = mha_check_lens(&c, lens, seq_q);
    if (st == MHA_OK && mask && mask->key_lens)
        st = MHA_ERR_MASK;
    if (st == MHA_OK)
        st = mha_check_mask(mask, B, H, seq_q, c.capacity);
    if (st != MHA_OK)
        return st;
    const mha_kernels *kt;
    const packed_weights *pw;
    workspace_parts w;
    st = mha_layer_begin(layer, workspace, workspace_size, need, &s, &kt, &pw, &w);
    if (st != MHA_OK)
        return st;
    int32_t *new_lens = w.extra;
    int same_lens = 1;
    for (int32_t b = 0; b < B; b++) {
        new_lens[b] = lens[b] + seq_q;
        same_lens &= lens[b] == lens[0];
    }
    const mha_strides qs = {(int64_t)H * seq_q * c.head_dim, (int64_t)seq_q * c.head_dim, c.head_dim};
    const mha_strides os = {(int64_t)seq_q * H * c.v_head_dim, c.v_head_dim, (int64_t)H * c.v_head_dim};
    const mha_attn_args a = mha_cached_view(&c, new_lens, w.q, &qs, H, seq_q,
                                            1.0f / sqrtf((float)c.head_dim), mask,
                                            layer->out_dim > 0 ? w.merged : out, &os, NULL);
    mha_attn_plan plan;
    st = mha_attention_prepare(kt, &a, w.arena, s.arena, &plan);
    if (st != MHA_OK) {
        free(w.owned);
        return st;
    }

    /* Nothing can fail from here on. New K and V rows go straight into the cache
       from the GEMM when step_direct says so; else through the workspace, K then V,
       converted by the append. */
    mha_gemm_seg segs[3] = {
        head_major(pw->w_qkv, layer->b_q, w.q, H, seq_q, c.head_dim),
        head_major(pw->w_qkv + pw->off_k, layer->b_k, w.k, Hkv, seq_q, c.head_dim),
        head_major(pw->w_qkv + pw->off_v, layer->b_v, w.v, Hkv, seq_q, c.v_head_dim),
    };
    const int direct = step_direct(kt, layer, &c, same_lens);
    if (direct) {
        const int64_t es = mha_dtype_block_bytes(c.dtype);
        segs[1] = (mha_gemm_seg){.w = segs[1].w, .bias = layer->b_k, .n = segs[1].n,
                                 .dst = (char *)c.k + lens[0] * c.stride_s * es,
                                 .dst_type = c.dtype, .rows = seq_q, .cols = c.head_dim,
                                 .batch_stride = c.stride_b, .row_stride = c.stride_s,
                                 .block_stride = c.stride_h};
        segs[2] = (mha_gemm_seg){.w = segs[2].w, .bias = layer->b_v, .n = segs[2].n,
                                 .dst = (char *)c.v + lens[0] * c.v_stride_s * es,
                                 .dst_type = c.dtype, .rows = seq_q, .cols = c.v_head_dim,
                                 .batch_stride = c.v_stride_b, .row_stride = c.v_stride_s,
                                 .block_stride = c.v_stride_h};
    }
    qkv_gemms(kt, layer, segs, x, x, x, B, seq_q, seq_q);
    if (!direct)
        mha_cache_append(&c, lens, w.k, w.v, seq_q);
    mha_attention_exec(&plan);
    if (layer->out_dim > 0)
        out_projection(kt, layer, pw, w.merged, B, seq_q, out);
    for (int32_t b = 0; b < B; b++)
        lens[b] = new_lens[b];
    free(w.owned);
    return MHA_OK;
}
