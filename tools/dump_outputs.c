/* mha-dump: the layer's outputs on fixed inputs, as raw little-endian floats on
 * stdout, so that two builds (e.g. x86 scalar and AArch64 NEON under qemu) can
 * be compared across machines. Inputs come from an integer hash, identical on
 * every architecture. Shapes cover GQA, cross attention and every mask kind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mha.h"

static float *fixed(size_t n, uint32_t seed, float scale)
{
    float *p = malloc(n * sizeof(float));
    if (!p)
        exit(2);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = scale * ((float)(h % 20001u) / 10000.0f - 1.0f);
    }
    return p;
}

int main(void)
{
    const struct {
        int32_t heads, kv_heads, dh, e, out_dim, B, Sq, Skv;
    } cases[] = {{12, 12, 64, 768, 768, 2, 33, 33}, {8, 2, 20, 100, 50, 3, 7, 70},
                 {5, 5, 80, 64, 0, 2, 65, 17}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int32_t H = cases[c].heads, Hkv = cases[c].kv_heads, dh = cases[c].dh;
        const int32_t E = cases[c].e, B = cases[c].B, Sq = cases[c].Sq, Skv = cases[c].Skv;
        const float ws = 1.0f / sqrtf((float)E), wo = 1.0f / sqrtf((float)(H * dh));
        float *wq = fixed((size_t)H * dh * E, 1, ws), *wk = fixed((size_t)Hkv * dh * E, 2, ws);
        float *wv = fixed((size_t)Hkv * dh * E, 3, ws), *bq = fixed((size_t)H * dh, 4, ws);
        float *o = fixed((size_t)(cases[c].out_dim + 1) * H * dh, 5, wo);
        const mha_layer_desc desc = {.heads = H, .kv_heads = Hkv, .head_dim = dh, .q_in = E,
                                     .out_dim = cases[c].out_dim, .w_q = wq, .w_k = wk,
                                     .w_v = wv, .b_q = bq, .w_o = o, .b_o = o};
        mha_layer *L;
        if (mha_layer_create(&desc, &L) != MHA_OK)
            return 1;
        float *xq = fixed((size_t)B * Sq * E, 6, 1.0f), *xk = fixed((size_t)B * Skv * E, 7, 1.0f);
        float *bias = fixed((size_t)B * Skv, 8, 3.0f);
        int32_t key_lens[3] = {Skv, Skv / 2 + 1, 1};
        int32_t *qkl = malloc(sizeof(int32_t) * (size_t)B * Sq);
        for (int32_t i = 0; i < B * Sq; i++)
            qkl[i] = (i * 7) % (Skv + 1);
        const mha_mask masks[] = {{0}, {.key_lens = key_lens, .causal = 1},
                                  {.query_key_lens = qkl, .bias = bias, .bias_stride_b = Skv}};
        const size_t n = (size_t)B * Sq * (cases[c].out_dim ? cases[c].out_dim : H * dh);
        float *out = malloc(n * sizeof(float));
        for (size_t m = 0; m < sizeof masks / sizeof *masks; m++) {
            if (mha_layer_forward(L, xq, xk, xk, B, Sq, Skv, &masks[m], out, NULL, 0) != MHA_OK
                || fwrite(out, sizeof(float), n, stdout) != n)
                return 1;
        }
        mha_layer_destroy(L);
        float *bufs[] = {wq, wk, wv, bq, o, xq, xk, bias, out};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
        free(qkl);
    }
    return 0;
}
