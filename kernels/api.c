/* The entry points' shared part: status strings, the version, size arithmetic
 * that never overflows, and the argument checks every call makes before it
 * writes anything (api.h). */
#include <math.h>
#include <stdint.h>

#include "api.h"

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
        return "invalid mask (a length outside its range, a negative stride, or a field out of range)";
    case MHA_ERR_UNSUPPORTED:
        return "ISA not built into this library or not supported by this CPU";
    case MHA_ERR_NOMEM:
        return "out of memory";
    }
    return "unknown status";
}

/* *acc *= x for positive factors; 0 when the product leaves [1, COUNT_LIMIT]. */
static int mul_ok(int64_t *acc, int64_t x)
{
    const int64_t limit = COUNT_LIMIT;
    if (x <= 0 || *acc > limit / x)
        return 0;
    *acc *= x;
    return 1;
}

int64_t mha_count(int n, const int32_t *dims)
{
    int64_t c = 1;
    for (int i = 0; i < n; i++)
        if (!mul_ok(&c, dims[i]))
            return -1;
    return c;
}

const char *mha_dtype_name(mha_dtype t)
{
#define DTYPE_NAME_(name, value, bytes, values, io) \
    if (t == value)                                 \
        return #name;
    MHA_DTYPE_LIST(DTYPE_NAME_)
#undef DTYPE_NAME_
    return "unknown";
}

mha_status mha_check_dims(const mha_attn_dims *d)
{
    if (!mha_dtype_valid(d->dtype, 1))
        return MHA_ERR_ARG;
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

mha_status mha_check_mask(const mha_mask *m, int32_t batch, int32_t heads, int32_t seq_q,
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
    if (m->key_starts)
        for (int32_t b = 0; b < batch; b++)
            if (m->key_starts[b] < 0 || m->key_starts[b] > seq_kv)
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

/* *last += stride * (extent - 1) for each of three dimensions; 0 when a term
   leaves [0, limit] or a stride is negative (*neg set). */
static int extent_ok(const int64_t strides[3], const int32_t extents[3], int64_t *last,
                     int64_t limit, int *neg)
{
    for (int i = 0; i < 3; i++) {
        int64_t term;
        if (strides[i] < 0)
            return !(*neg = 1);
        if (__builtin_mul_overflow(strides[i], (int64_t)extents[i] - 1, &term)
            || __builtin_add_overflow(*last, term, last) || *last > limit)
            return 0;
    }
    return 1;
}

mha_status mha_check_cache(const mha_kv_cache *c, mha_kv_cache *r)
{
    if (!c || !c->k || !c->v)
        return MHA_ERR_ARG;
    if (!mha_dtype_valid(c->dtype, 0) || !mha_dtype_valid(c->io_dtype, 1))
        return MHA_ERR_ARG;
    if (c->batch <= 0 || c->kv_heads <= 0 || c->head_dim <= 0 || c->capacity <= 0
        || c->v_head_dim < 0)
        return MHA_ERR_SHAPE;
    *r = *c;
    r->v_head_dim = value_dim(c->v_head_dim, c->head_dim);
    const int32_t per_block = mha_dtype_block_values(c->dtype);
    if (c->head_dim % per_block || r->v_head_dim % per_block)
        return MHA_ERR_SHAPE;
    if (c->block_table
        && (c->block_size < 1 || c->max_blocks < 1 || c->num_blocks < 1
            || (int64_t)c->max_blocks * c->block_size != c->capacity))
        return MHA_ERR_SHAPE;
    if (!c->v_stride_b && !c->v_stride_h && !c->v_stride_s)
        r->v_stride_b = c->stride_b, r->v_stride_h = c->stride_h, r->v_stride_s = c->stride_s;
    const int64_t strides[2][3] = {{r->stride_b, r->stride_h, r->stride_s},
                                   {r->v_stride_b, r->v_stride_h, r->v_stride_s}};
    /* Sequences, or with a table the pool's blocks; heads; rows of a sequence or block. */
    const int32_t extents[3] = {c->block_table ? c->num_blocks : c->batch, c->kv_heads,
                                c->block_table ? c->block_size : c->capacity};
    /* The bytes up to the end of the last row must be representable. */
    const int64_t limit = PTRDIFF_MAX / mha_dtype_block_bytes(c->dtype);
    for (int t = 0; t < 2; t++) {
        int64_t last = (t ? r->v_head_dim : r->head_dim) / per_block;
        int neg = 0;
        if (!extent_ok(strides[t], extents, &last, limit, &neg))
            return neg ? MHA_ERR_ARG : MHA_ERR_SHAPE;
    }
    return MHA_OK;
}

mha_status mha_check_lens(const mha_kv_cache *c, const int32_t *lens, int32_t seq_new)
{
    for (int32_t b = 0; b < c->batch; b++)
        if (lens[b] < 0 || lens[b] > c->capacity - seq_new)
            return MHA_ERR_SHAPE;
    /* The table's entries of the rows a call reads or writes: those of rows past
       lens[b] + seq_new are never read. */
    for (int32_t b = 0; c->block_table && b < c->batch; b++) {
        const int32_t used = (int32_t)(((int64_t)lens[b] + seq_new + c->block_size - 1) / c->block_size);
        for (int32_t i = 0; i < used; i++) {
            const int32_t blk = c->block_table[(int64_t)b * c->max_blocks + i];
            if (blk < 0 || blk >= c->num_blocks)
                return MHA_ERR_ARG;
        }
    }
    return MHA_OK;
}

mha_status mha_check_strides(const mha_strides *s)
{
    return !s || (s->b >= 0 && s->h >= 0 && s->s >= 0) ? MHA_OK : MHA_ERR_ARG;
}
