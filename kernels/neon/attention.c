/* NEON attention block, flash-attention style, per mha_attn_block in internal.h.
 *
 * The block's rows go in chunks of CHUNK whose running state stays on the
 * stack while each tile of KT keys is in L1; within a chunk, rows go in groups
 * of 4, lane i of a vector being row i of the group. With S = scale Q K^T +
 * bias for one group and one key tile (masked keys -INFINITY), the online
 * softmax update is
 *     m' = max(m, rowmax(S));  P = exp(S - m');
 *     l  = exp(m - m') l + rowsum(P);  O = diag(exp(m - m')) O + P V
 * and at the end out = O / l. O accumulates in the caller's out rows, so the
 * only scratch is fixed-size: the score tile and m, l of one chunk.
 *
 * Masks: key j of row r is visible iff j < kv_end[r] and its score is not -inf
 * (a -INFINITY bias gives -inf whatever q.k is). Keys past kv_end are never
 * read; the zero weight of a -inf score is multiplied into O, which is exact
 * while V is finite, and a tile whose V holds a non-finite value takes the
 * careful path: those weights are marked -0.0f and skipped. So NaN or Inf
 * reaches a row only from what it sees, as IEEE arithmetic says. While a row
 * has seen no finite score (m = -INFINITY) the subtraction uses 0 instead of
 * m', so exp gives 0, never NaN; a row that never sees one ends with l = 0 and
 * gets zeros.
 *
 * Row independence: each lane takes the same operations in the same order
 * whatever the other lanes hold, and a tile in which a row has no visible key
 * leaves its m, l and O bitwise unchanged (exp(0) is exactly 1). So the number
 * of tiles a group visits (up to the largest kv_end of its rows) never changes
 * a row's result. Keys at or past that largest kv_end are never read. A group
 * of fewer than 4 rows repeats its last row in the spare lanes and does not
 * store them. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "internal.h"

enum {
    KT = 64,    /* keys per tile: K and V tiles of 64 x head_dim floats stay in L1 */
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
static inline float32x4_t exp_f32x4(float32x4_t x)
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

void mha_exp_array__neon(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, exp_f32x4(vld1q_f32(x + i)));
    if (i < n) {
        float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(buf, exp_f32x4(vld1q_f32(buf)));
        memcpy(y + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

/* One group of 4 rows (lanes); spare lanes repeat the last real row. */
typedef struct group {
    const float *q[4];
    const float *bias[4]; /* NULL when the block has no bias */
    float *out[4];
    int32_t end[4];   /* kv_end of each lane */
    int32_t rows;     /* real rows, 1..4 */
    int32_t end_max;  /* largest kv_end of the group */
} group;

/* s[jj][lane] = q[lane] . k[j0 + jj] for jj < n (rounded up to 4; keys at or
 * past end_max repeat key end_max - 1). Each dot product sums head_dim / 4
 * lane-wise partial sums, reduces them pairwise, then adds the d tail. */
static void scores(const mha_attn_block *blk, const group *g, int32_t j0, int32_t n,
                   float (*s)[4])
{
    const int32_t dh = blk->head_dim, d4 = dh & ~3;
    for (int32_t jj = 0; jj < n; jj += 4) {
        const float *kp[4];
        for (int c = 0; c < 4; c++) {
            const int32_t j = j0 + jj + c < g->end_max ? j0 + jj + c : g->end_max - 1;
            kp[c] = blk->k + (int64_t)j * dh;
        }
        float32x4_t acc[4][4]; /* [row][key] */
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++)
                acc[r][c] = vdupq_n_f32(0.0f);
        for (int32_t d = 0; d < d4; d += 4) {
            const float32x4_t q0 = vld1q_f32(g->q[0] + d), q1 = vld1q_f32(g->q[1] + d),
                              q2 = vld1q_f32(g->q[2] + d), q3 = vld1q_f32(g->q[3] + d);
            for (int c = 0; c < 4; c++) {
                const float32x4_t kv = vld1q_f32(kp[c] + d);
                acc[0][c] = vfmaq_f32(acc[0][c], q0, kv);
                acc[1][c] = vfmaq_f32(acc[1][c], q1, kv);
                acc[2][c] = vfmaq_f32(acc[2][c], q2, kv);
                acc[3][c] = vfmaq_f32(acc[3][c], q3, kv);
            }
        }
        float32x4_t dot[4];
        for (int c = 0; c < 4; c++)
            dot[c] = vpaddq_f32(vpaddq_f32(acc[0][c], acc[1][c]), vpaddq_f32(acc[2][c], acc[3][c]));
        for (int32_t d = d4; d < dh; d++) {
            const float qd[4] = {g->q[0][d], g->q[1][d], g->q[2][d], g->q[3][d]};
            const float32x4_t qv = vld1q_f32(qd);
            for (int c = 0; c < 4; c++)
                dot[c] = vfmaq_n_f32(dot[c], qv, kp[c][d]);
        }
        for (int c = 0; c < 4; c++)
            vst1q_f32(s[jj + c], dot[c]);
    }
}

/* O[lane] = alpha[lane] O[lane] + sum_{jj < cnt[lane]} p[jj][lane] v[j0 + jj] for
 * the real lanes, d in [d0, d0 + 4*NV). Keys below the smallest cnt go to all
 * lanes at once; the rest lane by lane, so a lane never reads a V row it
 * cannot see. */
#define PV_CHUNK(NV)                                                                        \
    static void pv_chunk##NV(const mha_attn_block *blk, const group *g, int32_t j0,         \
                             float (*p)[4], const int32_t cnt[4], int32_t cmin,             \
                             int32_t cmax, float32x4_t alpha, int32_t d0)                   \
    {                                                                                       \
        const int32_t dh = blk->head_dim;                                                   \
        float32x4_t o[4][NV];                                                               \
        float a[4];                                                                         \
        vst1q_f32(a, alpha);                                                                \
        for (int r = 0; r < 4; r++)                                                         \
            for (int v = 0; v < NV; v++)                                                    \
                o[r][v] = vmulq_n_f32(vld1q_f32(g->out[r] + d0 + 4 * v), a[r]);             \
        const float *vp = blk->v + (int64_t)j0 * dh + d0;                                   \
        for (int32_t jj = 0; jj < cmin; jj++, vp += dh)                                     \
            for (int v = 0; v < NV; v++) {                                                  \
                const float32x4_t x = vld1q_f32(vp + 4 * v);                                \
                for (int r = 0; r < 4; r++)                                                 \
                    o[r][v] = vfmaq_n_f32(o[r][v], x, p[jj][r]);                            \
            }                                                                               \
        for (int32_t jj = cmin; jj < cmax; jj++, vp += dh)                                  \
            for (int r = 0; r < 4; r++)                                                     \
                if (jj < cnt[r])                                                            \
                    for (int v = 0; v < NV; v++)                                            \
                        o[r][v] = vfmaq_n_f32(o[r][v], vld1q_f32(vp + 4 * v), p[jj][r]);    \
        for (int r = 0; r < g->rows; r++)                                                   \
            for (int v = 0; v < NV; v++)                                                    \
                vst1q_f32(g->out[r] + d0 + 4 * v, o[r][v]);                                 \
    }
PV_CHUNK(4)
PV_CHUNK(1)

/* The columns from d0 (the head_dim % 4 tail, or all of them on the careful
 * path), one float at a time in the same order; weights of -0.0f are skipped. */
static void pv_tail(const mha_attn_block *blk, const group *g, int32_t j0, float (*p)[4],
                    const int32_t cnt[4], float32x4_t alpha, int32_t d0)
{
    const int32_t dh = blk->head_dim;
    float a[4];
    vst1q_f32(a, alpha);
    for (int r = 0; r < g->rows; r++)
        for (int32_t d = d0; d < dh; d++) {
            float o = g->out[r][d] * a[r];
            for (int32_t jj = 0; jj < cnt[r]; jj++)
                if (!(p[jj][r] == 0.0f && signbit(p[jj][r])))
                    o = fmaf(p[jj][r], blk->v[(int64_t)(j0 + jj) * dh + d], o);
            g->out[r][d] = o;
        }
}

/* Are V's rows [j0, j0 + n) all finite? (x * 0 is 0 for finite x, NaN otherwise.) */
static int v_finite(const mha_attn_block *blk, int32_t j0, int32_t n)
{
    const float *v = blk->v + (int64_t)j0 * blk->head_dim;
    const int64_t len = (int64_t)n * blk->head_dim;
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= len; i += 4)
        acc = vfmaq_n_f32(acc, vld1q_f32(v + i), 0.0f);
    float tail = 0.0f;
    for (; i < len; i++)
        tail += v[i] * 0.0f;
    return vminvq_u32(vceqq_f32(acc, acc)) != 0 && tail == tail;
}

/* One key tile [j0, j0 + KT) for one group: scores, online softmax, P V. */
static void group_tile(const mha_attn_block *blk, const group *g, int32_t j0, float *m_state,
                       float *l_state)
{
    float s[KT][4];
    const int32_t n = g->end_max - j0 < KT ? g->end_max - j0 : KT;
    scores(blk, g, j0, n, s);

    const int32x4_t end = vld1q_s32(g->end);
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    float32x4_t mt = ninf;
    uint32x4_t hidden = vdupq_n_u32(0); /* a -inf score before kv_end */
    for (int32_t jj = 0; jj < n; jj++) {
        float32x4_t x = vmulq_n_f32(vld1q_f32(s[jj]), blk->scale);
        if (blk->bias) {
            const int32_t j = j0 + jj;
            const float b[4] = {g->bias[0][j], g->bias[1][j], g->bias[2][j], g->bias[3][j]};
            const float32x4_t bv = vld1q_f32(b);
            x = vbslq_f32(vceqq_f32(bv, ninf), ninf, vaddq_f32(x, bv));
        }
        const uint32x4_t vis = vcltq_s32(vdupq_n_s32(j0 + jj), end);
        hidden = vorrq_u32(hidden, vandq_u32(vis, vceqq_f32(x, ninf)));
        x = vbslq_f32(vis, x, ninf);
        vst1q_f32(s[jj], x);
        mt = vmaxq_f32(mt, x);
    }
    const int careful = vmaxvq_u32(hidden) != 0 && !v_finite(blk, j0, n);

    const float32x4_t m_old = vld1q_f32(m_state);
    const float32x4_t m_new = vmaxq_f32(m_old, mt);
    const float32x4_t m_sub = vbslq_f32(vceqq_f32(m_new, ninf), vdupq_n_f32(0.0f), m_new);
    const float32x4_t alpha = exp_f32x4(vsubq_f32(m_old, m_sub));
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int32_t jj = 0; jj < n; jj++) {
        const float32x4_t x = vld1q_f32(s[jj]);
        float32x4_t p = exp_f32x4(vsubq_f32(x, m_sub));
        if (careful)
            p = vbslq_f32(vceqq_f32(x, ninf), vdupq_n_f32(-0.0f), p);
        vst1q_f32(s[jj], p);
        sum = vaddq_f32(sum, p);
    }
    vst1q_f32(m_state, m_new);
    vst1q_f32(l_state, vfmaq_f32(sum, alpha, vld1q_f32(l_state)));

    int32_t cnt[4], cmin = n, cmax = 0;
    for (int r = 0; r < 4; r++) {
        const int32_t c = g->end[r] - j0;
        cnt[r] = c < 0 ? 0 : c < n ? c : n;
        cmin = cnt[r] < cmin ? cnt[r] : cmin;
        cmax = cnt[r] > cmax ? cnt[r] : cmax;
    }
    const int32_t dh = blk->head_dim;
    int32_t d = 0;
    if (careful) {
        pv_tail(blk, g, j0, s, cnt, alpha, 0);
        return;
    }
    for (; d + 16 <= dh; d += 16)
        pv_chunk4(blk, g, j0, s, cnt, cmin, cmax, alpha, d);
    for (; d + 4 <= dh; d += 4)
        pv_chunk1(blk, g, j0, s, cnt, cmin, cmax, alpha, d);
    if (d < dh)
        pv_tail(blk, g, j0, s, cnt, alpha, d);
}

void mha_attn_block__neon(const mha_attn_block *blk)
{
    const int32_t dh = blk->head_dim;
    for (int32_t c0 = 0; c0 < blk->rows; c0 += CHUNK) {
        const int32_t rows = blk->rows - c0 < CHUNK ? blk->rows - c0 : CHUNK;
        const int32_t ngroups = (rows + 3) / 4;
        group g[CHUNK / 4];
        float m[CHUNK], l[CHUNK];
        int32_t end_max = 0;
        for (int32_t gi = 0; gi < ngroups; gi++) {
            group *gp = &g[gi];
            gp->rows = rows - 4 * gi < 4 ? rows - 4 * gi : 4;
            gp->end_max = 0;
            for (int i = 0; i < 4; i++) {
                const int32_t r = c0 + 4 * gi + (i < gp->rows ? i : gp->rows - 1);
                gp->q[i] = blk->q + r * blk->q_stride;
                gp->bias[i] = blk->bias ? blk->bias + r * blk->bias_stride : NULL;
                gp->out[i] = blk->out + r * blk->out_stride;
                gp->end[i] = blk->kv_end[r];
                gp->end_max = gp->end[i] > gp->end_max ? gp->end[i] : gp->end_max;
                m[4 * gi + i] = -INFINITY;
                l[4 * gi + i] = 0.0f;
            }
            for (int i = 0; i < gp->rows; i++)
                memset(gp->out[i], 0, (size_t)dh * sizeof(float));
            end_max = gp->end_max > end_max ? gp->end_max : end_max;
        }

        for (int32_t j0 = 0; j0 < end_max; j0 += KT)
            for (int32_t gi = 0; gi < ngroups; gi++)
                if (j0 < g[gi].end_max)
                    group_tile(blk, &g[gi], j0, m + 4 * gi, l + 4 * gi);

        /* out = O / l; l = 0 (no visible key) gives zeros, a NaN l NaN. */
        for (int32_t gi = 0; gi < ngroups; gi++)
            for (int i = 0; i < g[gi].rows; i++) {
                const float li = l[4 * gi + i];
                float *o = g[gi].out[i];
                if (li != 0.0f) {
                    const float32x4_t lv = vdupq_n_f32(li);
                    int32_t d = 0;
                    for (; d + 4 <= dh; d += 4)
                        vst1q_f32(o + d, vdivq_f32(vld1q_f32(o + d), lv));
                    for (; d < dh; d++)
                        o[d] /= li;
                } else {
                    memset(o, 0, (size_t)dh * sizeof(float));
                }
            }
    }
}
