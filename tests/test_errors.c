/* Every entry point with each class of bad argument: the documented status, and
 * output buffers (filled with a canary) left untouched; the score modifiers out of
 * range in every call that takes a mask. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

#define CANARY 0x5a
enum { B = 2, H = 4, HKV = 2, SQ = 3, SKV = 5, DH = 8, E = 32, NQ = B * H * SQ * DH,
       NKV = B * HKV * SKV * DH };

static float q[NQ], k[NKV], v[NKV], x[B * SKV * E], out[NQ * 4];
static float out2[NKV], out3[NKV];

static void fill_canary(void)
{
    memset(out, CANARY, sizeof out);
    memset(out2, CANARY, sizeof out2);
    memset(out3, CANARY, sizeof out3);
}

static void assert_untouched(void)
{
    for (size_t i = 0; i < sizeof out; i++)
        assert_int_equal(((unsigned char *)out)[i], CANARY);
    for (size_t i = 0; i < sizeof out2; i++)
        assert_int_equal(((unsigned char *)out2)[i], CANARY);
    for (size_t i = 0; i < sizeof out3; i++)
        assert_int_equal(((unsigned char *)out3)[i], CANARY);
}

static const mha_attn_dims good = {B, H, HKV, SQ, SKV, DH, 0, MHA_F32};

static void attention_bad_args(void **state)
{
    (void)state;
    struct {
        mha_attn_dims d;
        mha_status want;
    } dims[] = {
        {{0, H, HKV, SQ, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE}, {{B, -1, HKV, SQ, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{B, H, 0, SQ, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE},   {{B, H, 3, SQ, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{B, H, HKV, 0, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE},  {{B, H, HKV, SQ, -5, DH, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{B, H, HKV, SQ, SKV, 0, 0, MHA_F32}, MHA_ERR_SHAPE},  {{B, 2, 4, SQ, SKV, DH, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{B, H, HKV, SQ, SKV, DH, -1, MHA_F32}, MHA_ERR_SHAPE},
        {{B, H, HKV, SQ, SKV, DH, INT32_MIN, MHA_F32}, MHA_ERR_SHAPE},
        {{INT32_MAX, INT32_MAX, 1, INT32_MAX, 1, INT32_MAX, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{1 << 21, 1, 1, 1 << 21, 1 << 21, 1, 0, MHA_F32}, MHA_ERR_SHAPE},
        {{INT32_MAX, INT32_MAX, 1, 1, 1, 1, INT32_MAX, MHA_F32}, MHA_ERR_SHAPE}, /* out, dv wide */
        {{1 << 21, 1, 1, 1, 1 << 21, 1, 1 << 21, MHA_F32}, MHA_ERR_SHAPE},        /* v, dv wide */
    };
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        fill_canary();
        assert_int_equal(mha_attention(&dims[i].d, q, k, v, 1.0f, NULL, out, MHA_LAYOUT_BHSD),
                         dims[i].want);
        assert_untouched();
    }
    fill_canary();
    assert_int_equal(mha_attention(NULL, q, k, v, 1.0f, NULL, out, 0), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, NULL, k, v, 1.0f, NULL, out, 0), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, q, NULL, v, 1.0f, NULL, out, 0), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, q, k, NULL, 1.0f, NULL, out, 0), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, q, k, v, 1.0f, NULL, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, q, k, v, 1.0f, NULL, out, (mha_layout)2), MHA_ERR_ARG);
    assert_int_equal(mha_attention(&good, q, k, v, 1.0f, NULL, out, (mha_layout)-1), MHA_ERR_ARG);
    assert_untouched();
}

static void attention_bad_masks(void **state)
{
    (void)state;
    const int32_t kl_neg[B] = {1, -1}, kl_big[B] = {SKV + 1, 1};
    const int32_t ks_neg[B] = {0, -1}, ks_big[B] = {SKV + 1, 0};
    int32_t qkl_neg[B * SQ] = {0}, qkl_big[B * SQ] = {0};
    qkl_neg[5] = -3;
    qkl_big[2] = SKV + 1;
    const float bias[SKV] = {0};
    const mha_mask masks[] = {
        {.key_lens = kl_neg},
        {.key_lens = kl_big},
        {.query_key_lens = qkl_neg},
        {.query_key_lens = qkl_big},
        {.key_starts = ks_neg},
        {.key_starts = ks_big, .causal = 1},
        {.bias = bias, .bias_stride_b = -1},
        {.bias = bias, .bias_stride_h = -SKV},
        {.bias = bias, .bias_stride_q = -1},
        {.bias = bias, .bias_stride_b = INT64_MAX / 2},
        {.bias = bias, .bias_stride_h = INT64_MAX},
    };
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        fill_canary();
        assert_int_equal(mha_attention(&good, q, k, v, 1.0f, &masks[i], out, 0), MHA_ERR_MASK);
        assert_untouched();
    }
}

/* The strided calls: a negative stride or a NULL tensor is MHA_ERR_ARG, and so is an
   out that overlaps q, k or v (by one element) or a type that is not an io type; a
   view whose last element lies beyond the addressable is MHA_ERR_SHAPE; key_starts
   outside [0, seq_kv] (capacity) is MHA_ERR_MASK; nothing written, lse included. The
   same calls with q_offsets at the ends of int32 work. */
static void strided_bad_args(void **state)
{
    (void)state;
    const mha_strides dq = {H * SQ * DH, SQ * DH, DH}, dkv = {HKV * SKV * DH, SKV * DH, DH};
    const mha_strides neg[] = {{-1, SQ * DH, DH}, {H * SQ * DH, -DH, DH}, {H * SQ * DH, SQ * DH, -1}};
    const mha_strides huge = {INT64_MAX / 2, 1, 1};
    float *lse = out2;
    for (int i = 0; i < NQ; i++)
        q[i] = sinf((float)i);
    for (int i = 0; i < NKV; i++)
        k[i] = cosf((float)i), v[i] = 1.0f + sinf((float)(3 * i));
    for (size_t i = 0; i < sizeof neg / sizeof *neg; i++) {
        fill_canary();
        assert_int_equal(mha_attention_strided(&good, q, &neg[i], k, NULL, v, NULL, 1.0f, NULL,
                                               out, NULL, lse), MHA_ERR_ARG);
        assert_int_equal(mha_attention_strided(&good, q, NULL, k, &neg[i], v, NULL, 1.0f, NULL,
                                               out, NULL, lse), MHA_ERR_ARG);
        assert_int_equal(mha_attention_strided(&good, q, NULL, k, NULL, v, &neg[i], 1.0f, NULL,
                                               out, NULL, lse), MHA_ERR_ARG);
        assert_int_equal(mha_attention_strided(&good, q, NULL, k, NULL, v, NULL, 1.0f, NULL, out,
                                               &neg[i], lse), MHA_ERR_ARG);
        assert_untouched();
    }
    fill_canary();
    assert_int_equal(mha_attention_strided(&good, q, &huge, k, NULL, v, NULL, 1.0f, NULL, out,
                                           NULL, lse), MHA_ERR_SHAPE);
    assert_int_equal(mha_attention_strided(&good, q, NULL, k, NULL, v, NULL, 1.0f, NULL, out,
                                           &huge, lse), MHA_ERR_SHAPE);
    assert_int_equal(mha_attention_strided(&good, NULL, NULL, k, NULL, v, NULL, 1.0f, NULL, out,
                                           NULL, lse), MHA_ERR_ARG);
    assert_int_equal(mha_attention_strided(&good, q, NULL, k, NULL, v, NULL, 1.0f, NULL, NULL,
                                           NULL, lse), MHA_ERR_ARG);
    /* out overlapping each input by its last element, through a buffer that holds both */
    static float both[NQ + NKV];
    const float *ins[3] = {q, k, v};
    for (int which = 0; which < 3; which++) {
        const int64_t n = which == 0 ? NQ : NKV;
        memcpy(both, ins[which], sizeof(float) * (size_t)n);
        const float *in = both;
        float *o = both + n - 1;
        const float *qq = which == 0 ? in : q, *kk = which == 1 ? in : k, *vv = which == 2 ? in : v;
        assert_int_equal(mha_attention_strided(&good, qq, NULL, kk, NULL, vv, NULL, 1.0f, NULL,
                                               o, &dq, lse), MHA_ERR_ARG);
        assert_memory_equal(both, ins[which], sizeof(float) * (size_t)n);
    }
    const mha_attn_dims typed[] = {{B, H, HKV, SQ, SKV, DH, 0, MHA_Q8_0},
                                   {B, H, HKV, SQ, SKV, DH, 0, (mha_dtype)7},
                                   {B, H, HKV, SQ, SKV, DH, 0, (mha_dtype)-1}};
    for (size_t i = 0; i < sizeof typed / sizeof *typed; i++)
        assert_int_equal(mha_attention_strided(&typed[i], q, &dq, k, &dkv, v, &dkv, 1.0f, NULL,
                                               out, NULL, lse), MHA_ERR_ARG);
    const int32_t ks_big[B] = {0, SKV + 1};
    const mha_mask starts = {.key_starts = ks_big};
    assert_int_equal(mha_attention_strided(&good, q, &dq, k, &dkv, v, &dkv, 1.0f, &starts, out,
                                           NULL, lse), MHA_ERR_MASK);
    assert_untouched();

    test_cache tc;
    assert_true(test_cache_init(&tc, CACHE_BHSD, B, HKV, DH, 0, SKV));
    rng r = {33};
    int32_t lens[B] = {2, 1};
    test_cache_fill(&tc, &r, lens);
    for (size_t i = 0; i < sizeof neg / sizeof *neg; i++) {
        assert_int_equal(mha_attention_cached_strided(&tc.c, lens, q, &neg[i], H, SQ, 1.0f, NULL,
                                                      out, NULL, lse), MHA_ERR_ARG);
        assert_int_equal(mha_attention_cached_strided(&tc.c, lens, q, NULL, H, SQ, 1.0f, NULL,
                                                      out, &neg[i], lse), MHA_ERR_ARG);
    }
    assert_int_equal(mha_attention_cached_strided(&tc.c, lens, q, &huge, H, SQ, 1.0f, NULL, out,
                                                  NULL, lse), MHA_ERR_SHAPE);
    memcpy(both, q, sizeof(float) * NQ);
    assert_int_equal(mha_attention_cached_strided(&tc.c, lens, both, NULL, H, SQ, 1.0f, NULL,
                                                  both + NQ - 1, NULL, lse), MHA_ERR_ARG);
    assert_memory_equal(both, q, sizeof(float) * NQ);
    const int32_t cks_big[B] = {SKV + 1, 0};
    const mha_mask cstarts = {.key_starts = cks_big, .causal = 1};
    assert_int_equal(mha_attention_cached_strided(&tc.c, lens, q, NULL, H, SQ, 1.0f, &cstarts,
                                                  out, NULL, lse), MHA_ERR_MASK);
    assert_untouched();
    /* q_offsets take any int32: the row at INT32_MIN sees no key, the one at INT32_MAX
       every key (a window of 2^30 then none). */
    const int32_t offs[B] = {INT32_MIN, INT32_MAX};
    const mha_mask ends[] = {{.causal = 1, .q_offsets = offs},
                             {.causal = 1, .window = 1 << 30, .q_offsets = offs}};
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        assert_int_equal(mha_attention_strided(&good, q, NULL, k, NULL, v, NULL, 1.0f, &ends[i],
                                               out, NULL, lse), MHA_OK);
        for (int32_t h = 0; h < H; h++)
            for (int32_t e = 0; e < SQ * DH; e++) {
                assert_true(out[(0 * H + h) * SQ * DH + e] == 0.0f);
                const float o1 = out[(1 * H + h) * SQ * DH + e];
                assert_true(i == 0 ? o1 != 0.0f && isfinite(o1) : o1 == 0.0f);
            }
        assert_int_equal(mha_attention_cached_strided(&tc.c, lens, q, NULL, H, SQ, 1.0f, &ends[i],
                                                      out, NULL, lse), MHA_OK);
        assert_true(lse[0] == -INFINITY);
        assert_true(i == 0 ? isfinite(lse[H * SQ]) : lse[H * SQ] == -INFINITY);
    }
    test_cache_free(&tc);
}

static void heads_bad_args(void **state)
{
    (void)state;
    fill_canary();
    const int32_t bad[][4] = {{0, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, -1, 1}, {1, 1, 1, 0},
                              {INT32_MAX, INT32_MAX, 2, 2}, {1 << 21, 1 << 21, 1 << 21, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(mha_heads_split(out, bad[i][0], bad[i][1], bad[i][2], bad[i][3]),
                         MHA_ERR_SHAPE);
        assert_int_equal(mha_heads_merge(out, bad[i][0], bad[i][1], bad[i][2], bad[i][3]),
                         MHA_ERR_SHAPE);
    }
    assert_int_equal(mha_heads_split(NULL, 1, 2, 2, 1), MHA_ERR_ARG);
    assert_int_equal(mha_heads_merge(NULL, 1, 2, 2, 1), MHA_ERR_ARG);
    assert_untouched();
}

static float wq[H * DH * E], wk[HKV * DH * E], wv[HKV * DH * E], wo[E * H * DH];

static mha_layer_desc good_desc(void)
{
    return (mha_layer_desc){.heads = H, .kv_heads = HKV, .head_dim = DH, .q_in = E,
                            .out_dim = E, .w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
}

static void layer_create_bad_args(void **state)
{
    (void)state;
    mha_layer *sentinel = (mha_layer *)&sentinel, *L = sentinel;
    struct {
        mha_layer_desc d;
        mha_status want;
    } cases[10];
    int n = 0;
    for (int i = 0; i < 10; i++)
        cases[i].d = good_desc();
    cases[n].d.heads = 0, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.kv_heads = 3, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.kv_heads = -2, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.q_in = 0, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.out_dim = -1, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.w_k = NULL, cases[n++].want = MHA_ERR_ARG;
    cases[n].d.w_o = NULL, cases[n++].want = MHA_ERR_ARG;
    cases[n].d.head_dim = INT32_MAX / 2, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.v_head_dim = -1, cases[n++].want = MHA_ERR_SHAPE;
    cases[n].d.v_head_dim = INT32_MAX / 2, cases[n++].want = MHA_ERR_SHAPE; /* heads * dv */
    for (int i = 0; i < n; i++) {
        assert_int_equal(mha_layer_create(&cases[i].d, &L), cases[i].want);
        assert_ptr_equal(L, sentinel);
    }
    assert_int_equal(mha_layer_create(NULL, &L), MHA_ERR_ARG);
    mha_layer_desc d = good_desc();
    assert_int_equal(mha_layer_create(&d, NULL), MHA_ERR_ARG);
    assert_ptr_equal(L, sentinel);
    mha_layer_destroy(NULL);
}

static void layer_calls_bad_args(void **state)
{
    (void)state;
    mha_layer_desc d = good_desc();
    mha_layer *L;
    assert_int_equal(mha_layer_create(&d, &L), MHA_OK);
    const size_t ws_need = mha_layer_workspace_size(L, B, SQ, SKV);
    assert_true(ws_need > 0);
    char *ws = malloc(ws_need);
    const int32_t kl_big[B] = {SKV + 1, 0};
    const mha_mask bad_mask = {.key_lens = kl_big};

    fill_canary();
    assert_int_equal(mha_layer_forward(NULL, x, x, x, B, SQ, SKV, NULL, out, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_layer_forward(L, NULL, x, x, B, SQ, SKV, NULL, out, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_layer_forward(L, x, NULL, x, B, SQ, SKV, NULL, out, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_layer_forward(L, x, x, NULL, B, SQ, SKV, NULL, out, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, SKV, NULL, NULL, NULL, 0), MHA_ERR_ARG);
    assert_int_equal(mha_layer_forward(L, x, x, x, 0, SQ, SKV, NULL, out, NULL, 0), MHA_ERR_SHAPE);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, -1, SKV, NULL, out, NULL, 0), MHA_ERR_SHAPE);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, 0, NULL, out, NULL, 0), MHA_ERR_SHAPE);
    assert_int_equal(mha_layer_forward(L, x, x, x, INT32_MAX, INT32_MAX, INT32_MAX, NULL, out,
                                       NULL, 0), MHA_ERR_SHAPE);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, SKV, &bad_mask, out, NULL, 0),
                     MHA_ERR_MASK);
    memset(ws, CANARY, ws_need);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, SKV, NULL, out, ws, ws_need - 1),
                     MHA_ERR_ARG);
    for (size_t i = 0; i < ws_need; i++)
        assert_int_equal((unsigned char)ws[i], CANARY);
    assert_untouched();

    assert_int_equal(mha_qkv_project(NULL, x, x, x, B, SQ, SKV, out, out2, out3), MHA_ERR_ARG);
    assert_int_equal(mha_qkv_project(L, x, x, x, B, SQ, SKV, NULL, out2, out3), MHA_ERR_ARG);
    assert_int_equal(mha_qkv_project(L, x, x, x, B, SQ, SKV, out, NULL, out3), MHA_ERR_ARG);
    assert_int_equal(mha_qkv_project(L, x, x, x, B, SQ, SKV, out, out2, NULL), MHA_ERR_ARG);
    assert_int_equal(mha_qkv_project(L, x, NULL, x, B, SQ, SKV, out, out2, out3), MHA_ERR_ARG);
    assert_int_equal(mha_qkv_project(L, x, x, x, B, 0, SKV, out, out2, out3), MHA_ERR_SHAPE);
    assert_int_equal(mha_qkv_project(L, x, x, x, B, SQ, INT32_MIN, out, out2, out3),
                     MHA_ERR_SHAPE);
    assert_untouched();

    assert_int_equal(mha_layer_workspace_size(NULL, B, SQ, SKV), 0);
    assert_int_equal(mha_layer_workspace_size(L, 0, SQ, SKV), 0);
    assert_int_equal(mha_layer_workspace_size(L, INT32_MAX, INT32_MAX, 1), 0);
    free(ws);
    mha_layer_destroy(L);
}

/* Modifiers out of range (window < 0, softcap < 0, NaN or infinite), alone or with
   valid fields: MHA_ERR_MASK from each call that takes a mask, with out, lse, the
   cache and lens untouched. */
static void bad_modifiers(void **state)
{
    (void)state;
    mha_layer_desc d = good_desc();
    mha_layer *L;
    assert_int_equal(mha_layer_create(&d, &L), MHA_OK);
    rng r = {31};
    int32_t lens[B] = {2, 1};
    const int32_t lens0[B] = {2, 1};
    test_cache tc;
    assert_true(test_cache_init(&tc, CACHE_BHSD, B, HKV, DH, 0, SKV));
    test_cache_fill(&tc, &r, lens);
    float *img = malloc(sizeof(float) * tc.kn), *vimg = malloc(sizeof(float) * tc.vn);
    memcpy(img, tc.kbuf, sizeof(float) * tc.kn);
    memcpy(vimg, tc.vbuf, sizeof(float) * tc.vn);
    const float slopes[H] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[H] = {1, 2, 3, 4};
    const mha_mask masks[] = {
        {.window = -1},
        {.window = INT32_MIN},
        {.softcap = -1.0f},
        {.softcap = -INFINITY},
        {.softcap = NAN},
        {.softcap = INFINITY},
        {.causal = 1, .window = -3, .softcap = 5.0f, .alibi_slopes = slopes, .sinks = sinks},
        {.causal = 1, .window = 4, .softcap = NAN, .alibi_slopes = slopes, .sinks = sinks},
        {.window = 2, .softcap = INFINITY, .sinks = sinks},
    };
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        const mha_mask *m = &masks[i];
        fill_canary();
        assert_int_equal(mha_attention(&good, q, k, v, 1.0f, m, out, MHA_LAYOUT_BHSD),
                         MHA_ERR_MASK);
        assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, SKV, m, out, NULL, 0),
                         MHA_ERR_MASK);
        assert_int_equal(mha_attention_cached(&tc.c, lens, q, H, SQ, 1.0f, m, out,
                                              MHA_LAYOUT_BSHD, out2), MHA_ERR_MASK);
        assert_int_equal(mha_layer_step(L, x, SQ, &tc.c, lens, m, out, NULL, 0), MHA_ERR_MASK);
        assert_untouched();
        assert_memory_equal(lens, lens0, sizeof lens);
        assert_memory_equal(tc.kbuf, img, sizeof(float) * tc.kn);
        assert_memory_equal(tc.vbuf, vimg, sizeof(float) * tc.vn);
    }
    /* The same calls with every modifier in range work. */
    const mha_mask ok = {.causal = 1, .window = 2, .softcap = 5.0f, .alibi_slopes = slopes,
                         .sinks = sinks};
    assert_int_equal(mha_attention(&good, q, k, v, 1.0f, &ok, out, MHA_LAYOUT_BHSD), MHA_OK);
    assert_int_equal(mha_layer_forward(L, x, x, x, B, SQ, SKV, &ok, out, NULL, 0), MHA_OK);
    assert_int_equal(mha_attention_cached(&tc.c, lens, q, H, SQ, 1.0f, &ok, out, MHA_LAYOUT_BSHD,
                                          out2), MHA_OK);
    assert_int_equal(mha_layer_step(L, x, SQ, &tc.c, lens, &ok, out, NULL, 0), MHA_OK);
    assert_int_equal(lens[0], lens0[0] + SQ);
    free(img);
    free(vimg);
    test_cache_free(&tc);
    mha_layer_destroy(L);
}

static void isa_and_strings(void **state)
{
    (void)state;
    const mha_isa before = mha_isa_active();
    assert_true(mha_isa_available(MHA_ISA_SCALAR));
    assert_int_equal(mha_isa_force((mha_isa)MHA_ISA_COUNT), MHA_ERR_UNSUPPORTED);
    assert_int_equal(mha_isa_force((mha_isa)-1), MHA_ERR_UNSUPPORTED);
    assert_false(mha_isa_available((mha_isa)MHA_ISA_COUNT));
    /* An ISA this CPU lacks (avx512 on an AVX2-only x86, avx2 and avx512 on
       AArch64) is refused before any of its code runs. */
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        if (!mha_isa_available((mha_isa)i)) {
            printf("isa %s: not available here, forcing it must fail\n", mha_isa_name((mha_isa)i));
            assert_int_equal(mha_isa_force((mha_isa)i), MHA_ERR_UNSUPPORTED);
        }
    assert_int_equal(mha_isa_active(), before);
    assert_string_equal(mha_isa_name(MHA_ISA_SCALAR), "scalar");
    assert_string_equal(mha_isa_name(MHA_ISA_AVX2), "avx2");
    assert_string_equal(mha_isa_name(MHA_ISA_NEON), "neon");
    assert_string_equal(mha_isa_name(MHA_ISA_AVX512), "avx512");
    assert_string_equal(mha_isa_name((mha_isa)MHA_ISA_COUNT), "unknown");
    assert_string_equal(mha_isa_name((mha_isa)9), "unknown");
    for (int s = MHA_OK; s <= MHA_ERR_NOMEM; s++)
        assert_non_null(mha_status_str((mha_status)s));
    assert_string_equal(mha_status_str((mha_status)99), "unknown status");
    assert_non_null(strchr(mha_version(), '.'));
}

int main(void)
{
    require_env_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attention_bad_args),    cmocka_unit_test(attention_bad_masks),
        cmocka_unit_test(heads_bad_args),        cmocka_unit_test(layer_create_bad_args),
        cmocka_unit_test(layer_calls_bad_args),  cmocka_unit_test(bad_modifiers),
        cmocka_unit_test(isa_and_strings),       cmocka_unit_test(strided_bad_args),
    };
    return cmocka_run_group_tests_name(mha_isa_name(mha_isa_active()), tests, NULL, NULL);
}
