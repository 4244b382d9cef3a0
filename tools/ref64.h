/* A float64 evaluation of the math of mha.h, written for checking rather than
 * speed: explicit loops, scores per row, exp in double. Shared by the tests and
 * mha-validate. */
#ifndef MHA_REF64_H
#define MHA_REF64_H

#include "mha.h"

/* q [B][H][Sq][dh], k, v [B][Hkv][Skv][dh]; out in the given layout. */
void ref_attention(const mha_attn_dims *d, const float *q, const float *k, const float *v,
                   double scale, const mha_mask *mask, double *out, mha_layout layout);

/* The whole layer described by d (weights as for mha_layer_create); out is
   [B][Sq][out_dim or heads*dh]. Projections are rounded to float in between,
   as the library keeps them. */
void ref_layer(const mha_layer_desc *d, const float *query, const float *key, const float *value,
               int32_t batch, int32_t seq_q, int32_t seq_kv, const mha_mask *mask, double *out);

#endif
