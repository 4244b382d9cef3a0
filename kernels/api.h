/* What the entry points share: api.c (status, sizes, argument checks),
 * api_attention.c (attention, KV cache, transpose), layer.c (the layer object
 * and its calls) and workspace.c (the layer calls' memory). */
#ifndef MHA_API_H
#define MHA_API_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define MHA_ALIGN 64 /* of every part of a workspace */

/* The largest count of floats: it and its bytes fit in int64_t, size_t and ptrdiff_t. */
#define COUNT_LIMIT ((int64_t)(PTRDIFF_MAX < INT64_MAX ? PTRDIFF_MAX : INT64_MAX) / 4)

/* Number of floats in a tensor of the given positive dims, or -1 when one is <= 0
   or the product passes COUNT_LIMIT; COUNT(a, b, ...) for a list. */
int64_t mha_count(int n, const int32_t *dims);
#define COUNT(...) mha_count(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t), (int32_t[]){__VA_ARGS__})

/* dv of a value head: v_head_dim, or dk when it is 0. */
static inline int32_t value_dim(int32_t v_head_dim, int32_t dk)
{
    return v_head_dim ? v_head_dim : dk;
}

/* Argument checks; each returns the status a bad argument gives and reads nothing
   it does not check. */
mha_status mha_check_dims(const mha_attn_dims *d);
/* The mask of a call of batch x heads x seq_q rows against keys j < seq_kv. */
mha_status mha_check_mask(const mha_mask *m, int32_t batch, int32_t heads, int32_t seq_q,
                          int32_t seq_kv);
/* *r = the cache with v_head_dim and the V strides resolved. */
mha_status mha_check_cache(const mha_kv_cache *c, mha_kv_cache *r);
/* lens[b] + seq_new within [0, capacity] for every b (seq_new 0 for reads). */
mha_status mha_check_lens(const mha_kv_cache *c, const int32_t *lens, int32_t seq_new);

/* strides NULL, or all >= 0 (else MHA_ERR_ARG). */
mha_status mha_check_strides(const mha_strides *s);

/* Rows [B][Hkv][n][width] of k_new and v_new (the cache's io_dtype) converted into
   rows lens[b].. of the resolved cache c (arguments checked); allocates nothing. */
void mha_cache_append(const mha_kv_cache *c, const int32_t *lens, const void *k_new,
                      const void *v_new, int32_t n);
/* The driver's view of attention over the resolved cache c (arguments checked). */
mha_attn_args mha_cached_view(const mha_kv_cache *c, const int32_t *lens, const void *q,
                              const mha_strides *q_st, int32_t heads, int32_t seq_q, float scale,
                              const mha_mask *mask, void *out, const mha_strides *out_st,
                              float *lse);

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

/* L's weights packed for width nr: the published copy, else a repack of pack[0]
   made once under the lock; NULL when that copy cannot be allocated. */
const packed_weights *mha_layer_packed(const mha_layer *layer, int32_t nr);

/* Float counts of a layer call's intermediates, and the attention's memory. */
typedef struct fwd_sizes {
    int64_t q, k, v, merged;
    size_t arena; /* mha_attention_arena_bytes */
} fwd_sizes;

/* The parts of a workspace, each 64-byte aligned. */
typedef struct workspace_parts {
    float *q, *k, *v, *merged;
    void *arena, *extra;
    void *owned; /* allocated by the call, else NULL */
} workspace_parts;

/* A forward pass's sizes; MHA_ERR_SHAPE when a dimension is <= 0 or a size overflows. */
mha_status mha_forward_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, int32_t seq_kv,
                             fwd_sizes *s);
/* A step's: the forward pass's with seq_kv = seq_q, and in *bytes its workspace
   (with the new lens after the rest). */
mha_status mha_step_sizes(const mha_layer *L, int32_t batch, int32_t seq_q, fwd_sizes *s,
                          size_t *bytes);
/* The workspace: q, k, v, merged and the attention's arena one after another,
   64-byte aligned, plus `extra` bytes after them. */
size_t mha_workspace_bytes(const fwd_sizes *s, size_t extra);
/* What a layer call needs before it writes anything, in this order: a workspace of
   `need` bytes if the caller gives one (MHA_ERR_ARG), the weights packed for this
   call's ISA (repacking may fail), the workspace allocated when none is given. */
mha_status mha_layer_begin(const mha_layer *layer, void *workspace, size_t workspace_size,
                           size_t need, const fwd_sizes *s, const mha_kernels **kt,
                           const packed_weights **pw, workspace_parts *w);

#endif
