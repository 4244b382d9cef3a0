/* NEON attention block, flash-attention style, per mha_attn_block in internal.h.
 *
 * The block's rows go in chunks of CHUNK whose running state stays on the
 * stack while each tile of KT keys is in L1; within a chunk, rows go in groups
 * of up to 4 that share every load of K and V. Scores are kept row by row,
 * four keys to a vector (s[i][jj]), so no vector lane mixes two rows and a
 * group of 1..3 rows costs 1..3 rows' work. For one row and one key tile, with
 * s_j its scores (hidden keys -INFINITY), the online softmax update is
 *     m' = max(m, max_j s_j);  p_j = exp(s_j - m');
 *     l  = exp(m - m') l + sum_j p_j;  O = exp(m - m') O + sum_j p_j v_j
 * and at the end out = O / (l + exp(sink - m)) and lse = m + log(l). O
 * accumulates in the caller's out rows, so the only scratch is fixed-size: the
 * score tile and m, l of one chunk.
 *
 * Key ranges: tiles start at multiples of KT; a group visits only the tiles
 * that meet a row's [kv_begin, kv_end) (a sliding window costs its width), and
 * in each it reads only the keys from its rows' smallest kv_begin to largest
 * kv_end there: never a key outside the block's ranges.
 *
 * Masks: a key is hidden from a row outside its range or when its score is
 * -inf (a -INFINITY bias, whatever q.k is); its score becomes -INFINITY. The
 * zero weight of a hidden key the group reads is multiplied into O, which is
 * exact while V is finite; a tile where some row has a -INFINITY score and V
 * holds a non-finite value takes the careful path: those weights are marked
 * -0.0f and skipped. So NaN or Inf reaches a row only from what it sees, as
 * IEEE arithmetic says. While a
 * row has seen no finite score (m = -INFINITY) the subtraction uses 0 instead
 * of m', so exp gives 0, never NaN; a row that never sees one ends with l = 0
 * and gets zeros.
 *
 * Row independence: a row's arithmetic (the FMA chains along dk, the lanes of
 * its sums, the order of the keys) is the same in any group; its vector lanes
 * hold fixed keys (j mod 4, tiles being aligned); hidden keys add exact zeros;
 * and a tile where it sees nothing leaves its m, l and O bitwise unchanged
 * (exp(0) is exactly 1). So neither its group nor the tiles the group visits
 * change a bit of it. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "internal.h"

#define INLINE inline __attribute__((always_inline))
/* Loops over the rows, keys and columns of a register tile: fully unrolled, so
 * that the tile's arrays of vectors live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

enum {
    KT = 64,    /* keys per tile: K and V tiles of 64 rows stay in L1 */
    CHUNK = 32, /* rows sharing one pass over the key tiles */
};

/* exp(x) for x <= 0, vectorized. Range reduction x = n ln2 + r with
 * n = round(x / ln2) and r = (x - n ln2_hi) - n ln2_lo (Cody-Waite: ln2_hi has
 * 16 significant bits, so n ln2_hi is exact for |n| < 2^8), |r| <= ln2/2; then
 * exp(r) ~ 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4), a degree-6 fit of
 * the relative error on Chebyshev nodes (4e-9 = 0.06 ulp in exact arithmetic),
 * times 2^n built by writing n + 127 into the exponent field. x < ln(FLT_MIN)
 * ~ -87.3365 (so -INFINITY too) flushes to 0; exp(0) is exactly 1.
 * Measured maximum error over every float in [-87.3, 0] (exhaustive, under
 * qemu-aarch64, 1.1e9 inputs): 1 ulp against glibc expf, 1.04 ulp against exp
 * in double precision. */
static INLINE float32x4_t exp_f32x4(float32x4_t x)
{
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 0x1.715476p+0f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f));
    r = vfmsq_f32(r, n, vdupq_n_f32(0x1.7f7d1cp-20f));

    const float32x4_t r2 = vmulq_f32(r, r);
    const float32x4_t p23 = vfmaq_f32(vdupq_n_f32(0x1.fffff8p-2f), vdupq_n_f32(0x1.55548ep-3f), r);
    const float32x4_t p45 = vfmaq_f32(vdupq_n_f32(0x1.555b58p-5f), vdupq_n_f32(0x1.123b8ep-7f), r);
    const float32x4_t p46 = vfmaq_f32(p45, vdupq_n_f32(0x1.687c22p-10f), r2);
    const float32x4_t poly = vfmaq_f32(r, r2, vfmaq_f32(p23, p46, r2)); /* exp(r) - 1 */

    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t scale = vreinterpretq_f32_s32(bits);
    const float32x4_t y = vfmaq_f32(scale, poly, scale);
    return vbslq_f32(vcltq_f32(x, vdupq_n_f32(-0x1.5d589ep+6f)), vdupq_n_f32(0.0f), y);
}

/* tanh(x) = sign(x) t(|x|): below 0.625, t = x + x^3 Q(x^2), Q of degree 4
 * fitted to the relative error (7e-2 ulp in exact arithmetic); above it,
 * t = 1 - 2e / (1 + e) with e = exp(-2|x|) <= 0.29, free of cancellation.
 * NaN stays NaN, +-Inf gives +-1. Measured maximum error over every float
 * in [0, 10] (exhaustive, under qemu-aarch64; tanh is odd and so is this):
 * 1.47 ulp against tanh in double precision, 2 ulp against glibc tanhf;
 * above 10 it returns 1 (0.07 ulp). */
static INLINE float32x4_t tanh_f32x4(float32x4_t x)
{
    const float32x4_t ax = vabsq_f32(x), x2 = vmulq_f32(x, x);
    float32x4_t q = vfmaq_f32(vdupq_n_f32(0x1.52269ap-6f), vdupq_n_f32(-0x1.75e1c6p-8f), x2);
    q = vfmaq_f32(vdupq_n_f32(-0x1.b83c5ap-5f), q, x2);
    q = vfmaq_f32(vdupq_n_f32(0x1.110726p-3f), q, x2);
    q = vfmaq_f32(vdupq_n_f32(-0x1.555532p-2f), q, x2);
    const float32x4_t small = vfmaq_f32(ax, vmulq_f32(ax, x2), q);

    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t e = exp_f32x4(vmulq_n_f32(ax, -2.0f));
    const float32x4_t big = vsubq_f32(one, vdivq_f32(vaddq_f32(e, e), vaddq_f32(one, e)));
    const float32x4_t t = vbslq_f32(vcltq_f32(ax, vdupq_n_f32(0.625f)), small, big);
    return vbslq_f32(vdupq_n_u32(0x80000000u), x, t);
}

/* y[i] = f(x[i]) for i < n, the tail through a zero-padded vector. */
static INLINE void map(float32x4_t (*f)(float32x4_t), const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, f(vld1q_f32(x + i)));
    if (i < n) {
        float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(buf, f(vld1q_f32(buf)));
        memcpy(y + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

void mha_exp_array__neon(const float *x, float *y, int64_t n)
{
    map(exp_f32x4, x, y, n);
}

void mha_tanh_array__neon(const float *x, float *y, int64_t n)
{
    map(tanh_f32x4, x, y, n);
}

/* A group of 1..4 rows of the block (the first `rows` entries are used). */
typedef struct group {
    const float *q[4];
    const float *bias[4]; /* NULL when the block has no bias */
    float *out[4];
    int32_t begin[4], end[4]; /* an empty range is stored as [0, 0) */
    int32_t r0, rows;         /* block row of the first, count */
} group;

/* One group's view of a key tile: scores at jj in [lo, hi) (multiples of 4)
 * for keys j0 + jj, of which the group reads keys [a, b) (absolute). */
typedef struct tile {
    int32_t j0, lo, hi, a, b;
} tile;

/* s[i][jj..jj+KC) = q_i . k_j for the R rows and KC keys from j0 + jj, keys
 * outside [a, b) read as key a or b - 1. Per (row, key), four lane-wise partial
 * sums along dk, reduced pairwise ((0+1)+(2+3)), then the dk % 4 tail. */
static INLINE void dots(const mha_attn_block *blk, const group *g, const tile *t, int32_t jj,
                        float (*s)[KT], const int R, const int KC)
{
    const int32_t dk = blk->dk, d4 = dk & ~3;
    const float *kp[8];
    UNROLL
    for (int c = 0; c < KC; c++) {
        const int32_t j = t->j0 + jj + c;
        kp[c] = blk->k + (int64_t)(j < t->a ? t->a : j < t->b ? j : t->b - 1) * blk->k_stride;
    }
    float32x4_t acc[4][8];
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int c = 0; c < KC; c++)
            acc[i][c] = vdupq_n_f32(0.0f);
    for (int32_t d = 0; d < d4; d += 4) {
        float32x4_t qv[4];
        UNROLL
        for (int i = 0; i < R; i++)
            qv[i] = vld1q_f32(g->q[i] + d);
        UNROLL
        for (int c = 0; c < KC; c++) {
            const float32x4_t kv = vld1q_f32(kp[c] + d);
            UNROLL
            for (int i = 0; i < R; i++)
                acc[i][c] = vfmaq_f32(acc[i][c], qv[i], kv);
        }
    }
    UNROLL
    for (int c = 0; c < KC; c += 4) {
        float32x4_t dot[4];
        UNROLL
        for (int i = 0; i < R; i++)
            dot[i] = vpaddq_f32(vpaddq_f32(acc[i][c], acc[i][c + 1]),
                                vpaddq_f32(acc[i][c + 2], acc[i][c + 3]));
        for (int32_t d = d4; d < dk; d++) {
            const float kd[4] = {kp[c][d], kp[c + 1][d], kp[c + 2][d], kp[c + 3][d]};
            const float32x4_t kv = vld1q_f32(kd);
            UNROLL
            for (int i = 0; i < R; i++)
                dot[i] = vfmaq_n_f32(dot[i], kv, g->q[i][d]);
        }
        UNROLL
        for (int i = 0; i < R; i++)
            vst1q_f32(s[i] + jj + c, dot[i]);
    }
}

/* The tile's dot products, 8 keys at a time for 1 or 2 rows (enough
 * independent FMA chains), 4 for 3 or 4 rows. */
static INLINE void scores_r(const mha_attn_block *blk, const group *g, const tile *t,
                            float (*s)[KT], const int R)
{
    const int KC = R <= 2 ? 8 : 4;
    int32_t jj = t->lo;
    for (; jj + KC <= t->hi; jj += KC)
        dots(blk, g, t, jj, s, R, KC);
    if (jj < t->hi)
        dots(blk, g, t, jj, s, R, 4);
}

/* One specialization per group size; noinline gives it a register allocation
 * of its own, so that the tiles stay in registers. */
__attribute__((noinline))
static void scores(const mha_attn_block *blk, const group *g, const tile *t, float (*s)[KT])
{
    switch (g->rows) {
    case 1: scores_r(blk, g, t, s, 1); break;
    case 2: scores_r(blk, g, t, s, 2); break;
    case 3: scores_r(blk, g, t, s, 3); break;
    default: scores_r(blk, g, t, s, 4); break;
    }
}

/* O_i = alpha_i O_i + sum_j p[i][j - j0] v_j for the R rows, keys j in [a, b),
 * columns [d0, d0 + 4 NV). */
static INLINE void pv_cols(const mha_attn_block *blk, const group *g, const tile *t,
                           float (*p)[KT], const float *alpha, int32_t d0, const int R,
                           const int NV)
{
    float32x4_t o[4][8];
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < NV; v++)
            o[i][v] = vmulq_n_f32(vld1q_f32(g->out[i] + d0 + 4 * v), alpha[i]);
    const float *vp = blk->v + (int64_t)t->a * blk->v_stride + d0;
    for (int32_t jj = t->a - t->j0; jj < t->b - t->j0; jj++, vp += blk->v_stride)
        UNROLL
        for (int v = 0; v < NV; v++) {
            const float32x4_t x = vld1q_f32(vp + 4 * v);
            UNROLL
            for (int i = 0; i < R; i++)
                o[i][v] = vfmaq_n_f32(o[i][v], x, p[i][jj]);
        }
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < NV; v++)
            vst1q_f32(g->out[i] + d0 + 4 * v, o[i][v]);
}

/* The columns from d0 (the dv % 4 tail, or all of them on the careful path),
 * one float at a time in the same order; weights of -0.0f are skipped. */
static void pv_tail(const mha_attn_block *blk, const group *g, const tile *t, float (*p)[KT],
                    const float *alpha, int32_t d0)
{
    for (int i = 0; i < g->rows; i++)
        for (int32_t d = d0; d < blk->dv; d++) {
            float o = g->out[i][d] * alpha[i];
            for (int32_t j = t->a; j < t->b; j++) {
                const float w = p[i][j - t->j0];
                if (!(w == 0.0f && signbit(w)))
                    o = fmaf(w, blk->v[(int64_t)j * blk->v_stride + d], o);
            }
            g->out[i][d] = o;
        }
}

/* All columns: 32 at a time for 1 or 2 rows, 16 for 3 or 4, then 4, then the tail. */
static INLINE void pv_r(const mha_attn_block *blk, const group *g, const tile *t, float (*p)[KT],
                        const float *alpha, const int R)
{
    const int NV = R <= 2 ? 8 : 4;
    const int32_t dv = blk->dv;
    int32_t d = 0;
    for (; d + 4 * NV <= dv; d += 4 * NV)
        pv_cols(blk, g, t, p, alpha, d, R, NV);
    if (NV > 4 && d + 16 <= dv) {
        pv_cols(blk, g, t, p, alpha, d, R, 4);
        d += 16;
    }
    for (; d + 4 <= dv; d += 4)
        pv_cols(blk, g, t, p, alpha, d, R, 1);
    if (d < dv)
        pv_tail(blk, g, t, p, alpha, d);
}

/* As scores, for P V. */
__attribute__((noinline))
static void pv(const mha_attn_block *blk, const group *g, const tile *t, float (*p)[KT],
               const float *alpha)
{
    switch (g->rows) {
    case 1: pv_r(blk, g, t, p, alpha, 1); break;
    case 2: pv_r(blk, g, t, p, alpha, 2); break;
    case 3: pv_r(blk, g, t, p, alpha, 3); break;
    default: pv_r(blk, g, t, p, alpha, 4); break;
    }
}

/* Are V's rows [a, b) all finite? (x * 0 is 0 for finite x, NaN otherwise.) */
static int v_finite(const mha_attn_block *blk, int32_t a, int32_t b)
{
    const int32_t dv = blk->dv;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float tail = 0.0f;
    for (int32_t j = a; j < b; j++) {
        const float *v = blk->v + (int64_t)j * blk->v_stride;
        int32_t d = 0;
        for (; d + 4 <= dv; d += 4)
            acc = vfmaq_n_f32(acc, vld1q_f32(v + d), 0.0f);
        for (; d < dv; d++)
            tail += v[d] * 0.0f;
    }
    return vminvq_u32(vceqq_f32(acc, acc)) != 0 && tail == tail;
}

/* Row i's scores of the tile, in place: scale, softcap, bias, ALiBi, then
 * -INFINITY for hidden keys; returns their max. *hidden is set when one is
 * -INFINITY (a hidden key, or a slot outside [a, b)). */
static float finish_scores(const mha_attn_block *blk, const group *g, const tile *t, int i,
                           float *s, int *hidden)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    const int32_t begin = g->begin[i], end = g->end[i];
    const int masked = begin > t->j0 + t->lo || end < t->j0 + t->hi;
    const float *bias = g->bias[i];
    const float cap = blk->softcap;
    const int alibi = blk->alibi_slope != NULL;
    const float slope = alibi ? blk->alibi_slope[g->r0 + i] : 0.0f;
    const int32x4_t pos = vdupq_n_s32(alibi ? blk->alibi_pos[g->r0 + i] : 0);
    const int32x4_t iota = {0, 1, 2, 3};
    float32x4_t mt = ninf;
    uint32x4_t any_ninf = vdupq_n_u32(0);
    for (int32_t jj = t->lo; jj < t->hi; jj += 4) {
        const int32_t j = t->j0 + jj;
        const int32x4_t jv = vaddq_s32(vdupq_n_s32(j), iota);
        float32x4_t x = vmulq_n_f32(vld1q_f32(s + jj), blk->scale);
        if (cap > 0.0f)
            x = vmulq_n_f32(tanh_f32x4(vdivq_f32(x, vdupq_n_f32(cap))), cap);
        uint32x4_t dead = vdupq_n_u32(0);
        if (bias) {
            float32x4_t bv;
            if (j >= t->a && j + 4 <= t->b) {
                bv = vld1q_f32(bias + j);
            } else { /* keys outside [a, b) read key a or b - 1, masked below */
                float b4[4];
                for (int c = 0; c < 4; c++)
                    b4[c] = bias[j + c < t->a ? t->a : j + c < t->b ? j + c : t->b - 1];
                bv = vld1q_f32(b4);
            }
            x = vaddq_f32(x, bv);
            dead = vceqq_f32(bv, ninf);
        }
        if (alibi)
            x = vaddq_f32(x, vmulq_n_f32(vcvtq_f32_s32(vsubq_s32(jv, pos)), slope));
        uint32x4_t vis = vdupq_n_u32(~0u);
        if (masked)
            vis = vandq_u32(vcgeq_s32(jv, vdupq_n_s32(begin)), vcltq_s32(jv, vdupq_n_s32(end)));
        x = vbslq_f32(vbicq_u32(vis, dead), x, ninf);
        any_ninf = vorrq_u32(any_ninf, vceqq_f32(x, ninf));
        vst1q_f32(s + jj, x);
        mt = vmaxq_f32(mt, x);
    }
    if (vmaxvq_u32(any_ninf) != 0)
        *hidden = 1;
    return vmaxvq_f32(mt);
}

/* One key tile for one group: scores, online softmax, P V. */
static void group_tile(const mha_attn_block *blk, const group *g, const tile *t, float *m_state,
                       float *l_state)
{
    float s[4][KT];
    scores(blk, g, t, s);

    float mt[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int hidden = 0;
    for (int i = 0; i < g->rows; i++)
        mt[i] = finish_scores(blk, g, t, i, s[i], &hidden);
    const int careful = hidden && !v_finite(blk, t->a, t->b);

    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    const float32x4_t m_old = vld1q_f32(m_state);
    const float32x4_t m_new = vmaxq_f32(m_old, vld1q_f32(mt));
    const float32x4_t m_sub = vbslq_f32(vceqq_f32(m_new, ninf), vdupq_n_f32(0.0f), m_new);
    float alpha[4], msub[4], sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    vst1q_f32(alpha, exp_f32x4(vsubq_f32(m_old, m_sub)));
    vst1q_f32(msub, m_sub);
    for (int i = 0; i < g->rows; i++) {
        const float32x4_t mi = vdupq_n_f32(msub[i]);
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int32_t jj = t->lo; jj < t->hi; jj += 4) {
            const float32x4_t x = vld1q_f32(s[i] + jj);
            float32x4_t p = exp_f32x4(vsubq_f32(x, mi));
            if (careful)
                p = vbslq_f32(vceqq_f32(x, ninf), vdupq_n_f32(-0.0f), p);
            vst1q_f32(s[i] + jj, p);
            acc = vaddq_f32(acc, p);
        }
        sum[i] = vaddvq_f32(acc);
    }
    vst1q_f32(m_state, m_new);
    vst1q_f32(l_state, vfmaq_f32(vld1q_f32(sum), vld1q_f32(alpha), vld1q_f32(l_state)));

    if (careful) {
        pv_tail(blk, g, t, s, alpha, 0);
        return;
    }
    pv(blk, g, t, s, alpha);
}

/* The tile from j0 for group g: false when none of its rows sees a key there. */
static int tile_of(const group *g, int32_t j0, tile *t)
{
    int32_t a = j0 + KT, b = j0;
    for (int i = 0; i < g->rows; i++)
        if (g->begin[i] < j0 + KT && g->end[i] > j0 && g->begin[i] < g->end[i]) {
            a = g->begin[i] < a ? g->begin[i] : a;
            b = g->end[i] > b ? g->end[i] : b;
        }
    if (a >= b)
        return 0;
    t->j0 = j0;
    t->a = a > j0 ? a : j0;
    t->b = b < j0 + KT ? b : j0 + KT;
    t->lo = (t->a - j0) & ~3;
    t->hi = (t->b - j0 + 3) & ~3;
    return 1;
}

void mha_attn_block__neon(const mha_attn_block *blk)
{
    const int32_t dv = blk->dv;
    for (int32_t c0 = 0; c0 < blk->rows; c0 += CHUNK) {
        const int32_t rows = blk->rows - c0 < CHUNK ? blk->rows - c0 : CHUNK;
        const int32_t ngroups = (rows + 3) / 4;
        group g[CHUNK / 4];
        float m[CHUNK], l[CHUNK];
        int32_t lo = INT32_MAX, hi = 0; /* the chunk's keys */
        for (int32_t gi = 0; gi < ngroups; gi++) {
            group *gp = &g[gi];
            gp->r0 = c0 + 4 * gi;
            gp->rows = rows - 4 * gi < 4 ? rows - 4 * gi : 4;
            for (int i = 0; i < 4; i++) {
                m[4 * gi + i] = -INFINITY;
                l[4 * gi + i] = 0.0f;
                if (i >= gp->rows)
                    continue;
                const int32_t r = gp->r0 + i;
                gp->q[i] = blk->q + mha_row_offset(blk, r, blk->q_stride, blk->q_group_stride);
                gp->bias[i] = blk->bias ? blk->bias + mha_row_offset(blk, r, blk->bias_stride,
                                                                      blk->bias_group_stride)
                                        : NULL;
                gp->out[i] = blk->out + mha_row_offset(blk, r, blk->out_stride,
                                                       blk->out_group_stride);
                gp->begin[i] = blk->kv_begin ? blk->kv_begin[r] : 0;
                gp->end[i] = blk->kv_end[r];
                if (gp->begin[i] >= gp->end[i])
                    gp->begin[i] = gp->end[i] = 0;
                else {
                    lo = gp->begin[i] < lo ? gp->begin[i] : lo;
                    hi = gp->end[i] > hi ? gp->end[i] : hi;
                }
                memset(gp->out[i], 0, (size_t)dv * sizeof(float));
            }
        }

        for (int32_t j0 = lo < hi ? lo / KT * KT : hi; j0 < hi; j0 += KT)
            for (int32_t gi = 0; gi < ngroups; gi++) {
                tile t;
                if (tile_of(&g[gi], j0, &t))
                    group_tile(blk, &g[gi], &t, m + 4 * gi, l + 4 * gi);
            }

        /* out = O / (l + exp(sink - m)); l = 0 (no visible key) gives zeros. */
        for (int32_t gi = 0; gi < ngroups; gi++)
            for (int i = 0; i < g[gi].rows; i++) {
                const int32_t r = g[gi].r0 + i;
                const float li = l[4 * gi + i], mi = m[4 * gi + i];
                float *o = g[gi].out[i];
                if (li == 0.0f) {
                    memset(o, 0, (size_t)dv * sizeof(float));
                    if (blk->lse)
                        blk->lse[r] = -INFINITY;
                    continue;
                }
                if (blk->lse)
                    blk->lse[r] = mi + logf(li);
                const float den = blk->sink ? li + expf(blk->sink[r] - mi) : li;
                const float32x4_t dn = vdupq_n_f32(den);
                int32_t d = 0;
                for (; d + 4 <= dv; d += 4)
                    vst1q_f32(o + d, vdivq_f32(vld1q_f32(o + d), dn));
                for (; d < dv; d++)
                    o[d] /= den;
            }
    }
}
