/* The entry points of attention, the KV cache and the head transpose: each
 * checks its arguments (api.c), then hands the call to a driver. */
#include <string.h>

#include "api.h"

mha_status mha_attention(const mha_attn_dims *dims, const float *q, const float *k, const float *v,
                         float scale, const mha_mask *mask, float *out, mha_layout out_layout)
{
    if (!dims || !q || !k || !v || !out)
        return MHA_ERR_ARG;
    if (out_layout != MHA_LAYOUT_BHSD && out_layout != MHA_LAYOUT_BSHD)
        return MHA_ERR_ARG;
    mha_status st = mha_check_dims(dims);
    if (st == MHA_OK)
        st = mha_check_mask(mask, dims->batch, dims->heads, dims->seq_q, dims->seq_kv);
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

void mha_cache_append(const mha_kv_cache *c, const int32_t *lens, const float *k_new,
                      const float *v_new, int32_t n)
{
    cache_write(c, lens, c->k, c->stride_b, c->stride_h, c->stride_s, c->head_dim, k_new, n);
    cache_write(c, lens, c->v, c->v_stride_b, c->v_stride_h, c->v_stride_s, c->v_head_dim, v_new, n);
}

mha_status mha_kv_append(const mha_kv_cache *cache, const int32_t *lens, const float *k_new,
                         const float *v_new, int32_t seq_new)
{
    mha_kv_cache c;
    mha_status st = mha_check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    if (!lens || !k_new || !v_new)
        return MHA_ERR_ARG;
    if (seq_new <= 0 || seq_new > c.capacity)
        return MHA_ERR_SHAPE;
    st = mha_check_lens(&c, lens, seq_new);
    if (st != MHA_OK)
        return st;
    mha_cache_append(&c, lens, k_new, v_new, seq_new);
    return MHA_OK;
}

mha_attn_args mha_cached_view(const mha_kv_cache *c, const int32_t *lens, const float *q,
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
    mha_status st = mha_check_cache(cache, &c);
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
    st = mha_check_mask(mask, c.batch, heads, seq_q, c.capacity);
    if (st == MHA_OK)
        st = mha_check_lens(&c, lens, 0);
    if (st != MHA_OK)
        return st;
    const mha_attn_args a = mha_cached_view(&c, lens, q, heads, seq_q, scale, mask, out, out_layout, lse);
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
