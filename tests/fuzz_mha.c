/* libFuzzer target: the input chooses dims (v_head_dim included), masks and score
 * modifiers (window, softcap, ALiBi slopes, sinks), key starts and query
 * positions, layout, a cache layout, element type, io type, block table and
 * lengths, and a data seed; every ISA available is run against
 * the scalar reference on attention, cached attention (out and lse), the layer
 * and the head transpose. A mismatch beyond tolerance or a status other than the
 * one the arguments call for aborts (a finding); sanitizers catch the rest. A
 * byte of the input may also make a mask, a modifier or the lengths invalid, which
 * must be refused with MHA_ERR_MASK or MHA_ERR_SHAPE and nothing written. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static uint8_t take(const uint8_t **p, size_t *n)
{
    if (*n == 0)
        return 0;
    (*n)--;
    return *(*p)++;
}

static void require(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_mha: %s\n", what);
        abort();
    }
}

/* Within TOL_ISA, plus one unit in the last place of a 16-bit type t (two results
   rounded from nearby floats). */
static int close_enough(const float *a, const float *b, size_t n, mha_dtype t)
{
    if (t == MHA_F32)
        return tol_ratio_f(a, b, (int64_t)n, TOL_ISA) <= 1.0;
    const int bits = t == MHA_F16 ? 10 : 7;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]) || isinf(a[i]) || isinf(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i])) && a[i] != b[i])
                return 0;
            continue;
        }
        const double ulp = ldexp(1.0, (b[i] == 0.0f ? -24 : ilogb(b[i])) - bits);
        if (fabs(a[i] - b[i]) > ulp + TOL_ISA * (1.0 + fabs(b[i])))
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data;
    size_t n = size;
    const int32_t kv_heads = 1 + take(&p, &n) % 3, group = 1 + take(&p, &n) % 3;
    const int32_t B = 1 + take(&p, &n) % 3, H = kv_heads * group;
    const int32_t Sq = 1 + take(&p, &n) % 40, Skv = 1 + take(&p, &n) % 80;
    const int32_t dh = 1 + take(&p, &n) % 72, E = 1 + take(&p, &n) % 64;
    const uint8_t flags = take(&p, &n), bad = take(&p, &n), shape = take(&p, &n);
    /* dv: head_dim (v_head_dim 0) for half the inputs, else 1..72 */
    const int32_t dv_field = shape & 1 ? 1 + (shape >> 1) % 72 : 0, dv = dv_field ? dv_field : dh;
    const uint8_t cache_byte = take(&p, &n), mods = take(&p, &n), mod_value = take(&p, &n);
    const uint8_t typing = take(&p, &n);
    rng r = {0};
    for (size_t i = 0; i < n; i++)
        r.s = r.s * 131 + p[i];

    const size_t nq = (size_t)B * H * Sq * dh, nkv = (size_t)B * kv_heads * Skv * dh;
    const size_t nv = (size_t)B * kv_heads * Skv * dv, no = (size_t)B * H * Sq * dv;
    float *q = rand_floats(&r, (int64_t)nq, -1, 1), *k = rand_floats(&r, (int64_t)nkv, -1, 1);
    float *v = rand_floats(&r, (int64_t)nv, -1, 1);
    float *bias = rand_floats(&r, (int64_t)B * H * Sq * Skv, -4, 4);
    for (size_t i = 0; i < (size_t)B * H * Sq * Skv; i += 3 + flags % 5)
        bias[i] = -INFINITY;
    int32_t *kl = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *qkl = malloc(sizeof(int32_t) * (size_t)B * Sq);
    for (int32_t b = 0; b < B; b++)
        kl[b] = (int32_t)(rng_uniform(&r, 0, 1) * (float)(Skv + 1)) % (Skv + 1);
    for (int32_t i = 0; i < B * Sq; i++)
        qkl[i] = (int32_t)(rng_uniform(&r, 0, 1) * (float)(Skv + 1)) % (Skv + 1);
    const int64_t sh = (int64_t)Sq * Skv;
    mha_mask mask = {.key_lens = flags & 1 ? kl : NULL, .query_key_lens = flags & 2 ? qkl : NULL,
                     .causal = (flags >> 2) & 1};
    if (flags & 8) {
        mask.bias = bias;
        mask.bias_stride_b = flags & 16 ? sh * H : 0;
        mask.bias_stride_h = flags & 32 ? sh : 0;
        mask.bias_stride_q = flags & 64 ? Skv : 0;
    }
    /* Modifiers, each on for half the inputs: a window of 1 .. Skv + 8 keys, a softcap of
       0.5 .. 32 (with the scale up to 4x, into tanh's flat range), ALiBi slopes of either
       sign (terms up to 20), sinks U(-4, 4) or +20. */
    float *slopes = rand_floats(&r, H, -0.25f, 0.25f), *sinks = rand_floats(&r, H, -4, 4);
    if (mods & 1)
        mask.window = 1 + mod_value % (Skv + 8);
    if (mods & 2)
        mask.softcap = 0.5f * (float)(1 + mod_value / 4);
    if (mods & 4)
        mask.alibi_slopes = slopes;
    if (mods & 8) {
        mask.sinks = sinks;
        if (mods & 16)
            sinks[0] = 20.0f;
    }
    /* Left padding and positions of query rows, each on for a quarter of the inputs. */
    int32_t *starts = malloc(sizeof(int32_t) * (size_t)B), *offsets = malloc(sizeof(int32_t) * (size_t)B);
    for (int32_t b = 0; b < B; b++) {
        starts[b] = (int32_t)(rng_uniform(&r, 0, 1) * (float)(Skv + 1)) % (Skv + 1);
        offsets[b] = (int32_t)rng_uniform(&r, -(float)Sq, (float)Skv);
    }
    if ((mods & 96) == 32)
        mask.key_starts = starts;
    if ((mods & 96) == 64)
        mask.q_offsets = offsets;
    const mha_layout layout = (mha_layout)(flags >> 7);
    const mha_attn_dims d = {B, H, kv_heads, Sq, Skv, dh, dv_field, MHA_F32};
    float *want = malloc(no * sizeof(float)), *got = malloc(no * sizeof(float));
    const float scale = (mods & 2 ? (float)(1 + mod_value % 4) : 1.0f) / sqrtf((float)dh);

    /* An invalid mask, when the input asks for one: refused, nothing written. */
    if (bad % 8 == 1) {
        int32_t saved = kl[0];
        kl[0] = bad & 8 ? -1 : Skv + 1;
        mha_mask broken = mask;
        broken.key_lens = kl;
        memset(got, 0x7f, no * sizeof(float));
        memcpy(want, got, no * sizeof(float));
        require(mha_attention(&d, q, k, v, scale, &broken, got, layout) == MHA_ERR_MASK,
                "invalid key length accepted");
        require(memcmp(got, want, no * sizeof(float)) == 0, "output written on error");
        kl[0] = saved;
    }
    /* An invalid modifier, when the input asks: refused, nothing written. */
    if (bad % 8 == 3) {
        mha_mask broken = mask;
        if (bad & 8)
            broken.window = -1 - mod_value;
        else
            broken.softcap = bad & 64 ? NAN : bad & 128 ? INFINITY : -0.5f;
        memset(got, 0x7f, no * sizeof(float));
        memcpy(want, got, no * sizeof(float));
        require(mha_attention(&d, q, k, v, scale, &broken, got, layout) == MHA_ERR_MASK,
                "invalid modifier accepted");
        require(memcmp(got, want, no * sizeof(float)) == 0, "output written on error");
    }

    /* Layer: self-attention when Sq == Skv, else cross with Skv-long keys. */
    test_layer t;
    test_layer_init_v(&t, &r, H, kv_heads, dh, dv_field, E, 0, 0, (bad & 16) ? E : 0, bad & 32);
    const int32_t width = (bad & 16) ? E : H * dv;
    const size_t nout = (size_t)B * Sq * width;
    float *xq = rand_floats(&r, (int64_t)B * Sq * E, -1, 1);
    float *xk = Sq == Skv ? xq : rand_floats(&r, (int64_t)B * Skv * E, -1, 1);
    float *lw = malloc(nout * sizeof(float)), *lg = malloc(nout * sizeof(float));
    float *tw = malloc(nq * sizeof(float)), *tg = malloc(nq * sizeof(float));

    /* Cached attention: a cache of capacity Skv in the input's layout and element type
       (f32 where the dims refuse q8_0), contiguous or through a shuffled block table
       (a block size that divides Skv), kl as lens (every row past them a NaN, which
       no output may show), q and out f32 or 16-bit, the mask without key_lens. */
    const mha_dtype ctype = (mha_dtype)(typing % 4), io = (mha_dtype)(typing / 4 % 3);
    int32_t bs = typing & 32 ? 1 + (int32_t)(mod_value % (uint8_t)(Skv < 255 ? Skv : 255)) : 0;
    while (bs > 0 && Skv % bs)
        bs--;
    test_cache tc;
    if (!test_cache_init_as(&tc, (cache_kind)(cache_byte % CACHE_KINDS), ctype, io, bs, B, kv_heads,
                            dh, dv_field, Skv, &r)
        && !test_cache_init_as(&tc, CACHE_BHSD, MHA_F32, io, bs, B, kv_heads, dh, dv_field, Skv, &r))
        test_cache_init(&tc, CACHE_BHSD, B, kv_heads, dh, dv_field, Skv);
    /* q in the cache's io type; outputs compared as floats. */
    void *cq = malloc((size_t)mha_row_bytes(tc.c.io_dtype, (int64_t)nq));
    typed_store(tc.c.io_dtype, cq, q, (int32_t)nq);
    test_cache_fill(&tc, &r, kl);
    mha_mask cmask = mask;
    cmask.key_lens = NULL;
    const size_t nl = (size_t)B * H * Sq;
    float *cw = malloc(no * sizeof(float)), *cg = malloc(no * sizeof(float));
    float *ew = malloc(nl * sizeof(float)), *eg = malloc(nl * sizeof(float)); /* lse */
    void *craw = malloc(no * sizeof(float)); /* an output of the io type */
    const mha_layout clayout = (mha_layout)((cache_byte >> 2) & 1);

    /* Lengths outside [0, capacity], when the input asks: refused, nothing written. */
    if (bad % 8 == 2) {
        const int32_t saved = kl[B - 1];
        kl[B - 1] = bad & 8 ? -1 : Skv + 1;
        float *kcopy = malloc(tc.kn * sizeof(float)), *vcopy = malloc(tc.vn * sizeof(float));
        memcpy(kcopy, tc.kbuf, tc.kn * sizeof(float));
        memcpy(vcopy, tc.vbuf, tc.vn * sizeof(float));
        memset(cg, 0x7f, no * sizeof(float));
        memcpy(cw, cg, no * sizeof(float));
        memset(eg, 0x7f, nl * sizeof(float));
        memcpy(ew, eg, nl * sizeof(float));
        require(mha_attention_cached(&tc.c, kl, cq, H, Sq, scale, &cmask, cg, clayout, eg)
                    == MHA_ERR_SHAPE, "invalid cache length accepted");
        require(mha_kv_append(&tc.c, kl, cq, cq, 1) == MHA_ERR_SHAPE, "invalid append accepted");
        require(memcmp(cg, cw, no * sizeof(float)) == 0 && memcmp(eg, ew, nl * sizeof(float)) == 0,
                "cached output written on error");
        require(memcmp(kcopy, tc.kbuf, tc.kn * sizeof(float)) == 0
                    && memcmp(vcopy, tc.vbuf, tc.vn * sizeof(float)) == 0,
                "cache written on error");
        free(kcopy);
        free(vcopy);
        kl[B - 1] = saved;
    }
    /* A block table entry outside the pool for a row the call needs: refused. */
    if (bad % 8 == 4 && tc.table && kl[0] > 0) {
        const int32_t saved = tc.table[0];
        tc.table[0] = bad & 8 ? -1 : tc.c.num_blocks;
        float *kcopy = malloc(tc.kn * sizeof(float));
        memcpy(kcopy, tc.kbuf, tc.kn * sizeof(float));
        memset(cg, 0x7f, no * sizeof(float));
        memcpy(cw, cg, no * sizeof(float));
        require(mha_attention_cached(&tc.c, kl, cq, H, Sq, scale, &cmask, cg, clayout, NULL)
                    == MHA_ERR_ARG, "a block outside the pool accepted");
        /* MHA_ERR_ARG when every sequence has room for the row; else the lengths are
           refused first (MHA_ERR_SHAPE) */
        int32_t room = 1;
        for (int32_t b = 0; b < B; b++)
            room &= kl[b] < Skv;
        const mha_status st = mha_kv_append(&tc.c, kl, cq, cq, 1);
        require(room ? st == MHA_ERR_ARG : st == MHA_ERR_SHAPE,
                "an append through a block outside the pool accepted");
        require(memcmp(cg, cw, no * sizeof(float)) == 0 && memcmp(kcopy, tc.kbuf, tc.kn * sizeof(float)) == 0,
                "written on a bad block table");
        free(kcopy);
        tc.table[0] = saved;
    }
    if (bad % 8 == 3) {
        mha_mask broken = cmask;
        broken.window = -1;
        memset(cg, 0x7f, no * sizeof(float));
        memcpy(cw, cg, no * sizeof(float));
        memset(eg, 0x7f, nl * sizeof(float));
        memcpy(ew, eg, nl * sizeof(float));
        require(mha_attention_cached(&tc.c, kl, cq, H, Sq, scale, &broken, cg, clayout, eg)
                    == MHA_ERR_MASK, "invalid cached modifier accepted");
        require(memcmp(cg, cw, no * sizeof(float)) == 0 && memcmp(eg, ew, nl * sizeof(float)) == 0,
                "cached output written on error");
    }

    const mha_isa start = mha_isa_active();
    require(mha_isa_force(MHA_ISA_SCALAR) == MHA_OK, "force scalar");
    require(mha_attention(&d, q, k, v, scale, &mask, want, layout) == MHA_OK, "scalar attention");
    require(mha_attention_cached(&tc.c, kl, cq, H, Sq, scale, &cmask, craw, clayout, ew) == MHA_OK,
            "scalar cached attention");
    for (size_t i = 0; i < no; i++)
        cw[i] = (float)ref_value(tc.c.io_dtype, craw, (int64_t)i);
    for (size_t i = 0; i < no; i++)
        require(isfinite(cw[i]), "a hidden cache row reached the output");
    require(mha_layer_forward(t.layer, xq, xk, xk, B, Sq, Skv, &mask, lw, NULL, 0) == MHA_OK,
            "scalar layer");
    memcpy(tw, q, nq * sizeof(float));
    require(mha_heads_split(tw, B, Sq, H, dh) == MHA_OK, "scalar split");
    for (int isa = MHA_ISA_SCALAR + 1; isa < MHA_ISA_COUNT; isa++) {
        if (!mha_isa_available((mha_isa)isa))
            continue;
        require(mha_isa_force((mha_isa)isa) == MHA_OK, "force isa");
        require(mha_attention(&d, q, k, v, scale, &mask, got, layout) == MHA_OK, "attention");
        require(close_enough(got, want, no, MHA_F32), "attention differs from scalar");
        require(mha_attention_cached(&tc.c, kl, cq, H, Sq, scale, &cmask, craw, clayout, eg)
                    == MHA_OK, "cached attention");
        for (size_t i = 0; i < no; i++)
            cg[i] = (float)ref_value(tc.c.io_dtype, craw, (int64_t)i);
        require(close_enough(cg, cw, no, tc.c.io_dtype) && close_enough(eg, ew, nl, MHA_F32),
                "cached attention differs from scalar");
        require(mha_layer_forward(t.layer, xq, xk, xk, B, Sq, Skv, &mask, lg, NULL, 0) == MHA_OK,
                "layer");
        require(close_enough(lg, lw, nout, MHA_F32), "layer differs from scalar");
        memcpy(tg, q, nq * sizeof(float));
        require(mha_heads_split(tg, B, Sq, H, dh) == MHA_OK, "split");
        require(memcmp(tg, tw, nq * sizeof(float)) == 0, "split differs from scalar");
        require(mha_heads_merge(tg, B, Sq, H, dh) == MHA_OK, "merge");
        require(memcmp(tg, q, nq * sizeof(float)) == 0, "merge does not undo split");
    }
    mha_isa_force(start);

    if (xk != xq)
        free(xk);
    float *bufs[] = {q, k, v, bias, want, got, xq, lw, lg, tw, tg, cw, cg, ew, eg, slopes, sinks};
    free(cq), free(craw), free(starts), free(offsets);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(kl);
    free(qkl);
    test_layer_free(&t);
    test_cache_free(&tc);
    return 0;
}
