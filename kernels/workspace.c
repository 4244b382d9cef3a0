/* The workspace planner of the layer calls: the sizes of a call's
 * intermediates, the bytes a caller's workspace must hold (they depend on the
 * thread count: see mha.h), and how it is carved, or allocated when the caller
 * gives none. */
#include <stdint.h>
#include <stdlib.h>

#include "api.h"

mha_status mha_forward_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, int32_t seq_kv,
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

size_t mha_workspace_bytes(const fwd_sizes *s, size_t extra)
{
    return MHA_ALIGN + aligned_bytes(s->q) + aligned_bytes(s->k) + aligned_bytes(s->v)
           + aligned_bytes(s->merged) + s->arena + extra;
}

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

mha_status mha_layer_begin(const mha_layer *layer, void *workspace, size_t workspace_size,
                           size_t need, const fwd_sizes *s, const mha_kernels **kt,
                           const packed_weights **pw, workspace_parts *w)
{
    if (workspace && workspace_size < need)
        return MHA_ERR_ARG;
    *kt = mha_kernels_active();
    *pw = mha_layer_packed(layer, (*kt)->gemm_nr);
    if (!*pw)
        return MHA_ERR_NOMEM;
    return workspace_take(workspace, need, s, w);
}

size_t mha_layer_workspace_size(const mha_layer *layer, int32_t batch, int32_t seq_q,
                                int32_t seq_kv)
{
    fwd_sizes s;
    if (!layer || mha_forward_sizes(layer, batch, seq_q, seq_kv, &s) != MHA_OK)
        return 0;
    return mha_workspace_bytes(&s, 0);
}

mha_status mha_step_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, fwd_sizes *s,
                          size_t *bytes)
{
    mha_status st = mha_forward_sizes(L, batch, seq_q, seq_q, s);
    if (st != MHA_OK)
        return st;
    *bytes = mha_workspace_bytes(s, (size_t)batch * sizeof(int32_t));
    return MHA_OK;
}

size_t mha_layer_step_workspace_size(const mha_layer *layer, int32_t batch, int32_t seq_q)
{
    fwd_sizes s;
    size_t bytes;
    if (!layer || mha_step_sizes(layer, batch, seq_q, &s, &bytes) != MHA_OK)
        return 0;
    return bytes;
}
