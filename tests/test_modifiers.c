/* The score modifiers of mha_mask (window, softcap, ALiBi slopes, sinks) in all 16
 * combinations, each over every other mask field (key_lens, query_key_lens, a bias
 * with -INFINITY entries, causality, left padding with rows at given positions
 * (key_starts, q_offsets), all at once), GQA, dv != dk and both out
 * layouts, in mha_attention and in mha_attention_cached (the four cache layouts of
 * common.h, lens < capacity, decode and chunked prefill, split-KV lengths): scalar
 * against float64 within TOL_REF, the active ISA against scalar within TOL_ISA, lse
 * included. Every K and V row that no row of a call may see (before every row's
 * window, past the key lengths) holds NaN, so a result that reads one fails; rows
 * that see no key must be exact zeros (lse -INFINITY), sinks or not. Also: a window
 * covering the sequence against no window, sinks against their formula, bitwise
 * results on 1, 2, 3, 7 threads. MHA_TEST_QUICK=1 (valgrind) drops the largest shapes,
 * keeping one split-KV shape of each API for every modifier. */
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

static mha_isa isa;
static int quick;

static void use(mha_isa i)
{
    assert_int_equal(mha_isa_force(i), MHA_OK);
}

static float *alloc_floats(int64_t n)
{
    return filled_floats(n, 0.0f);
}

/* ---- modifier settings ---- */

enum { MOD_WINDOW = 1, MOD_SOFTCAP = 2, MOD_ALIBI = 4, MOD_SINKS = 8, MOD_COMBOS = 16 };

/* Windows at the kernels' tile edges (72 keys), one across split-KV chunks (multiples
   of 64 keys, at least 256), and longer than the sequence: WIN_LONG is the call's
   seq_kv (capacity) + 1. Taken in turn. */
enum { WIN_LONG = -1 };
static const int32_t windows[] = {1, 2, 71, 72, 73, 128, 700, WIN_LONG, 1 << 30};
#define NWIN ((int)(sizeof windows / sizeof *windows))

/* Each softcap with the factor on the scale that spreads raw scores (sd 1/3 at the
   scale 1/sqrt(dk) for U(-1, 1) data) to about the cap, so that many pass 2 caps where
   tanh is flat. Powers of two, see grid_floats. */
static const struct {
    float cap, scale_mul;
} softcaps[] = {{5.0f, 16.0f}, {50.0f, 128.0f}};

/* The sweeps' q and k are U(-1, 1) rounded to multiples of 1/16 and their scales powers
   of two (base_scale: the nearest to 1/sqrt(dk)): every score scale * q.k is then exact
   in float on every ISA, so that scales far above 1/sqrt(dk) test the modifiers rather
   than the rounding of long dot products (test_isa and test_reference measure that at
   PyTorch's scale). */
static void to_grid(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rintf(x[i] * 16.0f) / 16.0f;
}

static float *grid_floats(rng *r, int64_t n)
{
    float *x = rand_floats(r, n, -1, 1);
    to_grid(x, n);
    return x;
}

static float base_scale(int32_t dk)
{
    return exp2f(-rintf(log2f(sqrtf((float)dk))));
}

/* Per-head arrays: ALiBi's slopes 2^(-8(h+1)/H); slopes zero, negative (-8/keys: the
   farthest key gains 8) and positive; sinks U(-3, 3); sinks of +20 (outputs near 0). */
enum { ALIBI_GEOM, ALIBI_SIGNED, SINK_RAND, SINK_BIG, HEAD_ARRAYS };
static const char *const head_array_names[HEAD_ARRAYS] = {"geometric", "signed", "U(-3,3)", "+20"};
typedef struct head_arrays {
    float *a[HEAD_ARRAYS];
} head_arrays;

static void head_arrays_init(head_arrays *ha, rng *r, int32_t heads, int32_t keys)
{
    for (int i = 0; i < HEAD_ARRAYS; i++)
        ha->a[i] = alloc_floats(heads);
    for (int32_t h = 0; h < heads; h++) {
        ha->a[ALIBI_GEOM][h] = exp2f(-8.0f * (float)(h + 1) / (float)heads);
        ha->a[ALIBI_SIGNED][h] = h % 3 == 0 ? 0.0f : h % 3 == 1 ? -8.0f / (float)keys : 0.5f;
        ha->a[SINK_RAND][h] = rng_uniform(r, -3, 3);
        ha->a[SINK_BIG][h] = 20.0f;
    }
}

static void head_arrays_free(head_arrays *ha)
{
    for (int i = 0; i < HEAD_ARRAYS; i++)
        free(ha->a[i]);
}

/* Adds the modifiers of combo to m: the window next in turn (*turn), the softcap, the
   ALiBi slopes and the sinks drawn from r; keys is seq_kv or the capacity. Returns the
   scale and describes the choice in desc. */
static float add_mods(mha_mask *m, int combo, rng *r, int *turn, const head_arrays *ha,
                      int32_t keys, int32_t dk, char *desc, size_t n)
{
    float scale = base_scale(dk);
    int len = snprintf(desc, n, "mods");
    if (combo & MOD_WINDOW) {
        const int32_t w = windows[(*turn)++ % NWIN];
        m->window = w == WIN_LONG ? keys + 1 : w;
        len += snprintf(desc + len, n - (size_t)len, " window=%d", m->window);
    }
    if (combo & MOD_SOFTCAP) {
        const int c = rng_uniform(r, 0, 1) < 0.5f;
        m->softcap = softcaps[c].cap;
        scale *= softcaps[c].scale_mul;
        len += snprintf(desc + len, n - (size_t)len, " softcap=%g scale=%g", (double)m->softcap,
                        (double)scale);
    }
    if (combo & MOD_ALIBI) {
        const int a = rng_uniform(r, 0, 1) < 0.5f ? ALIBI_GEOM : ALIBI_SIGNED;
        m->alibi_slopes = ha->a[a];
        len += snprintf(desc + len, n - (size_t)len, " alibi=%s", head_array_names[a]);
    }
    if (combo & MOD_SINKS) {
        const int s = rng_uniform(r, 0, 1) < 0.5f ? SINK_RAND : SINK_BIG;
        m->sinks = ha->a[s];
        snprintf(desc + len, n - (size_t)len, " sinks=%s", head_array_names[s]);
    }
    return scale;
}

/* ---- the other mask fields ---- */

/* M_KL and key_lens in M_ALL only for mha_attention (the cache takes lens instead). */
enum { M_NONE, M_KL, M_QKL, M_BIAS, M_CAUSAL, M_POS, M_ALL, M_COUNT };
static const char *const mask_names[M_COUNT] = {"none", "key_lens", "query_key_lens", "bias",
                                                "causal", "positions", "all"};
typedef struct base_masks {
    int32_t *kl, *qkl, *starts, *offsets;
    float *bias;
    mha_mask m[M_COUNT];
} base_masks;

/* keys is seq_kv or the capacity. Key and per-row lengths anywhere in [0, keys] for up
   to 159 keys, else at most 159 short of keys: ALiBi terms then stay below ~100 in
   magnitude, where float scores hold the tolerances (alibi_far_keys tests far keys
   alone). Bias (b,h,i,j) U(-2, 2) with -INFINITY every 7th element. */
static void base_masks_init(base_masks *bm, rng *r, int32_t B, int32_t H, int32_t Sq,
                            int32_t keys, int cached)
{
    bm->kl = malloc(sizeof(int32_t) * (size_t)B);
    bm->qkl = malloc(sizeof(int32_t) * (size_t)B * Sq);
    const int32_t span = keys < 159 ? keys + 1 : 160;
    for (int32_t b = 0; b < B; b++)
        bm->kl[b] = keys - (b * 37 + 11) % span;
    for (int32_t i = 0; i < B * Sq; i++)
        bm->qkl[i] = keys - (i * 13 + 5) % span;
    /* Left padding up to 159 keys short of keys, so ALiBi terms stay as small as above;
       rows top-left (0), before key 0 (-3), ending 40 keys early, and past the keys. */
    bm->starts = malloc(sizeof(int32_t) * (size_t)B);
    bm->offsets = malloc(sizeof(int32_t) * (size_t)B);
    for (int32_t b = 0; b < B; b++) {
        bm->starts[b] = keys < 159 ? (b * 29 + 3) % (keys + 1) : keys - 150 + (b * 29) % 40;
        const int32_t at[4] = {0, -3, keys - Sq - 40, keys + 5};
        bm->offsets[b] = at[(b + Sq + keys) % 4];
    }
    const int64_t n = (int64_t)B * H * Sq * keys, sh = (int64_t)Sq * keys;
    bm->bias = rand_floats(r, n, -2, 2);
    for (int64_t i = 3; i < n; i += 7)
        bm->bias[i] = -INFINITY;
    const int32_t *kl = cached ? NULL : bm->kl;
    const mha_mask m[M_COUNT] = {
        [M_NONE] = {0},
        [M_KL] = {.key_lens = kl},
        [M_QKL] = {.query_key_lens = bm->qkl},
        [M_BIAS] = {.bias = bm->bias, .bias_stride_b = sh * H, .bias_stride_h = sh,
                    .bias_stride_q = keys},
        [M_CAUSAL] = {.causal = 1},
        [M_POS] = {.causal = 1, .key_starts = bm->starts, .q_offsets = bm->offsets},
        [M_ALL] = {.key_lens = kl, .query_key_lens = bm->qkl, .causal = 1, .bias = bm->bias,
                   .bias_stride_b = sh * H, .bias_stride_h = sh, .bias_stride_q = keys,
                   .key_starts = bm->starts, .q_offsets = bm->offsets},
    };
    memcpy(bm->m, m, sizeof m);
}

static void base_masks_free(base_masks *bm)
{
    free(bm->kl);
    free(bm->qkl);
    free(bm->starts);
    free(bm->offsets);
    free(bm->bias);
}

/* mha.h's rules: row i of sequence b, with `keys` keys (seq_kv, or lens[b] for the
   cache), sits at p = keys - seq_q + i (or q_offsets[b] + i) and may see keys [*begin,
   *end) (lengths, starts, causality, window); a -INFINITY bias hides more. */
static void row_keys(const mha_mask *m, int32_t b, int32_t i, int32_t seq_q, int32_t keys,
                     int32_t *begin, int32_t *end)
{
    const int64_t pos = m->q_offsets ? (int64_t)m->q_offsets[b] + i : (int64_t)keys - seq_q + i;
    int64_t e = keys, s = 0;
    if (m->key_lens && m->key_lens[b] < e)
        e = m->key_lens[b];
    if (m->query_key_lens && m->query_key_lens[(int64_t)b * seq_q + i] < e)
        e = m->query_key_lens[(int64_t)b * seq_q + i];
    if (m->causal && pos + 1 < e)
        e = pos + 1;
    if (m->window > 0)
        s = pos - m->window + 1;
    if (m->key_starts && m->key_starts[b] > s)
        s = m->key_starts[b];
    *end = e < 0 ? 0 : (int32_t)e;
    *begin = s < 0 ? 0 : s > *end ? *end : (int32_t)s;
}

/* Does row (b, h, i) see any key: one in its range whose bias is not -INFINITY? */
static int row_sees(const mha_mask *m, int32_t b, int32_t h, int32_t i, int32_t seq_q,
                    int32_t keys)
{
    int32_t begin, end;
    row_keys(m, b, i, seq_q, keys, &begin, &end);
    if (!m->bias)
        return begin < end;
    const float *br = m->bias + b * m->bias_stride_b + h * m->bias_stride_h + i * m->bias_stride_q;
    for (int32_t j = begin; j < end; j++)
        if (br[j] != -INFINITY)
            return 1;
    return 0;
}

/* seen[j] (j < keys): some row of sequence b may see key j. */
static void keys_seen(const mha_mask *m, int32_t b, int32_t seq_q, int32_t keys,
                      unsigned char *seen)
{
    memset(seen, 0, (size_t)keys);
    for (int32_t i = 0; i < seq_q; i++) {
        int32_t begin, end;
        row_keys(m, b, i, seq_q, keys, &begin, &end);
        memset(seen + begin, 1, (size_t)(end - begin));
    }
}

static void fill_nan(float *x, int32_t n)
{
    for (int32_t e = 0; e < n; e++)
        x[e] = NAN;
}

static int64_t out_index(mha_layout layout, int32_t b, int32_t h, int32_t i, int32_t H,
                         int32_t Sq, int32_t dv)
{
    return layout == MHA_LAYOUT_BHSD ? (((int64_t)b * H + h) * Sq + i) * dv
                                     : (((int64_t)b * Sq + i) * H + h) * dv;
}

/* Fails unless every output is finite (the data a call may read is), every row that
   sees no key is exact zeros and its lse (when lse is not NULL) -INFINITY; keys[b] as
   for row_keys. */
static void check_rows(const float *out, const float *lse, const mha_mask *m, int32_t B,
                       int32_t H, int32_t Sq, int32_t dv, const int32_t *keys, mha_layout layout,
                       const char *side, const char *what)
{
    for (int64_t e = 0; e < (int64_t)B * H * Sq * dv; e++)
        if (!isfinite(out[e]))
            fail_msg("%s: %s out[%lld] = %g: read a key no row may see", what, side, (long long)e,
                     (double)out[e]);
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < H; h++)
            for (int32_t i = 0; i < Sq; i++) {
                if (row_sees(m, b, h, i, Sq, keys[b]))
                    continue;
                const float *o = out + out_index(layout, b, h, i, H, Sq, dv);
                for (int32_t e = 0; e < dv; e++)
                    if (o[e] != 0.0f)
                        fail_msg("%s: %s b=%d h=%d row %d sees no key but out[%d] = %g", what,
                                 side, b, h, i, e, (double)o[e]);
                if (lse && lse[((int64_t)b * H + h) * Sq + i] != -INFINITY)
                    fail_msg("%s: %s b=%d h=%d row %d sees no key but lse = %g", what, side, b,
                             h, i, (double)lse[((int64_t)b * H + h) * Sq + i]);
            }
}

/* ---- mha_attention ---- */

typedef struct plain {
    mha_attn_dims d;
    int32_t dv;
    int64_t nq, nk, nv, no;
} plain;

static plain plain_of(const mha_attn_dims *d)
{
    plain p = {.d = *d, .dv = d->v_head_dim ? d->v_head_dim : d->head_dim};
    const int64_t rows = (int64_t)d->batch * d->heads * d->seq_q;
    const int64_t kv = (int64_t)d->batch * d->kv_heads * d->seq_kv;
    p.nq = rows * d->head_dim, p.no = rows * p.dv, p.nk = kv * d->head_dim, p.nv = kv * p.dv;
    return p;
}

/* kp, vp = k, v with NaN in every row that no query row of the call may see. */
static void poison_plain(const plain *p, const mha_mask *m, const float *k, const float *v,
                         float *kp, float *vp)
{
    const mha_attn_dims *d = &p->d;
    memcpy(kp, k, sizeof(float) * (size_t)p->nk);
    memcpy(vp, v, sizeof(float) * (size_t)p->nv);
    unsigned char *seen = malloc((size_t)d->seq_kv);
    for (int32_t b = 0; b < d->batch; b++) {
        keys_seen(m, b, d->seq_q, d->seq_kv, seen);
        for (int32_t g = 0; g < d->kv_heads; g++)
            for (int32_t j = 0; j < d->seq_kv; j++)
                if (!seen[j]) {
                    const int64_t row = ((int64_t)b * d->kv_heads + g) * d->seq_kv + j;
                    fill_nan(kp + row * d->head_dim, d->head_dim);
                    fill_nan(vp + row * p->dv, p->dv);
                }
    }
    free(seen);
}

/* One call on the active ISA and on scalar: scalar against float64 within TOL_REF, the
   ISA against scalar within TOL_ISA, check_rows on both. */
static void check_plain(const plain *p, const float *q, const float *k, const float *v,
                        float scale, const mha_mask *m, mha_layout layout, const char *what)
{
    const mha_attn_dims *d = &p->d;
    float *got = alloc_floats(p->no), *want = alloc_floats(p->no);
    double *ref = malloc(sizeof(double) * (size_t)p->no);
    mha_status st = mha_attention(d, q, k, v, scale, m, got, layout);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    use(MHA_ISA_SCALAR);
    st = mha_attention(d, q, k, v, scale, m, want, layout);
    use(isa);
    assert_int_equal(st, MHA_OK);
    int32_t *keys = malloc(sizeof(int32_t) * (size_t)d->batch);
    for (int32_t b = 0; b < d->batch; b++)
        keys[b] = d->seq_kv;
    check_rows(want, NULL, m, d->batch, d->heads, d->seq_q, p->dv, keys, layout, "scalar", what);
    check_rows(got, NULL, m, d->batch, d->heads, d->seq_q, p->dv, keys, layout,
               mha_isa_name(isa), what);
    ref_attention(d, q, k, v, scale, m, ref, layout);
    const double r_ref = tol_ratio(want, ref, p->no, TOL_REF);
    const double r_isa = tol_ratio_f(got, want, p->no, TOL_ISA);
    if (r_ref > 1.0)
        fail_msg("%s: scalar vs float64: %.3g x tolerance", what, r_ref);
    if (r_isa > 1.0)
        fail_msg("%s: %s vs scalar: %.3g x tolerance", what, mha_isa_name(isa), r_isa);
    free(keys);
    free(got);
    free(want);
    free(ref);
}

/* Every modifier combination with each mask of the list, for one shape; K and V
   poisoned per call. turn: the window turn, kept across shapes. */
static void sweep_plain(rng *r, const mha_attn_dims *d, int *turn)
{
    const plain p = plain_of(d);
    float *q = grid_floats(r, p.nq), *k = grid_floats(r, p.nk);
    float *v = rand_floats(r, p.nv, -1, 1);
    float *kp = alloc_floats(p.nk), *vp = alloc_floats(p.nv);
    head_arrays ha;
    head_arrays_init(&ha, r, d->heads, d->seq_kv);
    base_masks bm;
    base_masks_init(&bm, r, d->batch, d->heads, d->seq_q, d->seq_kv, 0);
    char mods[160], what[320];
    for (int mi = 0; mi < M_COUNT; mi++)
        for (int combo = 0; combo < MOD_COMBOS; combo++) {
            mha_mask m = bm.m[mi];
            const float scale = add_mods(&m, combo, r, turn, &ha, d->seq_kv, d->head_dim, mods,
                                         sizeof mods);
            const mha_layout layout = (mha_layout)(rng_uniform(r, 0, 1) < 0.5f);
            snprintf(what, sizeof what,
                     "attention B=%d H=%d Hkv=%d Sq=%d Skv=%d dk=%d dv=%d mask %s %s layout %d",
                     d->batch, d->heads, d->kv_heads, d->seq_q, d->seq_kv, d->head_dim, p.dv,
                     mask_names[mi], mods, (int)layout);
            poison_plain(&p, &m, k, v, kp, vp);
            check_plain(&p, q, kp, vp, scale, &m, layout, what);
        }
    base_masks_free(&bm);
    head_arrays_free(&ha);
    float *bufs[] = {q, k, v, kp, vp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
}

/* Tails of the tiles (72 keys, 16/48/96 rows), GQA groups of 1 to 8, dv below and
   above dk, seq_q above seq_kv (rows before key 0), decode; and few (b, kv head)
   pairs over > 512 keys, which cuts the keys into chunks. */
static const mha_attn_dims plain_shapes[] = {
    {2, 4, 2, 37, 150, 64, 0, MHA_F32}, {3, 3, 3, 6, 73, 20, 0, MHA_F32},      {1, 8, 1, 65, 33, 80, 96, MHA_F32},
    {2, 4, 1, 17, 145, 192, 128, MHA_F32}, {2, 2, 1, 1, 129, 128, 0, MHA_F32}, {1, 4, 4, 100, 200, 65, 7, MHA_F32},
};
static const mha_attn_dims plain_split[] = {
    {1, 2, 1, 1, 600, 16, 0, MHA_F32}, /* two chunks, small enough for MHA_TEST_QUICK */
    {1, 2, 1, 3, 3000, 64, 32, MHA_F32}, {1, 8, 2, 1, 2100, 128, 0, MHA_F32}, {2, 4, 1, 1, 1000, 80, 96, MHA_F32},
};

static int too_big_plain(const mha_attn_dims *d, double flops)
{
    const plain p = plain_of(d);
    return quick && (double)(p.nq / d->head_dim) * d->seq_kv * (d->head_dim + p.dv) > flops;
}

static void modifiers_attention(void **state)
{
    (void)state;
    rng r = {301};
    int turn = 0;
    for (size_t i = 0; i < sizeof plain_shapes / sizeof *plain_shapes; i++)
        if (!too_big_plain(&plain_shapes[i], 1e6))
            sweep_plain(&r, &plain_shapes[i], &turn);
}

static void modifiers_attention_split(void **state)
{
    (void)state;
    rng r = {302};
    int turn = 3;
    for (size_t i = 0; i < sizeof plain_split / sizeof *plain_split; i++)
        if (!too_big_plain(&plain_split[i], 1e6))
            sweep_plain(&r, &plain_split[i], &turn);
}

/* ---- mha_attention_cached ---- */

typedef struct shape {
    int32_t batch, heads, kv_heads, dk, dv, capacity, seq_q;
    int32_t lens[3];
} shape;

static int64_t shape_rows(const shape *s)
{
    return (int64_t)s->batch * s->heads * s->seq_q;
}

static int too_big(const shape *s, double flops)
{
    return quick && (double)shape_rows(s) * s->capacity * (s->dk + s->dv) > flops;
}

/* The cache's rows j < lens[b] restored from the images k0, v0 of its allocations, then
   NaN in those that no query row of the call may see. */
static void poison_cache(test_cache *tc, const float *k0, const float *v0, const shape *s,
                         const mha_mask *m)
{
    memcpy(tc->kbuf, k0, sizeof(float) * tc->kn);
    if (tc->vbuf != tc->kbuf)
        memcpy(tc->vbuf, v0, sizeof(float) * tc->vn);
    unsigned char *seen = malloc((size_t)s->capacity + 1);
    for (int32_t b = 0; b < s->batch; b++) {
        keys_seen(m, b, s->seq_q, s->lens[b], seen);
        for (int32_t g = 0; g < s->kv_heads; g++)
            for (int32_t j = 0; j < s->lens[b]; j++)
                if (!seen[j]) {
                    fill_nan(cache_k_row(&tc->c, b, g, j), s->dk);
                    fill_nan(cache_v_row(&tc->c, b, g, j), s->dv);
                }
    }
    free(seen);
}

/* As check_plain, for the cache, lse included. */
static void check_cached(const shape *s, const mha_kv_cache *c, const float *q, float scale,
                         const mha_mask *m, mha_layout layout, const char *what)
{
    const int64_t nl = shape_rows(s), no = nl * s->dv;
    float *got = alloc_floats(no), *want = alloc_floats(no);
    float *got_lse = alloc_floats(nl), *want_lse = alloc_floats(nl);
    double *ref = malloc(sizeof(double) * (size_t)no);
    double *ref_lse = malloc(sizeof(double) * (size_t)nl);
    mha_status st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, m, got, layout,
                                         got_lse);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    use(MHA_ISA_SCALAR);
    st = mha_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, m, want, layout,
                              want_lse);
    use(isa);
    assert_int_equal(st, MHA_OK);
    check_rows(want, want_lse, m, s->batch, s->heads, s->seq_q, s->dv, s->lens, layout, "scalar",
               what);
    check_rows(got, got_lse, m, s->batch, s->heads, s->seq_q, s->dv, s->lens, layout,
               mha_isa_name(isa), what);
    ref_attention_cached(c, s->lens, q, s->heads, s->seq_q, scale, m, ref, layout, ref_lse);
    const double r_out = tol_ratio(want, ref, no, TOL_REF);
    const double r_lse = tol_ratio(want_lse, ref_lse, nl, TOL_REF);
    const double i_out = tol_ratio_f(got, want, no, TOL_ISA);
    const double i_lse = tol_ratio_f(got_lse, want_lse, nl, TOL_ISA);
    if (r_out > 1.0 || r_lse > 1.0)
        fail_msg("%s: scalar vs float64: out %.3g, lse %.3g x tolerance", what, r_out, r_lse);
    if (i_out > 1.0 || i_lse > 1.0)
        fail_msg("%s: %s vs scalar: out %.3g, lse %.3g x tolerance", what, mha_isa_name(isa),
                 i_out, i_lse);
    free(got);
    free(want);
    free(got_lse);
    free(want_lse);
    free(ref);
    free(ref_lse);
}

/* Every modifier combination with each mask but key_lens (the cache's lens take its
   place), for one shape; the cache kind and out layout vary from call to call. */
static void sweep_cached(rng *r, const shape *s, int *turn)
{
    float *q = grid_floats(r, shape_rows(s) * s->dk);
    head_arrays ha;
    head_arrays_init(&ha, r, s->heads, s->capacity);
    base_masks bm;
    base_masks_init(&bm, r, s->batch, s->heads, s->seq_q, s->capacity, 1);
    test_cache tc[CACHE_KINDS];
    float *k0[CACHE_KINDS], *v0[CACHE_KINDS];
    int have[CACHE_KINDS];
    for (int kind = 0; kind < CACHE_KINDS; kind++) {
        have[kind] = test_cache_init(&tc[kind], (cache_kind)kind, s->batch, s->kv_heads, s->dk,
                                     s->dv == s->dk ? 0 : s->dv, s->capacity);
        if (!have[kind])
            continue;
        test_cache_fill(&tc[kind], r, s->lens);
        for (int32_t b = 0; b < s->batch; b++)
            for (int32_t g = 0; g < s->kv_heads; g++)
                for (int32_t j = 0; j < s->lens[b]; j++)
                    to_grid(cache_k_row(&tc[kind].c, b, g, j), s->dk);
        k0[kind] = alloc_floats((int64_t)tc[kind].kn);
        v0[kind] = alloc_floats((int64_t)tc[kind].vn);
        memcpy(k0[kind], tc[kind].kbuf, sizeof(float) * tc[kind].kn);
        memcpy(v0[kind], tc[kind].vbuf, sizeof(float) * tc[kind].vn);
    }
    char mods[160], what[320];
    int call = 0;
    for (int mi = 0; mi < M_COUNT; mi++)
        for (int combo = 0; combo < MOD_COMBOS && mi != M_KL; combo++, call++) {
            mha_mask m = bm.m[mi];
            const float scale = add_mods(&m, combo, r, turn, &ha, s->capacity, s->dk, mods,
                                         sizeof mods);
            const mha_layout layout = (mha_layout)(rng_uniform(r, 0, 1) < 0.5f);
            int kind = call % CACHE_KINDS;
            while (!have[kind])
                kind = (kind + 1) % CACHE_KINDS;
            snprintf(what, sizeof what,
                     "cached B=%d H=%d Hkv=%d dk=%d dv=%d cap=%d Sq=%d lens=%d,%d,%d cache %s "
                     "mask %s %s layout %d",
                     s->batch, s->heads, s->kv_heads, s->dk, s->dv, s->capacity, s->seq_q,
                     s->lens[0], s->lens[1], s->lens[2], cache_kind_name((cache_kind)kind),
                     mask_names[mi], mods, (int)layout);
            poison_cache(&tc[kind], k0[kind], v0[kind], s, &m);
            check_cached(s, &tc[kind].c, q, scale, &m, layout, what);
        }
    for (int kind = 0; kind < CACHE_KINDS; kind++)
        if (have[kind]) {
            test_cache_free(&tc[kind]);
            free(k0[kind]);
            free(v0[kind]);
        }
    base_masks_free(&bm);
    head_arrays_free(&ha);
    free(q);
}

/* Decode and chunked prefill, lens < capacity, lens = capacity, lens 0 and lens <
   seq_q (rows before key 0), GQA, dv below and above dk (no latent cache then). */
static const shape cached_shapes[] = {
    {2, 4, 2, 64, 64, 160, 1, {150, 77}},  {2, 8, 1, 128, 128, 90, 3, {2, 73}},
    {1, 4, 4, 65, 33, 200, 100, {180}},     {2, 4, 2, 192, 128, 80, 17, {80, 40}},
    {3, 2, 1, 20, 48, 75, 5, {0, 74, 30}},
};
/* Few (b, kv head) pairs over long caches: keys cut into chunks, merged with the sink. */
static const shape cached_split[] = {
    {1, 2, 1, 16, 24, 600, 1, {600}}, /* two chunks, small enough for MHA_TEST_QUICK */
    {1, 8, 1, 128, 128, 5000, 1, {4900}}, {1, 4, 2, 64, 64, 4100, 1, {4099}},
    {1, 2, 1, 64, 96, 3000, 3, {2999}},   {2, 4, 1, 64, 64, 3000, 1, {2800, 700}},
    {1, 8, 1, 32, 32, 2000, 20, {1990}},
};

static void modifiers_cached(void **state)
{
    (void)state;
    rng r = {303};
    int turn = 5;
    for (size_t i = 0; i < sizeof cached_shapes / sizeof *cached_shapes; i++)
        if (!too_big(&cached_shapes[i], 1e6))
            sweep_cached(&r, &cached_shapes[i], &turn);
}

static void modifiers_cached_split(void **state)
{
    (void)state;
    rng r = {304};
    int turn = 7;
    for (size_t i = 0; i < sizeof cached_split / sizeof *cached_split; i++)
        if (!too_big(&cached_split[i], 1e6))
            sweep_cached(&r, &cached_split[i], &turn);
}

/* ---- special cases ---- */

/* Rows whose whole window lies past key_lens (or query_key_lens) see no key: zeros and
   lse -INFINITY with every modifier on, sinks included; the cases must occur. */
static void empty_windows(void **state)
{
    (void)state;
    rng r = {305};
    const mha_attn_dims d = {2, 4, 2, 20, 100, 32, 16, MHA_F32};
    const plain p = plain_of(&d);
    float *q = rand_floats(&r, p.nq, -1, 1), *k = rand_floats(&r, p.nk, -1, 1);
    float *v = rand_floats(&r, p.nv, -1, 1);
    head_arrays ha;
    head_arrays_init(&ha, &r, d.heads, d.seq_kv);
    /* rows at 80..99, window 8: b = 0 sees keys only from rows 0..11, b = 1 none */
    const int32_t kl[2] = {85, 0};
    for (int s = SINK_RAND; s <= SINK_BIG; s++) {
        const mha_mask m = {.key_lens = kl, .window = 8, .softcap = 5.0f,
                            .alibi_slopes = ha.a[ALIBI_GEOM], .sinks = ha.a[s]};
        int32_t empty = 0, keys[2] = {d.seq_kv, d.seq_kv};
        for (int32_t b = 0; b < d.batch; b++)
            for (int32_t i = 0; i < d.seq_q; i++)
                empty += !row_sees(&m, b, 0, i, d.seq_q, keys[b]);
        assert_int_equal(empty, 8 + 20);
        float *kp = alloc_floats(p.nk), *vp = alloc_floats(p.nv);
        poison_plain(&p, &m, k, v, kp, vp);
        check_plain(&p, q, kp, vp, 0.25f, &m, MHA_LAYOUT_BSHD, "empty windows, attention");
        free(kp);
        free(vp);
    }
    /* The cache: lens 90 and 60, rows at 70..89 and 40..59, window 8; per-row lengths
       below some windows. */
    const shape s = {2, 4, 2, 32, 16, 96, 20, {90, 60}};
    int32_t qkl[40];
    for (int32_t i = 0; i < 40; i++)
        qkl[i] = i % 2 ? 96 : 70;
    test_cache tc;
    assert_true(test_cache_init(&tc, CACHE_BSHD, s.batch, s.kv_heads, s.dk, s.dv, s.capacity));
    test_cache_fill(&tc, &r, s.lens);
    float *k0 = alloc_floats((int64_t)tc.kn), *v0 = alloc_floats((int64_t)tc.vn);
    memcpy(k0, tc.kbuf, sizeof(float) * tc.kn);
    memcpy(v0, tc.vbuf, sizeof(float) * tc.vn);
    for (int sk = SINK_RAND; sk <= SINK_BIG; sk++) {
        const mha_mask m = {.query_key_lens = qkl, .window = 8, .softcap = 50.0f, .causal = 1,
                            .alibi_slopes = ha.a[ALIBI_SIGNED], .sinks = ha.a[sk]};
        int32_t empty = 0;
        for (int32_t b = 0; b < s.batch; b++)
            for (int32_t i = 0; i < s.seq_q; i++)
                empty += !row_sees(&m, b, 0, i, s.seq_q, s.lens[b]);
        assert_true(empty > 0 && empty < s.batch * s.seq_q);
        poison_cache(&tc, k0, v0, &s, &m);
        check_cached(&s, &tc.c, q, 0.25f, &m, MHA_LAYOUT_BHSD, "empty windows, cached");
    }
    test_cache_free(&tc);
    free(k0);
    free(v0);
    head_arrays_free(&ha);
    free(q);
    free(k);
    free(v);
}

/* Rows whose visible keys all lie about 20000 positions back (key_lens, query_key_lens):
   with the standard slopes of 8 heads (2^-1 .. 2^-8) their ALiBi terms reach -10000;
   U(-1, 1) data at scale 1/sqrt(dk), inside mha.h's accuracy contract. */
static void alibi_far_keys(void **state)
{
    (void)state;
    rng r = {309};
    const mha_attn_dims d = {1, 8, 1, 4, 20000, 64, 0, MHA_F32};
    const plain p = plain_of(&d);
    float *q = rand_floats(&r, p.nq, -1, 1), *k = rand_floats(&r, p.nk, -1, 1);
    float *v = rand_floats(&r, p.nv, -1, 1);
    head_arrays ha;
    head_arrays_init(&ha, &r, d.heads, d.seq_kv);
    const int32_t kl[1] = {8}, qkl[4] = {8, 8, 8, 8};
    const mha_mask m = {.key_lens = kl, .alibi_slopes = ha.a[ALIBI_GEOM]};
    check_plain(&p, q, k, v, 0.125f, &m, MHA_LAYOUT_BHSD, "alibi far keys, attention");
    const shape s = {1, 8, 1, 64, 64, 20000, 4, {20000}};
    test_cache tc;
    assert_true(test_cache_init(&tc, CACHE_BHSD, 1, 1, 64, 0, 20000));
    test_cache_fill(&tc, &r, s.lens);
    const mha_mask cm = {.query_key_lens = qkl, .alibi_slopes = ha.a[ALIBI_GEOM]};
    check_cached(&s, &tc.c, q, 0.125f, &cm, MHA_LAYOUT_BSHD, "alibi far keys, cached");
    test_cache_free(&tc);
    head_arrays_free(&ha);
    free(q);
    free(k);
    free(v);
}

/* A window covering every row's keys (seq_kv, seq_kv + 1, 2^30; capacity for the
   cache) against no window: within TOL_ISA on the same ISA (mha.h promises equal math,
   not equal bits), other modifiers on. */
static void long_window(void **state)
{
    (void)state;
    rng r = {306};
    const mha_attn_dims d = {2, 4, 2, 30, 150, 64, 48, MHA_F32};
    const plain p = plain_of(&d);
    float *q = rand_floats(&r, p.nq, -1, 1), *k = rand_floats(&r, p.nk, -1, 1);
    float *v = rand_floats(&r, p.nv, -1, 1);
    float *plain_out = alloc_floats(p.no), *win_out = alloc_floats(p.no);
    head_arrays ha;
    head_arrays_init(&ha, &r, d.heads, d.seq_kv);
    const int32_t wins[] = {d.seq_kv, d.seq_kv + 1, 1 << 30};
    const mha_mask base = {.causal = 1, .softcap = 5.0f, .alibi_slopes = ha.a[ALIBI_SIGNED],
                           .sinks = ha.a[SINK_RAND]};
    assert_int_equal(mha_attention(&d, q, k, v, 2.0f, &base, plain_out, MHA_LAYOUT_BHSD), MHA_OK);
    for (size_t w = 0; w < sizeof wins / sizeof *wins; w++) {
        mha_mask m = base;
        m.window = wins[w];
        assert_int_equal(mha_attention(&d, q, k, v, 2.0f, &m, win_out, MHA_LAYOUT_BHSD), MHA_OK);
        const double ratio = tol_ratio_f(win_out, plain_out, p.no, TOL_ISA);
        if (ratio > 1.0)
            fail_msg("attention window %d vs none: %.3g x tolerance", m.window, ratio);
    }
    const shape s = {2, 8, 2, 64, 64, 700, 3, {700, 650}};
    const int64_t nl = shape_rows(&s), no = nl * s.dv;
    float *cq = rand_floats(&r, nl * s.dk, -1, 1);
    float *o[2] = {alloc_floats(no), alloc_floats(no)}, *l[2] = {alloc_floats(nl), alloc_floats(nl)};
    test_cache tc;
    assert_true(test_cache_init(&tc, CACHE_BHSD, s.batch, s.kv_heads, s.dk, 0, s.capacity));
    test_cache_fill(&tc, &r, s.lens);
    head_arrays ch;
    head_arrays_init(&ch, &r, s.heads, s.capacity);
    const int32_t cwins[] = {0, s.capacity, 1 << 30};
    for (size_t w = 0; w < sizeof cwins / sizeof *cwins; w++) {
        const mha_mask m = {.window = cwins[w], .softcap = 50.0f, .alibi_slopes = ch.a[ALIBI_GEOM],
                            .sinks = ch.a[SINK_RAND]};
        const int dst = w > 0;
        assert_int_equal(mha_attention_cached(&tc.c, s.lens, cq, s.heads, s.seq_q, 0.5f, &m,
                                              o[dst], MHA_LAYOUT_BSHD, l[dst]), MHA_OK);
        const double ro = tol_ratio_f(o[1], o[0], no, TOL_ISA);
        const double rl = tol_ratio_f(l[1], l[0], nl, TOL_ISA);
        if (w > 0 && (ro > 1.0 || rl > 1.0))
            fail_msg("cached window %d vs none: out %.3g, lse %.3g x tolerance", m.window, ro, rl);
    }
    test_cache_free(&tc);
    head_arrays_free(&ch);
    head_arrays_free(&ha);
    float *bufs[] = {q, k, v, plain_out, win_out, cq, o[0], o[1], l[0], l[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
}

/* The sink only joins the denominator: lse is the same with or without it, and
   out_sink = out / (1 + exp(sink - lse)) row by row (split-KV and not); a sink of +20
   with scores near 0 leaves every output below 1e-4 in magnitude. */
static void sink_formula(void **state)
{
    (void)state;
    rng r = {307};
    const shape shapes[] = {{2, 4, 2, 64, 32, 300, 5, {300, 41}}, {1, 8, 1, 64, 64, 3000, 1, {2990}}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        const int64_t nl = shape_rows(s), no = nl * s->dv;
        float *q = rand_floats(&r, nl * s->dk, -1, 1);
        test_cache tc;
        assert_true(test_cache_init(&tc, CACHE_BHSD, s->batch, s->kv_heads, s->dk, s->dv,
                                    s->capacity));
        test_cache_fill(&tc, &r, s->lens);
        head_arrays ha;
        head_arrays_init(&ha, &r, s->heads, s->capacity);
        float *o0 = alloc_floats(no), *l0 = alloc_floats(nl), *o1 = alloc_floats(no);
        float *l1 = alloc_floats(nl), *scaled = alloc_floats(no);
        const float scale = 1.0f / sqrtf((float)s->dk);
        const mha_mask plain_m = {.causal = 1, .window = 1000, .alibi_slopes = ha.a[ALIBI_GEOM]};
        assert_int_equal(mha_attention_cached(&tc.c, s->lens, q, s->heads, s->seq_q, scale,
                                              &plain_m, o0, MHA_LAYOUT_BHSD, l0), MHA_OK);
        for (int sk = SINK_RAND; sk <= SINK_BIG; sk++) {
            mha_mask m = plain_m;
            m.sinks = ha.a[sk];
            assert_int_equal(mha_attention_cached(&tc.c, s->lens, q, s->heads, s->seq_q, scale,
                                                  &m, o1, MHA_LAYOUT_BHSD, l1), MHA_OK);
            for (int64_t row = 0; row < nl; row++) {
                const int32_t h = (int32_t)(row / s->seq_q % s->heads);
                const double f = 1.0 / (1.0 + exp((double)m.sinks[h] - l0[row]));
                for (int32_t e = 0; e < s->dv; e++)
                    scaled[row * s->dv + e] = (float)(o0[row * s->dv + e] * f);
            }
            const double rl = tol_ratio_f(l1, l0, nl, TOL_ISA);
            const double ro = tol_ratio_f(o1, scaled, no, TOL_ISA);
            if (rl > 1.0 || ro > 1.0)
                fail_msg("shape %zu sinks %s: lse %.3g, out %.3g x tolerance of the formula", si,
                         head_array_names[sk], rl, ro);
            for (int64_t e = 0; sk == SINK_BIG && e < no; e++)
                if (!(fabsf(o1[e]) < 1e-4f))
                    fail_msg("shape %zu: sink +20 but out[%lld] = %g", si, (long long)e,
                             (double)o1[e]);
        }
        test_cache_free(&tc);
        head_arrays_free(&ha);
        float *bufs[] = {q, o0, l0, o1, l1, scaled};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
    }
}

/* ---- threads ---- */

static const int thread_counts[] = {1, 2, 3, 7};
#define NT (sizeof thread_counts / sizeof *thread_counts)

/* Every modifier on (and the window alone with sinks), with and without the other
   mask fields: out and lse bitwise equal on 1, 2, 3 and 7 threads, for many blocks
   and for keys cut into chunks. */
static void threads_bitwise(void **state)
{
    (void)state;
    rng r = {308};
    const mha_attn_dims dims[] = {{2, 4, 1, 100, 300, 64, 0, MHA_F32}, {1, 8, 2, 1, 6000, 128, 0, MHA_F32},
                                  {1, 4, 1, 3, 3000, 192, 128, MHA_F32}};
    const shape shapes[] = {{2, 8, 2, 64, 64, 300, 1, {300, 123}},
                            {1, 8, 1, 128, 128, 20000, 1, {19999}},
                            {1, 4, 1, 64, 64, 3000, 3, {3000}},
                            {1, 1, 1, 64, 32, 3000, 100, {2900}}};
    const int n_cases = (int)(sizeof dims / sizeof *dims + sizeof shapes / sizeof *shapes);
    for (int ci = 0; ci < n_cases; ci++) {
        const int cached = ci >= (int)(sizeof dims / sizeof *dims);
        const shape *s = cached ? &shapes[ci - (int)(sizeof dims / sizeof *dims)] : NULL;
        const plain p = plain_of(&dims[cached ? 0 : ci]); /* read only when !cached */
        if (quick && (cached ? too_big(s, 2.5e6) : too_big_plain(&p.d, 2.5e6)))
            continue;
        const int32_t B = cached ? s->batch : p.d.batch, H = cached ? s->heads : p.d.heads;
        const int32_t Sq = cached ? s->seq_q : p.d.seq_q;
        const int32_t keys = cached ? s->capacity : p.d.seq_kv;
        const int64_t nl = (int64_t)B * H * Sq, no = cached ? nl * s->dv : p.no;
        float *q = rand_floats(&r, cached ? nl * s->dk : p.nq, -1, 1);
        float *k = cached ? NULL : rand_floats(&r, p.nk, -1, 1);
        float *v = cached ? NULL : rand_floats(&r, p.nv, -1, 1);
        test_cache tc;
        if (cached) {
            assert_true(test_cache_init(&tc, (cache_kind)(ci % CACHE_KINDS), B, s->kv_heads,
                                        s->dk, s->dv, s->capacity));
            test_cache_fill(&tc, &r, s->lens);
        }
        head_arrays ha;
        head_arrays_init(&ha, &r, H, keys);
        base_masks bm;
        base_masks_init(&bm, &r, B, H, Sq, keys, cached);
        float *o[2] = {alloc_floats(no), alloc_floats(no)};
        float *l[2] = {alloc_floats(nl), alloc_floats(nl)};
        for (int mi = 0; mi < 4; mi++) {
            mha_mask m = bm.m[mi % 2 ? M_ALL : M_NONE];
            m.window = mi < 2 ? 700 : 72;
            m.sinks = ha.a[SINK_RAND];
            if (mi < 2) {
                m.softcap = 5.0f;
                m.alibi_slopes = ha.a[ALIBI_SIGNED];
            }
            for (size_t t = 0; t < NT; t++) {
                set_threads(thread_counts[t]);
                const int dst = t > 0;
                const mha_layout layout = (mha_layout)(mi % 2);
                const mha_status st =
                    cached ? mha_attention_cached(&tc.c, s->lens, q, H, Sq, 0.5f, &m, o[dst],
                                                  layout, l[dst])
                           : mha_attention(&p.d, q, k, v, 0.5f, &m, o[dst], layout);
                assert_int_equal(st, MHA_OK);
                if (t > 0 && (memcmp(o[0], o[1], sizeof(float) * (size_t)no) != 0
                              || (cached && memcmp(l[0], l[1], sizeof(float) * (size_t)nl) != 0)))
                    fail_msg("case %d mask %d: %d threads differ from 1", ci, mi,
                             thread_counts[t]);
            }
        }
        set_threads(2);
        if (cached)
            test_cache_free(&tc);
        base_masks_free(&bm);
        head_arrays_free(&ha);
        float *bufs[] = {q, k, v, o[0], o[1], l[0], l[1]};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
    }
}

int main(void)
{
    require_env_isa();
    isa = mha_isa_active();
    quick = getenv("MHA_TEST_QUICK") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(modifiers_attention), cmocka_unit_test(modifiers_attention_split),
        cmocka_unit_test(modifiers_cached),    cmocka_unit_test(modifiers_cached_split),
        cmocka_unit_test(empty_windows),       cmocka_unit_test(long_window),
        cmocka_unit_test(sink_formula),        cmocka_unit_test(alibi_far_keys),
        cmocka_unit_test(threads_bitwise),
    };
    return cmocka_run_group_tests_name(mha_isa_name(isa), tests, NULL, NULL);
}
