/* Strided tensors (mha_attention_strided, mha_attention_cached_strided) for every io
 * type: q, k, v and out as views of other storage - [B,S,H,D] storage viewed as
 * [B,H,S,D], padded strides, a stride of 0 (one head or one batch read by all), the
 * three parts of one fused QKV buffer - against the same call on dense copies
 * (bitwise: strides change addresses, not arithmetic), out and lse included, with
 * every byte of out outside the view untouched; scalar against float64 over the
 * views and the ISA against scalar; masks with key_starts and q_offsets among them;
 * GQA, dv != dk, decode and split-KV shapes; cached calls over every cache kind. */
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

/* How a [B][H][S][d] tensor sits in its storage. */
typedef enum view_kind {
    V_DENSE,     /* NULL strides */
    V_BSHD,      /* [B][S][H][d] storage */
    V_PADDED,    /* rows, heads and batches each followed by padding */
    V_BROADCAST, /* head stride 0: every head reads head 0's rows (k, v; q in cached calls) */
    V_FUSED,     /* q, k and v heads side by side in one [B][S][H + 2 Hkv][d] buffer */
    V_KINDS
} view_kind;
static const char *const view_names[V_KINDS] = {"dense", "bshd", "padded", "broadcast", "fused"};

typedef struct view {
    char *mem;  /* the storage, every byte 0xff (NaN) outside the view */
    size_t bytes;
    mha_strides st;
    int32_t B, H, S, d;
    size_t esz;
} view;

static int64_t at(const view *x, int32_t b, int32_t h, int32_t s, int32_t i)
{
    return b * x->st.b + h * x->st.h + s * x->st.s + i;
}

/* A view of kind k; V_FUSED: part (0 q, 1 k, 2 v) of a buffer shared through *fused
   (allocated by part 0, heads H q + 2 * hkv). */
static view view_make(view_kind k, mha_dtype t, int32_t B, int32_t H, int32_t S, int32_t d,
                      int part, int32_t hq, int32_t hkv, view *fused)
{
    view x = {.B = B, .H = H, .S = S, .d = d, .esz = (size_t)mha_row_bytes(t, 1)};
    int64_t n;
    switch (k) {
    case V_DENSE: x.st = (mha_strides){(int64_t)H * S * d, (int64_t)S * d, d}; break;
    case V_BSHD: x.st = (mha_strides){(int64_t)S * H * d, d, (int64_t)H * d}; break;
    case V_PADDED: {
        const int64_t row = d + 5, head = S * row + 3;
        x.st = (mha_strides){H * head + 11, head, row};
        break;
    }
    case V_BROADCAST: x.st = (mha_strides){(int64_t)S * d, 0, d}; break;
    case V_FUSED: {
        const int64_t width = (int64_t)(hq + 2 * hkv) * d;
        const int64_t first = part == 0 ? 0 : part == 1 ? (int64_t)hq * d : (int64_t)(hq + hkv) * d;
        x.st = (mha_strides){S * width, d, width};
        if (part == 0) {
            fused->bytes = (size_t)(B * S * width) * x.esz;
            fused->mem = xcalloc(fused->bytes);
            memset(fused->mem, 0xff, fused->bytes);
        }
        x.mem = fused->mem + first * (int64_t)x.esz;
        x.bytes = 0; /* not its own allocation */
        return x;
    }
    default: fail();
    }
    n = at(&x, B - 1, H - 1, S - 1, d);
    x.bytes = (size_t)n * x.esz;
    x.mem = xcalloc(x.bytes);
    memset(x.mem, 0xff, x.bytes);
    return x;
}

static void view_free(view *x)
{
    if (x->bytes)
        free(x->mem);
}

/* Dense [B][H][S][d] src written through the view (a later head wins where heads
   share storage). */
static void view_put(view *x, const char *src)
{
    for (int32_t b = 0; b < x->B; b++)
        for (int32_t h = 0; h < x->H; h++)
            for (int32_t s = 0; s < x->S; s++)
                memcpy(x->mem + at(x, b, h, s, 0) * (int64_t)x->esz,
                       src + ((((int64_t)b * x->H + h) * x->S + s) * x->d) * (int64_t)x->esz,
                       (size_t)x->d * x->esz);
}

/* The view read back as a dense [B][H][S][d] tensor (malloc'd). */
static char *view_get(const view *x)
{
    char *dst = xcalloc((size_t)x->B * x->H * x->S * x->d * x->esz);
    for (int32_t b = 0; b < x->B; b++)
        for (int32_t h = 0; h < x->H; h++)
            for (int32_t s = 0; s < x->S; s++)
                memcpy(dst + ((((int64_t)b * x->H + h) * x->S + s) * x->d) * (int64_t)x->esz,
                       x->mem + at(x, b, h, s, 0) * (int64_t)x->esz, (size_t)x->d * x->esz);
    return dst;
}

/* Masks the sweeps rotate through: none; causal rows at q_offsets with left padding
   (key_starts); window, softcap, ALiBi and sinks with key lengths (plain calls). */
enum { M_NONE, M_POS, M_MODS, M_COUNT };
static const char *const mask_names[M_COUNT] = {"none", "positions", "modifiers"};
typedef struct masks {
    mha_mask m[M_COUNT];
    int32_t starts[4], offsets[4], lens[4];
    float slopes[16], sinks[16];
} masks;

static void masks_init(masks *ms, int32_t B, int32_t H, int32_t keys, int32_t Sq, int cached)
{
    memset(ms, 0, sizeof *ms);
    for (int32_t b = 0; b < B; b++) {
        ms->starts[b] = (3 + 7 * b) % (keys + 1);
        ms->offsets[b] = b % 2 ? 0 : keys - Sq - 5; /* top-left, and 5 rows back */
        ms->lens[b] = keys - (11 * b) % (keys + 1);
    }
    for (int32_t h = 0; h < H; h++) {
        ms->slopes[h] = exp2f(-(float)(h + 1));
        ms->sinks[h] = (float)(h % 3) - 1.0f;
    }
    ms->m[M_POS] = (mha_mask){.causal = 1, .key_starts = ms->starts, .q_offsets = ms->offsets};
    ms->m[M_MODS] = (mha_mask){.key_lens = cached ? NULL : ms->lens, .window = 40,
                               .softcap = 5.0f, .alibi_slopes = ms->slopes, .sinks = ms->sinks};
}

/* got (of type t) against want: within typed_ratio's tolerance tol. */
static double typed_vs(mha_dtype t, const void *got, const double *want, int64_t n, double tol)
{
    double *g = typed_decode(t, got, n);
    const double r = typed_ratio(t, g, want, n, tol);
    free(g);
    return r;
}

/* ---- mha_attention_strided ---- */

/* Fails unless scalar's out and lse (sgot, slse) are within TOL_REF of float64's
   (ref, ref_lse) and the ISA's (got, lse) within TOL_ISA of scalar's. */
static void check_accuracy(const char *what, mha_dtype t, const char *got, const float *lse,
                           const char *sgot, const float *slse, const double *ref,
                           const double *ref_lse, int64_t no, int64_t nl)
{
    double *sd = typed_decode(t, sgot, no), *sl = typed_decode(MHA_F32, slse, nl);
    const double r_out = typed_ratio(t, sd, ref, no, TOL_REF);
    const double r_lse = typed_ratio(MHA_F32, sl, ref_lse, nl, TOL_REF);
    const double i_out = typed_vs(t, got, sd, no, TOL_ISA);
    const double i_lse = typed_vs(MHA_F32, lse, sl, nl, TOL_ISA);
    free(sd);
    free(sl);
    if (r_out > 1.0 || r_lse > 1.0)
        fail_msg("%s: scalar vs float64: out %.3g, lse %.3g x tolerance", what, r_out, r_lse);
    if (i_out > 1.0 || i_lse > 1.0)
        fail_msg("%s: %s vs scalar: out %.3g, lse %.3g x tolerance", what, mha_isa_name(isa),
                 i_out, i_lse);
}

static const mha_attn_dims plain_shapes[] = {
    {2, 4, 2, 37, 150, 64, 0, MHA_F32},  {3, 3, 3, 6, 73, 20, 0, MHA_F32},
    {2, 4, 1, 17, 145, 64, 96, MHA_F32}, {1, 8, 2, 1, 600, 128, 0, MHA_F32},
    {1, 8, 2, 1, 2100, 64, 0, MHA_F32}, /* keys cut into chunks */
};

/* One shape, one type, q/k/v/out views of the kinds given: strided against dense,
   bitwise on the active ISA (out's storage outside the view untouched); scalar against
   float64, the ISA against scalar. */
static void check_plain(rng *r, const mha_attn_dims *d0, mha_dtype t, view_kind qk, view_kind kk,
                        view_kind ok, int mi)
{
    mha_attn_dims d = *d0;
    d.dtype = t;
    const int32_t B = d.batch, H = d.heads, G = d.kv_heads, Sq = d.seq_q, Skv = d.seq_kv;
    const int32_t dk = d.head_dim, dv = d.v_head_dim ? d.v_head_dim : dk;
    const int64_t nq = (int64_t)B * H * Sq * dk, nk = (int64_t)B * G * Skv * dk;
    const int64_t nv = (int64_t)B * G * Skv * dv, no = (int64_t)B * H * Sq * dv, nl = (int64_t)B * H * Sq;
    const int fused = qk == V_FUSED;
    if (fused && (dk != dv || Sq != Skv))
        return;
    view f = {0};
    view q = view_make(qk, t, B, H, Sq, dk, 0, H, G, &f);
    view k = view_make(kk, t, B, G, Skv, dk, 1, H, G, &f);
    view v = view_make(kk, t, B, G, Skv, dv, 2, H, G, &f);
    view o = view_make(ok, t, B, H, Sq, dv, 0, 0, 0, NULL);
    void *src[3] = {typed_rand(r, t, nq), typed_rand(r, t, nk), typed_rand(r, t, nv)};
    view_put(&q, src[0]), view_put(&k, src[1]), view_put(&v, src[2]);
    char *dq = view_get(&q), *dkv = view_get(&k), *dvv = view_get(&v);
    masks ms;
    masks_init(&ms, B, H, Skv, Sq, 0);
    const mha_mask *m = &ms.m[mi];
    const float scale = 1.0f / sqrtf((float)dk);
    char what[200];
    snprintf(what, sizeof what, "%s B=%d H=%d Hkv=%d Sq=%d Skv=%d dk=%d dv=%d q %s kv %s out %s mask %s",
             mha_dtype_name(t), B, H, G, Sq, Skv, dk, dv, view_names[qk], view_names[kk],
             view_names[ok], mask_names[mi]);
    const mha_strides *ost = ok == V_DENSE ? NULL : &o.st;
    float *lse = xcalloc(sizeof(float) * (size_t)nl), *dense_lse = xcalloc(sizeof(float) * (size_t)nl);
    mha_status st = mha_attention_strided(&d, q.mem, qk == V_DENSE ? NULL : &q.st, k.mem,
                                          kk == V_DENSE ? NULL : &k.st, v.mem,
                                          kk == V_DENSE ? NULL : &v.st, scale, m, o.mem, ost, lse);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    /* The same call on dense copies; its result written through the out view over
       untouched storage must give out's storage byte for byte. */
    view want = view_make(ok, t, B, H, Sq, dv, 0, 0, 0, NULL);
    char *dense_out = xcalloc((size_t)mha_row_bytes(t, no));
    assert_int_equal(mha_attention_strided(&d, dq, NULL, dkv, NULL, dvv, NULL, scale, m, dense_out,
                                           NULL, dense_lse),
                     MHA_OK);
    view_put(&want, dense_out);
    if (memcmp(want.mem, o.mem, o.bytes) || memcmp(lse, dense_lse, sizeof(float) * (size_t)nl))
        fail_msg("%s: strided differs from dense (or wrote outside its view)", what);
    /* Accuracy: scalar over the views against float64, the ISA against scalar. */
    char *got = view_get(&o);
    view so = view_make(ok, t, B, H, Sq, dv, 0, 0, 0, NULL);
    float *slse = xcalloc(sizeof(float) * (size_t)nl);
    use(MHA_ISA_SCALAR);
    st = mha_attention_strided(&d, q.mem, qk == V_DENSE ? NULL : &q.st, k.mem,
                               kk == V_DENSE ? NULL : &k.st, v.mem, kk == V_DENSE ? NULL : &v.st,
                               scale, m, so.mem, ok == V_DENSE ? NULL : &so.st, slse);
    use(isa);
    assert_int_equal(st, MHA_OK);
    char *sgot = view_get(&so);
    double *ref = xcalloc(sizeof(double) * (size_t)no), *ref_lse = xcalloc(sizeof(double) * (size_t)nl);
    ref_attention_strided(&d, q.mem, qk == V_DENSE ? NULL : &q.st, k.mem,
                          kk == V_DENSE ? NULL : &k.st, v.mem, kk == V_DENSE ? NULL : &v.st, scale,
                          m, ref, ref_lse);
    check_accuracy(what, t, got, lse, sgot, slse, ref, ref_lse, no, nl);
    view *views[] = {&q, &k, &v, &o, &want, &so, &f};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++)
        view_free(views[i]);
    void *bufs[] = {src[0], src[1], src[2], dq, dkv, dvv, lse, dense_lse, dense_out, got, slse,
                    sgot, ref, ref_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
}

/* Every type and shape with the views in turn: q, k/v and out each go through every
   kind they can take, masks rotating. */
static void strided_attention(void **state)
{
    (void)state;
    rng r = {401};
    int turn = 0;
    for (int ti = 0; ti < TEST_TYPE_COUNT; ti++) {
        if (!mha_dtype_valid(test_types[ti], 1))
            continue;
        for (size_t si = 0; si < sizeof plain_shapes / sizeof *plain_shapes; si++) {
            const mha_attn_dims *d = &plain_shapes[si];
            if (quick && (int64_t)d->heads * d->seq_q * d->seq_kv > 4000)
                continue;
            const view_kind qkinds[] = {V_DENSE, V_BSHD, V_PADDED, V_FUSED};
            const view_kind kvkinds[] = {V_BSHD, V_PADDED, V_BROADCAST, V_DENSE};
            const view_kind okinds[] = {V_BSHD, V_PADDED, V_DENSE};
            for (int c = 0; c < 4; c++, turn++) {
                const view_kind qk = qkinds[c];
                check_plain(&r, d, test_types[ti], qk, qk == V_FUSED ? V_FUSED : kvkinds[(c + si) % 4],
                            okinds[turn % 3], turn % M_COUNT);
            }
        }
    }
}

/* ---- mha_attention_cached_strided ---- */

typedef struct shape {
    int32_t batch, heads, kv_heads, dk, dv, capacity, seq_q;
    int32_t lens[3];
} shape;

static const shape cached_shapes[] = {
    {2, 4, 2, 64, 64, 160, 1, {150, 77}},
    {2, 8, 1, 64, 32, 96, 5, {12, 90}},
    {1, 8, 2, 128, 128, 3008, 1, {2990}}, /* keys cut into chunks */
};

/* q and out views (V_BROADCAST for q: every head asks the same query) against dense
   q and out, bitwise; scalar against float64, the ISA against scalar. */
static void check_cached(rng *r, const shape *s, cache_kind kind, mha_dtype io, view_kind qk,
                         view_kind ok, int mi)
{
    test_cache tc;
    if (!test_cache_init_as(&tc, kind, MHA_F16, io, kind == CACHE_BSHD ? 16 : 0, s->batch,
                            s->kv_heads, s->dk, s->dv == s->dk ? 0 : s->dv, s->capacity, r))
        return;
    test_cache_fill(&tc, r, s->lens);
    const int32_t B = s->batch, H = s->heads, Sq = s->seq_q, dv = s->dv;
    const int64_t nq = (int64_t)B * H * Sq * s->dk, nl = (int64_t)B * H * Sq, no = nl * dv;
    view q = view_make(qk, io, B, H, Sq, s->dk, 0, 0, 0, NULL);
    view o = view_make(ok, io, B, H, Sq, dv, 0, 0, 0, NULL);
    view want = view_make(ok, io, B, H, Sq, dv, 0, 0, 0, NULL);
    void *src = typed_rand(r, io, nq);
    view_put(&q, src);
    char *dq = view_get(&q), *dense_out = xcalloc((size_t)mha_row_bytes(io, no));
    masks ms;
    masks_init(&ms, B, H, s->capacity, Sq, 1);
    const mha_mask *m = &ms.m[mi];
    char what[200];
    snprintf(what, sizeof what, "cached %s io %s B=%d H=%d Sq=%d dk=%d dv=%d q %s out %s mask %s",
             cache_kind_name(kind), mha_dtype_name(io), B, H, Sq, s->dk, dv, view_names[qk],
             view_names[ok], mask_names[mi]);
    float *lse = xcalloc(sizeof(float) * (size_t)nl), *dense_lse = xcalloc(sizeof(float) * (size_t)nl);
    const float scale = 0.125f;
    const mha_strides *qst = qk == V_DENSE ? NULL : &q.st, *ost = ok == V_DENSE ? NULL : &o.st;
    mha_status st = mha_attention_cached_strided(&tc.c, s->lens, q.mem, qst, H, Sq, scale, m,
                                                 o.mem, ost, lse);
    if (st != MHA_OK)
        fail_msg("%s: %s", what, mha_status_str(st));
    assert_int_equal(mha_attention_cached_strided(&tc.c, s->lens, dq, NULL, H, Sq, scale, m,
                                                  dense_out, NULL, dense_lse),
                     MHA_OK);
    view_put(&want, dense_out);
    if (memcmp(want.mem, o.mem, o.bytes) || memcmp(lse, dense_lse, sizeof(float) * (size_t)nl))
        fail_msg("%s: strided differs from dense (or wrote outside its view)", what);
    char *got = view_get(&o);
    view so = view_make(ok, io, B, H, Sq, dv, 0, 0, 0, NULL);
    float *slse = xcalloc(sizeof(float) * (size_t)nl);
    use(MHA_ISA_SCALAR);
    st = mha_attention_cached_strided(&tc.c, s->lens, q.mem, qst, H, Sq, scale, m, so.mem,
                                      ok == V_DENSE ? NULL : &so.st, slse);
    use(isa);
    assert_int_equal(st, MHA_OK);
    char *sgot = view_get(&so);
    double *ref = xcalloc(sizeof(double) * (size_t)no), *ref_lse = xcalloc(sizeof(double) * (size_t)nl);
    ref_attention_cached_strided(&tc.c, s->lens, q.mem, qst, H, Sq, scale, m, ref, NULL, ref_lse);
    check_accuracy(what, io, got, lse, sgot, slse, ref, ref_lse, no, nl);
    view *views[] = {&q, &o, &want, &so};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++)
        view_free(views[i]);
    void *bufs[] = {src, dq, dense_out, lse, dense_lse, got, slse, sgot, ref, ref_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    test_cache_free(&tc);
}

static void strided_cached(void **state)
{
    (void)state;
    rng r = {402};
    int turn = 0;
    const view_kind qkinds[] = {V_BSHD, V_PADDED, V_BROADCAST, V_DENSE};
    const view_kind okinds[] = {V_PADDED, V_BSHD, V_DENSE};
    for (int ti = 0; ti < TEST_TYPE_COUNT; ti++) {
        if (!mha_dtype_valid(test_types[ti], 1))
            continue;
        for (size_t si = 0; si < sizeof cached_shapes / sizeof *cached_shapes; si++) {
            const shape *s = &cached_shapes[si];
            if (quick && s->capacity > 1000)
                continue;
            for (int kind = 0; kind < CACHE_KINDS; kind++, turn++)
                check_cached(&r, s, (cache_kind)kind, test_types[ti], qkinds[turn % 4],
                             okinds[turn % 3], turn % M_COUNT);
        }
    }
}

int main(void)
{
    require_env_isa();
    isa = mha_isa_active();
    quick = getenv("MHA_TEST_QUICK") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strided_attention),
        cmocka_unit_test(strided_cached),
    };
    return cmocka_run_group_tests_name(mha_isa_name(isa), tests, NULL, NULL);
}
