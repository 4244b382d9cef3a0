/* The entry points of attention, the KV cache and the head transpose: each
 * checks its arguments (api.c), then hands the call to a driver. */
#include <string.h>

#include "api.h"

/* The dense strides of [B][H][S][d], and those of [B][S][H][d] viewed as it. */
static mha_strides dense(int32_t heads, int32_t seq, int32_t d)
{
    return (mha_strides){(int64_t)heads * seq * d, (int64_t)seq * d, d};
}

static mha_strides merged(int32_t heads, int32_t seq, int32_t d)
{
    return (mha_strides){(int64_t)heads * seq * d, d, (int64_t)heads * d};
}

/* [lo, hi): the bytes of a strided [B][H][S][d] tensor of es-byte elements, its last
   element included; 0 when the last offset passes COUNT_LIMIT. */
typedef struct extent {
    uintptr_t lo, hi;
} extent;

static int extent_of(const void *base, const mha_strides *st, int32_t B, int32_t H, int32_t S,
                     int32_t d, size_t es, extent *e)
{
    const int64_t strides[3] = {st->b, st->h, st->s};
    const int32_t dims[3] = {B, H, S};
    int64_t last = d, term;
    for (int i = 0; i < 3; i++)
        if (__builtin_mul_overflow(strides[i], (int64_t)dims[i] - 1, &term)
            || __builtin_add_overflow(last, term, &last) || last > COUNT_LIMIT)
            return 0;
    e->lo = (uintptr_t)base;
    e->hi = e->lo + (uintptr_t)last * es;
    return 1;
}

static int overlap(extent a, extent b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

mha_status mha_attention_strided(const mha_attn_dims *dims, const void *q,
                                 const mha_strides *q_strides, const void *k,
                                 const mha_strides *k_strides, const void *v,
                                 const mha_strides *v_strides, float scale, const mha_mask *mask,
                                 void *out, const mha_strides *out_strides, float *lse)
{
    if (!dims || !q || !k || !v || !out)
        return MHA_ERR_ARG;
    mha_status st = mha_check_dims(dims);
    if (st != MHA_OK)
        return st;
    if (mha_check_strides(q_strides) || mha_check_strides(k_strides)
        || mha_check_strides(v_strides) || mha_check_strides(out_strides))
        return MHA_ERR_ARG;
    const int32_t B = dims->batch, H = dims->heads, Hkv = dims->kv_heads, Sq = dims->seq_q;
    const int32_t Skv = dims->seq_kv, dk = dims->head_dim, dv = value_dim(dims->v_head_dim, dk);
    const mha_strides qs = q_strides ? *q_strides : dense(H, Sq, dk);
    const mha_strides ks = k_strides ? *k_strides : dense(Hkv, Skv, dk);
    const mha_strides vs = v_strides ? *v_strides : dense(Hkv, Skv, dv);
    const mha_strides os = out_strides ? *out_strides : dense(H, Sq, dv);
    const size_t es = (size_t)mha_dtype_block_bytes(dims->dtype);
    extent eq, ek, ev, eo;
    if (!extent_of(q, &qs, B, H, Sq, dk, es, &eq) || !extent_of(k, &ks, B, Hkv, Skv, dk, es, &ek)
        || !extent_of(v, &vs, B, Hkv, Skv, dv, es, &ev) || !extent_of(out, &os, B, H, Sq, dv, es, &eo))
        return MHA_ERR_SHAPE;
    if (overlap(eo, eq) || overlap(eo, ek) || overlap(eo, ev))
        return MHA_ERR_ARG;
    st = mha_check_mask(mask, B, H, Sq, Skv);
    if (st != MHA_OK)
        return st;
    const mha_attn_args a = {
        .batch = B, .heads = H, .kv_heads = Hkv, .seq_q = Sq, .seq_kv = Skv, .dk = dk, .dv = dv,
        .io_type = dims->dtype, .kv_type = dims->dtype,
        .q = q, .q_st = qs, .out = out, .out_st = os,
        .k = k, .v = v,
        .k_stride_b = ks.b * (int64_t)es, .k_stride_h = ks.h * (int64_t)es, .k_stride_s = ks.s * (int64_t)es,
        .v_stride_b = vs.b * (int64_t)es, .v_stride_h = vs.h * (int64_t)es, .v_stride_s = vs.s * (int64_t)es,
        .scale = scale, .mask = mask, .lse = lse,
    };
    return mha_attention_run(mha_kernels_active(), &a);
}

mha_status mha_attention(const mha_attn_dims *dims, const float *q, const float *k, const float *v,
                         float scale, const mha_mask *mask, float *out, mha_layout out_layout)
{
    if (!dims || (out_layout != MHA_LAYOUT_BHSD && out_layout != MHA_LAYOUT_BSHD))
        return MHA_ERR_ARG;
    const mha_status st = mha_check_dims(dims); /* sizes first: the strides below could overflow */
    if (st != MHA_OK)
        return st;
    const int32_t dv = value_dim(dims->v_head_dim, dims->head_dim);
    const mha_strides os = out_layout == MHA_LAYOUT_BHSD ? dense(dims->heads, dims->seq_q, dv)
                                                         : merged(dims->heads, dims->seq_q, dv);
    return mha_attention_strided(dims, q, NULL, k, NULL, v, NULL, scale, mask, out, &os, NULL);
}

/* Row j of sequence b, kv head g of one side of the resolved cache (strides in
   blocks of its dtype). */
static char *cache_row(const mha_kv_cache *c, void *base, int64_t sb, int64_t sh, int64_t ss,
                       int32_t b, int32_t g, int32_t j)
{
    const int64_t bb = mha_dtype_block_bytes(c->dtype);
    int64_t at = g * sh;
    if (c->block_table)
        at += c->block_table[(int64_t)b * c->max_blocks + j / c->block_size] * sb
              + (int64_t)(j % c->block_size) * ss;
    else
        at += b * sb + (int64_t)j * ss;
    return (char *)base + at * bb;
}

/* Rows [B][Hkv][n][width] of src (io_dtype) converted into rows lens[b].. of one side
   of the cache (q8_0 a block of 32 floats at a time). */
static void cache_write(const mha_kernels *kt, const mha_kv_cache *c, const int32_t *lens,
                        void *base, int64_t sb, int64_t sh, int64_t ss, int32_t width,
                        const void *src, int32_t n)
{
    const size_t es = (size_t)mha_dtype_block_bytes(c->io_dtype);
    for (int32_t b = 0; b < c->batch; b++)
        for (int32_t g = 0; g < c->kv_heads; g++)
            for (int32_t j = 0; j < n; j++) {
                const char *row = (const char *)src + (((int64_t)b * c->kv_heads + g) * n + j) * width * es;
                char *dst = cache_row(c, base, sb, sh, ss, b, g, lens[b] + j);
                if (c->dtype == c->io_dtype) {
                    memcpy(dst, row, (size_t)width * es);
                } else if (c->dtype == MHA_Q8_0) {
                    for (int32_t i = 0; i < width; i += MHA_Q8_BLOCK) {
                        float x[MHA_Q8_BLOCK];
                        kt->convert(MHA_F32, x, c->io_dtype, row + i * es, MHA_Q8_BLOCK);
                        mha_quantize_q8_0(x, (uint8_t *)dst + i / MHA_Q8_BLOCK * MHA_Q8_BYTES);
                    }
                } else {
                    kt->convert(c->dtype, dst, c->io_dtype, row, width);
                }
            }
}

void mha_cache_append(const mha_kv_cache *c, const int32_t *lens, const void *k_new,
                      const void *v_new, int32_t n)
{
    const mha_kernels *kt = mha_kernels_active();
    cache_write(kt, c, lens, c->k, c->stride_b, c->stride_h, c->stride_s, c->head_dim, k_new, n);
    cache_write(kt, c, lens, c->v, c->v_stride_b, c->v_stride_h, c->v_stride_s, c->v_head_dim,
                v_new, n);
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

mha_attn_args mha_cached_view(const mha_kv_cache *c, const int32_t *lens, const void *q,
                              const mha_strides *q_st, int32_t heads, int32_t seq_q, float scale,
                              const mha_mask *mask, void *out, const mha_strides *out_st,
                              float *lse)
{
    const int64_t bb = mha_dtype_block_bytes(c->dtype);
    return (mha_attn_args){
        .batch = c->batch, .heads = heads, .kv_heads = c->kv_heads, .seq_q = seq_q,
        .seq_kv = c->capacity, .dk = c->head_dim, .dv = c->v_head_dim, .lens = lens,
        .io_type = c->io_dtype, .kv_type = c->dtype,
        .q = q, .q_st = *q_st, .out = out, .out_st = *out_st,
        .k = c->k, .v = c->v,
        .k_stride_b = c->stride_b * bb, .k_stride_h = c->stride_h * bb, .k_stride_s = c->stride_s * bb,
        .v_stride_b = c->v_stride_b * bb, .v_stride_h = c->v_stride_h * bb,
        .v_stride_s = c->v_stride_s * bb,
        .block_table = c->block_table, .block_size = c->block_size, .max_blocks = c->max_blocks,
        .scale = scale, .mask = mask, .lse = lse,
    };
}

/* mha_attention_cached_strided, with out dense or merged (layout) when out_strides
   is NULL: the strides of either are formed only once the sizes are checked. */
static mha_status cached_call(const mha_kv_cache *cache, const int32_t *lens, const void *q,
                              const mha_strides *q_strides, int32_t heads, int32_t seq_q,
                              float scale, const mha_mask *mask, void *out,
                              const mha_strides *out_strides, mha_layout layout, float *lse)
{
    mha_kv_cache c;
    mha_status st = mha_check_cache(cache, &c);
    if (st != MHA_OK)
        return st;
    if (!lens || !q || !out || mha_check_strides(q_strides) || mha_check_strides(out_strides))
        return MHA_ERR_ARG;
    if (heads <= 0 || seq_q <= 0 || heads % c.kv_heads != 0
        || COUNT(c.batch, heads, seq_q, c.head_dim) < 0
        || COUNT(c.batch, heads, seq_q, c.v_head_dim) < 0)
        return MHA_ERR_SHAPE;
    const mha_strides qs = q_strides ? *q_strides : dense(heads, seq_q, c.head_dim);
    const mha_strides os = out_strides              ? *out_strides
                           : layout == MHA_LAYOUT_BHSD ? dense(heads, seq_q, c.v_head_dim)
                                                       : merged(heads, seq_q, c.v_head_dim);
    const size_t es = (size_t)mha_dtype_block_bytes(c.io_dtype);
    extent eq, eo;
    if (!extent_of(q, &qs, c.batch, heads, seq_q, c.head_dim, es, &eq)
        || !extent_of(out, &os, c.batch, heads, seq_q, c.v_head_dim, es, &eo))
        return MHA_ERR_SHAPE;
    if (overlap(eo, eq))
        return MHA_ERR_ARG;
    if (mask && mask->key_lens)
        return MHA_ERR_MASK;
    st = mha_check_mask(mask, c.batch, heads, seq_q, c.capacity);
    if (st == MHA_OK)
        st = mha_check_lens(&c, lens, 0);
    if (st != MHA_OK)
        return st;
    const mha_attn_args a = mha_cached_view(&c, lens, q, &qs, heads, seq_q, scale, mask, out, &os, lse);
    return mha_attention_run(mha_kernels_active(), &a);
}

mha_status mha_attention_cached_strided(const mha_kv_cache *cache, const int32_t *lens,
                                        const void *q, const mha_strides *q_strides,
                                        int32_t heads, int32_t seq_q, float scale,
                                        const mha_mask *mask, void *out,
                                        const mha_strides *out_strides, float *lse)
{
    return cached_call(cache, lens, q, q_strides, heads, seq_q, scale, mask, out, out_strides,
                       MHA_LAYOUT_BHSD, lse);
}

mha_status mha_attention_cached(const mha_kv_cache *cache, const int32_t *lens, const float *q,
                                int32_t heads, int32_t seq_q, float scale, const mha_mask *mask,
                                float *out, mha_layout out_layout, float *lse)
{
    if (out_layout != MHA_LAYOUT_BHSD && out_layout != MHA_LAYOUT_BSHD)
        return MHA_ERR_ARG;
    return cached_call(cache, lens, q, NULL, heads, seq_q, scale, mask, out, NULL, out_layout, lse);
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
