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

mha_status mha_check_dims(const mha_attn_dims *d)
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

mha_status mha_check_cache(const mha_kv_cache *c, mha_kv_cache *r)
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

mha_status mha_check_lens(const mha_kv_cache *c, const int32_t *lens, int32_t seq_new)
{
    for (int32_t b = 0; b < c->batch; b++)
        if (lens[b] < 0 || lens[b] > c->capacity - seq_new)
            return MHA_ERR_SHAPE;
    return MHA_OK;
}
