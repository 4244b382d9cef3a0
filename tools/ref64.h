/* A float64 evaluation of the math of mha.h, written for checking rather than
 * speed: explicit loops, scores per row, exp in double. Shared by the tests and
 * mha-validate. Every mask field is honoured, the score modifiers (window,
 * softcap, ALiBi, sinks), key_starts and q_offsets included; 16-bit and q8_0
 * values are decoded from their bit fields here, independently of the library. */
#ifndef MHA_REF64_H
#define MHA_REF64_H

#include "mha.h"

/* Value i of a row of type t, exactly. */
double ref_value(mha_dtype t, const void *row, int64_t i);
/* The gap between values of the 16-bit type t (f16: 10 fraction bits, bf16: 7; else
   f32's 23) around r, subnormals included. */
double ref_ulp(mha_dtype t, double r);

/* q [B][H][Sq][dh], k [B][Hkv][Skv][dh], v [B][Hkv][Skv][dv] of dims->dtype (dv =
   v_head_dim, or dh when 0); out [B][H][Sq][dv] or [B][Sq][H*dv] as layout says. */
void ref_attention(const mha_attn_dims *d, const float *q, const float *k, const float *v,
                   double scale, const mha_mask *mask, double *out, mha_layout layout);
/* The same through strides (NULL: dense); out dense [B][H][Sq][dv]; lse NULL or
   [B][H][Sq]. */
void ref_attention_strided(const mha_attn_dims *d, const void *q, const mha_strides *qs,
                           const void *k, const mha_strides *ks, const void *v,
                           const mha_strides *vs, double scale, const mha_mask *mask,
                           double *out, double *lse);

/* mha_attention_cached: q [B][heads][seq_q][dh] (the cache's io_dtype) against rows
   j < lens[b] of the cache (its dtype, strides and block table); row i sits at
   p(i) = lens[b] - seq_q + i unless q_offsets says otherwise. out as ref_attention,
   dv wide; lse (NULL or [B][heads][seq_q]) gets the log of the sum of exp(score) over
   visible keys (no sink), -inf where none is visible. */
void ref_attention_cached(const mha_kv_cache *cache, const int32_t *lens, const float *q,
                          int32_t heads, int32_t seq_q, double scale, const mha_mask *mask,
                          double *out, mha_layout layout, double *lse);
/* The same with strided q (NULL: dense) and out strides os (in doubles; NULL: dense). */
void ref_attention_cached_strided(const mha_kv_cache *cache, const int32_t *lens, const void *q,
                                  const mha_strides *qs, int32_t heads, int32_t seq_q,
                                  double scale, const mha_mask *mask, double *out,
                                  const mha_strides *os, double *lse);

/* The whole layer described by d (weights as for mha_layer_create, v_head_dim
   included); out is [B][Sq][out_dim or heads*dv]. Projections are rounded to float in
   between, as the library keeps them. */
void ref_layer(const mha_layer_desc *d, const float *query, const float *key, const float *value,
               int32_t batch, int32_t seq_q, int32_t seq_kv, const mha_mask *mask, double *out);

#endif
