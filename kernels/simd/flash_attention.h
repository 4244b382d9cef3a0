/* The fused attention block (flash-attention style) written once over a thin
 * SIMD layer, for every ISA whose vectors run across query rows. An ISA's
 * attention.c includes its simd.h (the vf/vi/vm types and operations), defines
 * its register tiles and their sizes, then includes this file and wraps
 * flash_attn_block() and sizeof(pass), the block's scratch, under its own names:
 *
 *   QK_KEYS x QK_ROWS   score tile: st[j][r] (+)= sum_d K[j][d] qt[d][r] over a
 *                       dk chunk, QK_ROWS a multiple of VF_LANES
 *       qk_tile(dc, kp[QK_KEYS], qt, rp, st, accumulate)
 *   PV_ROWS x PV_COLS   o[i] = alpha[i] o[i] + sum_j p[j*pp + i] v[j] for PV_ROWS
 *                       rows, storing the first `valid` (the last dv % PV_COLS
 *                       columns go through pv_tail below, VF_LANES at a time)
 *       pv_tile(jn, p, pp, v, ldv, o[PV_ROWS], alpha[PV_ROWS], valid)
 *   BC                  keys per tile, a multiple of QK_KEYS
 *   RB, RB_L2           rows per pass when K and V stream from memory, and when
 *                       they sit in L2 (multiples of QK_ROWS)
 *
 * Layout. Q is packed once per pass transposed and scaled, qt[d][r] (rows padded
 * with zeros to a multiple of QK_ROWS), so the score tile is computed
 * transposed, broadcasting K straight from memory: no per-tile packing of K.
 * A pass of at most DOT_ROWS rows (decode: the query heads of one kv head, a row
 * or a few each) would waste most of those row lanes; it takes dot products
 * along dk instead, in row groups of 4, 2 or 1 (a group of 1..3 rows costs
 * 1..3 rows), each K vector loaded once for a group's rows.
 * Vectors run across query rows, so the softmax statistics m and l are vectors
 * too and need no horizontal reductions. P.V broadcasts p from st and loads V
 * rows straight from memory; the output rows are the accumulator. dk is
 * cut in chunks for the packed Q (resuming each FMA chain from the stored
 * partial sum keeps every bit), so the pass has a fixed size for any dk.
 * K and V rows are read through their strides (a KV cache in place), dk wide
 * for the scores and dv wide for P.V and the output.
 *
 * Non-finite data, the same on every ISA and in the scalar reference: a key is
 * hidden from a row past its kv_end or when its score is -inf (a -INFINITY
 * bias, whatever q.k is); hidden keys get weight exactly 0 and their V is never
 * multiplied into the row. All other keys are visible, and a NaN or Inf they
 * bring flows through IEEE arithmetic (a NaN score gives a NaN weight). The
 * fast path multiplies the zero weights of hidden keys inside a tile, which is
 * exact while V is finite; a tile where some row hides a key and V holds a
 * non-finite value takes the careful path instead: hidden weights are marked
 * -0.0f and skipped row by row.
 *
 * Determinism: every row's arithmetic (the FMA chain over d, the order of the
 * keys, the exp, the sums over j in one lane) depends on the pass's size (which
 * path scores it), never on the other rows' data; keys a row does not see add
 * exact zeros, and a tile
 * that a row does not see at all leaves its m, l and O untouched (alpha is
 * exp(0) = 1 exactly), so skipping it for the whole block changes nothing. */
#ifndef MHA_SIMD_FLASH_ATTENTION_H
#define MHA_SIMD_FLASH_ATTENTION_H

#include <math.h>
#include <string.h>

#include "internal.h"
#include "simd/math.h"

enum {
    QT_FLOATS = 128 * RB,      /* packed Q^T: dk chunks of QT_FLOATS / padded rows */
    KV_L2_FLOATS = 128 * 1024, /* K and V of a head fitting in half of a 1 MiB L2 */
    DOT_ROWS = QK_ROWS / 2,    /* passes of at most this many rows score by dot products */
};
_Static_assert(BC % QK_KEYS == 0 && RB % QK_ROWS == 0 && RB_L2 % QK_ROWS == 0
                   && QK_ROWS % VF_LANES == 0 && RB % VF_LANES == 0,
               "tile sizes of the ISA's attention");

/* Rows per pass: RB_L2 keep a pass's tiles in L1 when K and V come from L2;
 * when they stream from further away, RB rows cut that traffic (if dk
 * still fits one chunk of the packed Q). Results do not depend on this choice. */
static int32_t pass_rows(const mha_attn_block *blk)
{
    const int64_t kv = (int64_t)blk->seq_kv * (blk->dk + blk->dv);
    return kv > KV_L2_FLOATS && blk->dk <= QT_FLOATS / RB ? RB : RB_L2;
}

typedef struct span {
    int32_t begin, end;
} span;

_Static_assert(PV_ROWS >= 4, "P.V row groups of the pass's spans");

/* The state of one pass over up to RB query rows: the block's scratch. */
typedef struct pass {
    const mha_attn_block *blk;
    int32_t nr, rp;  /* rows, and rows padded to a multiple of QK_ROWS (the pitch of qt, st),
                        or of VF_LANES for dot products */
    int32_t dc;      /* dk chunk of the packed Q^T: QT_FLOATS / rp */
    int dot;         /* scores by dot products along dk; qt holds scale * q row by row */
    int bias_shared; /* every row reads the same bias row */
    int32_t ke_min;  /* the smallest kv_end of the pass's rows */
    int32_t kb_max;  /* the largest kv_begin of the pass's rows */
    int32_t jmax;    /* the end of the keys the pass reads */
    span all, qk[RB / QK_ROWS], pv[RB / 4]; /* keys seen by the pass, its score and P.V groups */
    int stream;      /* K and V exceed L2: prefetch them (prefetch_tile) */
    int bias_hides;  /* the bias of the current tile holds -INFINITY */
    const float *q[RB], *bias[RB]; /* the pass's rows (bias NULL without one) */
    float *out[RB];
    _Alignas(64) int32_t kb[RB], ke[RB]; /* kv_begin, kv_end; 0 for padding rows */
    _Alignas(64) float slope[RB], pos[RB]; /* ALiBi: slope and position, as floats */
    _Alignas(64) float m[RB], l[RB], alpha[RB];
    _Alignas(64) float qt[QT_FLOATS];
    _Alignas(64) float st[BC * RB];
    float ptail[BC * PV_ROWS]; /* P of a last group of fewer than PV_ROWS rows, padded */
} pass;

/* qt[d][r] = scale * q[r][d0 + d] for d < dc, zero for padding rows: with the
 * scale folded into Q, the scores need no multiply. VF_LANES x VF_LANES blocks
 * are transposed in registers. */
static void pack_qt(pass *ps, int32_t d0, int32_t dc)
{
    const vf scale = vf_set1(ps->blk->scale);
    for (int32_t r0 = 0; r0 < ps->rp; r0 += VF_LANES)
        for (int32_t d = 0; d < dc; d += VF_LANES) {
            const int32_t n = dc - d < VF_LANES ? dc - d : VF_LANES;
            vf a[VF_LANES];
            for (int32_t i = 0; i < VF_LANES; i++) {
                const float *qr = ps->q[r0 + i < ps->nr ? r0 + i : 0] + d0 + d;
                a[i] = r0 + i >= ps->nr ? vf_zero()
                       : n == VF_LANES  ? vf_mul(scale, vf_loadu(qr))
                                        : vf_mul(scale, vf_loadu_n(qr, n));
            }
            vf_transpose(a);
            for (int32_t i = 0; i < n; i++)
                vf_store(ps->qt + (d + i) * ps->rp + r0, a[i]);
        }
}

/* Does any row see a key of [j0, j0 + jn) whose bias is not -INFINITY? */
static int tile_visible(const pass *ps, int32_t j0, int32_t jn)
{
    for (int32_t r = 0; r < ps->nr; r++) {
        const int32_t end = ps->ke[r] < j0 + jn ? ps->ke[r] : j0 + jn;
        for (int32_t j = ps->kb[r] > j0 ? ps->kb[r] : j0; j < end; j++)
            if (ps->bias[r][j] != -INFINITY)
                return 1;
    }
    return 0;
}

/* Asks for K and V of keys [j0, j1) in L2, so that the next tile does not wait
 * on memory when K and V are larger than the caches. A pass of many rows asks
 * for a whole tile at its start; a dot pass, whose compute per key is small,
 * asks for the key one tile ahead at each step, so that its requests stay in
 * flight while it computes (a burst would stall on the fill buffers). */
static void prefetch_rows(const float *x, int64_t stride, int32_t width, int64_t j0, int64_t j1)
{
    for (int64_t j = j0; j < j1; j++)
        for (int32_t d = 0; d < width; d += 16)
            prefetch_l2(x + j * stride + d);
}

static void prefetch_tile(const mha_attn_block *blk, int32_t j0, int32_t j1)
{
    prefetch_rows(blk->k, blk->k_stride, blk->dk, j0, j1);
    prefetch_rows(blk->v, blk->v_stride, blk->dv, j0, j1);
}

/* The keys rows [r0, r1) see: from the smallest kv_begin of a row that sees any
 * to the largest kv_end. */
static span rows_span(const pass *ps, int32_t r0, int32_t r1)
{
    span sp = {INT32_MAX, 0};
    for (int32_t r = r0; r < r1; r++) {
        sp.end = ps->ke[r] > sp.end ? ps->ke[r] : sp.end;
        sp.begin = ps->kb[r] < ps->ke[r] && ps->kb[r] < sp.begin ? ps->kb[r] : sp.begin;
    }
    return sp;
}

/* Those keys within the tile [j0, j0 + jn), relative to j0: [keys_from, keys_to). */
static int32_t keys_to(span sp, int32_t j0, int32_t jn)
{
    return sp.end - j0 < jn ? sp.end - j0 : jn;
}

static int32_t keys_from(span sp, int32_t j0)
{
    return sp.begin - j0 > 0 ? sp.begin - j0 : 0;
}

/* st = Q K^T for keys [j0, j0 + jn), in chunks of ps->dc of dk. A row
 * group skips the key groups that none of its rows sees, which trims the
 * causal diagonal; their entries get -inf (the softmax masks them anyway, but
 * they are never left uninitialized). */
static void scores(pass *ps, int32_t j0, int32_t jn)
{
    const int32_t dh = ps->blk->dk;
    for (int32_t d0 = 0; d0 < dh; d0 += ps->dc) {
        const int32_t dc = dh - d0 < ps->dc ? dh - d0 : ps->dc;
        if (dh > ps->dc)
            pack_qt(ps, d0, dc);
        for (int32_t jg = 0; jg < jn; jg += QK_KEYS) {
            const float *kp[QK_KEYS];
            for (int i = 0; i < QK_KEYS; i++) /* keys past the tile repeat its last one */
                kp[i] = ps->blk->k + (int64_t)(j0 + (jg + i < jn ? jg + i : jn - 1)) * ps->blk->k_stride
                        + d0;
            for (int32_t rg = 0; rg < ps->rp; rg += QK_ROWS) {
                float *st = ps->st + jg * ps->rp + rg;
                const span sp = ps->qk[rg / QK_ROWS];
                if (jg < keys_to(sp, j0, jn) && jg + QK_KEYS > keys_from(sp, j0))
                    qk_tile(dc, kp, ps->qt + rg, ps->rp, st, d0 > 0);
                else
                    for (int i = 0; i < QK_KEYS; i++)
                        for (int32_t c = 0; c < QK_ROWS; c += VF_LANES)
                            vf_store(st + i * ps->rp + c, vf_set1(-INFINITY));
            }
        }
    }
}

/* qt[r][d] = scale * q[r][d] row by row for the dot products. */
static void pack_q_rows(pass *ps)
{
    const int32_t dk = ps->blk->dk;
    const vf scale = vf_set1(ps->blk->scale);
    for (int32_t r = 0; r < ps->nr; r++) {
        float *dst = ps->qt + (int64_t)r * dk;
        int32_t d = 0;
        for (; d + VF_LANES <= dk; d += VF_LANES)
            vf_storeu(dst + d, vf_mul(scale, vf_loadu(ps->q[r] + d)));
        if (d < dk)
            vf_storeu_n(dst + d, dk - d, vf_mul(scale, vf_loadu_n(ps->q[r] + d, dk - d)));
    }
}

/* The dot products of a pass of few rows go R rows (4, 2 or 1) by DOT_SCORES / R
 * keys at a time: DOT_SCORES independent FMA chains (at least 8, to cover the
 * FMA latency), each K vector loaded once for the R rows, so a group of 1..3
 * rows costs 1..3 rows' work. */
enum {
    DOT_REDUCES = (8 + VF_LANES - 1) / VF_LANES, /* lane reductions per step */
    DOT_SCORES = DOT_REDUCES * VF_LANES,        /* scores per step */
};

/* s[kk*R + rr] = sum over d of q[rr*dk + d] k[kk][d] for DOT_SCORES / R keys and
 * R rows: the lane-wise partial sums, then vf_reduce_lanes, which sums every lane
 * in the same order, so that a score does not depend on its slot. */
static inline __attribute__((always_inline)) void dot_tile(const float *q, int32_t dk,
                                                           const float *const *k, float *s,
                                                           const int R)
{
    const int KS = DOT_SCORES / R;
    vf acc[DOT_SCORES];
#pragma GCC unroll 16
    for (int i = 0; i < DOT_SCORES; i++)
        acc[i] = vf_zero();
    const int32_t tail = dk % VF_LANES;
    for (int32_t d = 0; d < dk - tail; d += VF_LANES) {
        vf qv[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++)
            qv[rr] = vf_loadu(q + rr * dk + d);
#pragma GCC unroll 16
        for (int kk = 0; kk < KS; kk++) {
            const vf kv = vf_loadu(k[kk] + d);
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++)
                acc[kk * R + rr] = vf_fmadd(qv[rr], kv, acc[kk * R + rr]);
        }
    }
    if (tail) {
        const int32_t d = dk - tail;
        vf qv[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++)
            qv[rr] = vf_loadu_n(q + rr * dk + d, tail);
#pragma GCC unroll 16
        for (int kk = 0; kk < KS; kk++) {
            const vf kv = vf_loadu_n(k[kk] + d, tail);
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++)
                acc[kk * R + rr] = vf_fmadd(qv[rr], kv, acc[kk * R + rr]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < DOT_REDUCES; i++)
        vf_storeu(s + i * VF_LANES, vf_reduce_lanes(acc + i * VF_LANES));
}

/* The row groups of a dot pass: 4 rows while 4 remain, then 2, then 1. */
static int32_t dot_group(int32_t nr, int32_t r)
{
    return nr - r >= 4 ? 4 : nr - r >= 2 ? 2 : 1;
}

/* st[j][r0 + rr] for keys [j, j + DOT_SCORES) of the tile (those past jt repeat
 * the key jt - 1, and are not stored) and R rows from r0. With pf, keys [pf,
 * pf + DOT_SCORES) are asked for ahead, a sub-step's worth at a time: their K rows
 * before its dot products and their V rows after them, so that the requests stay
 * spread while the FMAs run (a burst would stall on the fill buffers). */
static inline __attribute__((always_inline)) void dot_step(pass *ps, int32_t r0, int32_t j,
                                                           int32_t jt, const float *const *k,
                                                           int64_t pf, const int R)
{
    const int KS = DOT_SCORES / R;
    const mha_attn_block *blk = ps->blk;
    const int32_t dk = blk->dk;
#pragma GCC unroll 4
    for (int sub = 0; sub < R; sub++) {
        const int64_t p0 = pf + sub * KS < ps->jmax ? pf + sub * KS : ps->jmax;
        const int64_t p1 = p0 + KS < ps->jmax ? p0 + KS : ps->jmax;
        if (pf >= 0)
            prefetch_rows(blk->k, blk->k_stride, dk, p0, p1);
        float s[DOT_SCORES];
        dot_tile(ps->qt + (int64_t)r0 * dk, dk, k + sub * KS, s, R);
        if (pf >= 0)
            prefetch_rows(blk->v, blk->v_stride, blk->dv, p0, p1);
        for (int kk = 0; kk < KS && j + sub * KS + kk < jt; kk++)
            for (int rr = 0; rr < R; rr++)
                ps->st[(j + sub * KS + kk) * ps->rp + r0 + rr] = s[kk * R + rr];
    }
}

/* st[j][r] = (scale q[r]).k[j0 + j] for a pass of few rows, DOT_SCORES keys per
 * step for every row group; while K and V stream, the first group asks for the
 * keys one tile ahead. Keys no row sees are not read (-inf). */
static void scores_dot(pass *ps, int32_t j0, int32_t jn)
{
    const mha_attn_block *blk = ps->blk;
    const int32_t nr = ps->nr;
    const int32_t jf = keys_from(ps->all, j0), jt = keys_to(ps->all, j0, jn);
    for (int32_t j = 0; j < jn; j++)
        if (j < jf || j >= jt)
            for (int32_t r = 0; r < nr; r++)
                ps->st[j * ps->rp + r] = -INFINITY;
    for (int32_t j = jf; j < jt; j += DOT_SCORES) {
        const float *k[DOT_SCORES];
        for (int kk = 0; kk < DOT_SCORES; kk++) /* keys past the range repeat its last one */
            k[kk] = blk->k + (int64_t)(j0 + (j + kk < jt ? j + kk : jt - 1)) * blk->k_stride;
        for (int32_t r = 0; r < nr; r += dot_group(nr, r)) {
            const int64_t pf = ps->stream && r == 0 ? j0 + j + BC : -1;
            switch (dot_group(nr, r)) {
            case 4: dot_step(ps, r, j, jt, k, pf, 4); break;
            case 2: dot_step(ps, r, j, jt, k, pf, 2); break;
            default: dot_step(ps, r, j, jt, k, pf, 1); break;
            }
        }
    }
}

/* s + b, or -inf where b is -INFINITY whatever s is (a NaN score of a hidden key). */
static inline vf biased(vf s, vf b, vm *hides)
{
    const vm inf = vf_eq(b, vf_set1(-INFINITY));
    *hides = vm_or(*hides, inf);
    return vf_select(inf, b, vf_add(s, b));
}

static inline float biased1(float s, float b, int *hides)
{
    *hides |= b == -INFINITY;
    return b == -INFINITY ? b : s + b;
}

/* st[j][r] = biased(st[j][r], bias[r][j0 + j]) for rows r < nr, keys j < jn (all
 * inside the bias tensor); notes in ps->bias_hides whether any was -INFINITY. A
 * bias shared by all rows (stride 0, BERT's [B,1,1,S]) is broadcast; otherwise
 * VF_LANES x VF_LANES blocks are transposed in registers. */
static void add_bias(pass *ps, int32_t j0, int32_t jn)
{
    vm hides = vm_none();
    int hides1 = 0;
    if (ps->bias_shared) {
        for (int32_t j = 0; j < jn; j++) {
            const vf b = vf_set1(ps->bias[0][j0 + j]);
            float *s = ps->st + j * ps->rp;
            for (int32_t r = 0; r < ps->nr; r += VF_LANES)
                vf_store(s + r, biased(vf_load(s + r), b, &hides));
        }
        ps->bias_hides = !vm_empty(hides);
        return;
    }
    int32_t rg = 0;
    for (; rg + VF_LANES <= ps->nr; rg += VF_LANES) {
        const float *const *b = ps->bias + rg;
        int32_t j = 0;
        for (; j + VF_LANES <= jn; j += VF_LANES) {
            vf a[VF_LANES];
            for (int i = 0; i < VF_LANES; i++)
                a[i] = vf_loadu(b[i] + j0 + j);
            vf_transpose(a);
            for (int i = 0; i < VF_LANES; i++) {
                float *s = ps->st + (j + i) * ps->rp + rg;
                vf_store(s, biased(vf_load(s), a[i], &hides));
            }
        }
        for (; j < jn; j++)
            for (int32_t i = 0; i < VF_LANES; i++) {
                float *s = &ps->st[j * ps->rp + rg + i];
                *s = biased1(*s, b[i][j0 + j], &hides1);
            }
    }
    for (int32_t r = rg; r < ps->nr; r++)
        for (int32_t j = 0; j < jn; j++) {
            float *s = &ps->st[j * ps->rp + r];
            *s = biased1(*s, ps->bias[r][j0 + j], &hides1);
        }
    ps->bias_hides = hides1 || !vm_empty(hides);
}

/* Are V's rows [j0, j0 + jn) all finite? (x * 0 is 0 for finite x, NaN otherwise.) */
static int v_finite(const mha_attn_block *blk, int32_t j0, int32_t jn)
{
    const int32_t dv = blk->dv;
    vf acc = vf_zero();
    for (int64_t j = j0; j < j0 + jn; j++) {
        const float *v = blk->v + j * blk->v_stride;
        int32_t d = 0;
        for (; d + VF_LANES <= dv; d += VF_LANES)
            acc = vf_fmadd(vf_loadu(v + d), vf_zero(), acc);
        if (d < dv)
            acc = vf_fmadd(vf_loadu_n(v + d, dv - d), vf_zero(), acc);
    }
    return vm_all(vf_eq(acc, acc));
}

/* st = softcap * tanh(st / softcap) over the tile's rows. */
static void softcap_tile(pass *ps, int32_t jn)
{
    const vf cap = vf_set1(ps->blk->softcap), inv = vf_set1(1.0f / ps->blk->softcap);
    for (int32_t j = 0; j < jn; j++)
        for (int32_t g = 0; g < ps->rp; g += VF_LANES) {
            float *sp = ps->st + j * ps->rp + g;
            vf_store(sp, vf_mul(cap, vf_tanh(vf_mul(vf_load(sp), inv))));
        }
}

/* st += slope * (j - pos) for key j of the tile: ALiBi from the slopes. */
static void alibi_tile(pass *ps, int32_t j0, int32_t jn)
{
    for (int32_t g = 0; g < ps->rp; g += VF_LANES) {
        const vf slope = vf_load(ps->slope + g), pos = vf_load(ps->pos + g);
        for (int32_t j = 0; j < jn; j++) {
            float *sp = ps->st + j * ps->rp + g;
            vf_store(sp, vf_fmadd(slope, vf_sub(vf_set1((float)(j0 + j)), pos), vf_load(sp)));
        }
    }
}

/* The online softmax for one tile, per row (vector lanes across rows):
 *   s_j = (scale q).k_j + bias_j for visible keys, -inf for the others
 *   m' = max(m, max_j s_j);   P_j = exp(s_j - m');   alpha = exp(m - m')
 *   l' = alpha l + sum_j P_j; (then O' = diag(alpha) O + P V in pv)
 * A row that has seen no visible key yet has m' = -inf: it uses 0 in place of
 * m', so P = 0 and alpha = 0 (O and l stay 0) instead of NaN. st becomes P;
 * with `careful`, the P of hidden keys (s = -inf) is -0.0f. */
static void softmax_tile(pass *ps, int32_t j0, int32_t jn, int careful)
{
    const vf ninf = vf_set1(-INFINITY);
    for (int32_t g = 0; g < ps->rp; g += VF_LANES) {
        const vi ke = vi_load(ps->ke + g), kb = vi_load(ps->kb + g);
        vf mt = ninf;
        if (vm_all(vi_gt(ke, j0 + jn - 1)) && vm_empty(vi_gt(kb, j0))) {
            /* Every row sees the whole tile: four independent chains of max. */
            vf m1 = ninf, m2 = ninf, m3 = ninf;
            int32_t j = 0;
            for (; j + 4 <= jn; j += 4) {
                mt = vf_max(mt, vf_load(ps->st + j * ps->rp + g));
                m1 = vf_max(m1, vf_load(ps->st + (j + 1) * ps->rp + g));
                m2 = vf_max(m2, vf_load(ps->st + (j + 2) * ps->rp + g));
                m3 = vf_max(m3, vf_load(ps->st + (j + 3) * ps->rp + g));
            }
            for (; j < jn; j++)
                mt = vf_max(mt, vf_load(ps->st + j * ps->rp + g));
            mt = vf_max(vf_max(mt, m1), vf_max(m2, m3));
        } else {
            for (int32_t j = 0; j < jn; j++) {
                float *sp = ps->st + j * ps->rp + g;
                const vf s = vf_select(vm_andnot(vi_gt(ke, j0 + j), vi_gt(kb, j0 + j)), vf_load(sp),
                                       ninf);
                vf_store(sp, s);
                mt = vf_max(mt, s);
            }
        }
        const vf m = vf_load(ps->m + g);
        const vf mn = vf_max(m, mt);
        const vf mu = vf_select(vf_eq(mn, ninf), vf_zero(), mn);
        const vf alpha = vf_exp(vf_sub(m, mu));
        vf sum = vf_zero();
        if (careful)
            for (int32_t j = 0; j < jn; j++) {
                float *sp = ps->st + j * ps->rp + g;
                const vf s = vf_load(sp);
                const vf p = vf_select(vf_eq(s, ninf), vf_set1(-0.0f), vf_exp(vf_sub(s, mu)));
                vf_store(sp, p);
                sum = vf_add(sum, p);
            }
        else
            for (int32_t j = 0; j < jn; j++) {
                float *sp = ps->st + j * ps->rp + g;
                const vf p = vf_exp(vf_sub(vf_load(sp), mu));
                vf_store(sp, p);
                sum = vf_add(sum, p);
            }
        vf_store(ps->m + g, mn);
        vf_store(ps->l + g, vf_fmadd(alpha, vf_load(ps->l + g), sum));
        vf_store(ps->alpha + g, alpha);
    }
}

/* pv_tile for the first `cols` (1..VF_LANES) columns: dv tails. */
static void pv_tail(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[PV_ROWS], const vf alpha[PV_ROWS], int valid, int32_t cols)
{
    vf c[PV_ROWS];
    for (int i = 0; i < PV_ROWS; i++)
        c[i] = vf_mul(alpha[i], vf_loadu_n(o[i], cols));
    for (int32_t j = 0; j < jn; j++) {
        const vf v0 = vf_loadu_n(v + j * ldv, cols);
        for (int i = 0; i < PV_ROWS; i++)
            c[i] = vf_fmadd(vf_set1(p[(int64_t)j * pp + i]), v0, c[i]);
    }
    for (int i = 0; i < valid; i++)
        vf_storeu_n(o[i], cols, c[i]);
}

/* The careful P.V of row r: O = alpha O + sum over keys js <= j < jv whose P is
 * not the -0.0f of a hidden key of P_j V_j, in the order of the tile kernels. */
static void pv_row_careful(pass *ps, int32_t r, const float *v, int32_t js, int32_t jv)
{
    const int32_t dh = ps->blk->dv;
    const int64_t ldv = ps->blk->v_stride;
    float *o = ps->out[r];
    const vf alpha = vf_set1(ps->alpha[r]);
    for (int32_t d = 0; d < dh; d += VF_LANES) {
        const int32_t n = dh - d < VF_LANES ? dh - d : VF_LANES;
        vf acc = vf_mul(alpha, vf_loadu_n(o + d, n));
        for (int32_t j = js; j < jv; j++) {
            const float p = ps->st[j * ps->rp + r];
            if (p == 0.0f && signbit(p))
                continue;
            acc = vf_fmadd(vf_set1(p), vf_loadu_n(v + j * ldv + d, n), acc);
        }
        vf_storeu_n(o + d, n, acc);
    }
}

/* Accumulators of the dot passes' P.V: half the register file. */
enum { DOT_ACC = VF_REGS / 2 };

/* o[rr] = alpha[rr] o[rr] + sum_{j < jn} p[j*pp + rr] v[j] over `cols` columns
 * (1..W, W = DOT_ACC / R vectors; all W when full) for R rows (4, 2 or 1):
 * DOT_ACC accumulators, each V vector loaded once for the R rows. */
static inline __attribute__((always_inline)) void pv_rows_cols(
    int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv, float *const *o,
    const float *alpha, int32_t cols, int full, const int R)
{
    const int CV = DOT_ACC / R;
    vf acc[DOT_ACC];
    int32_t n[DOT_ACC];
#pragma GCC unroll 16
    for (int c = 0; c < CV; c++)
        n[c] = full ? VF_LANES : cols - c * VF_LANES < 0 ? 0
               : cols - c * VF_LANES > VF_LANES        ? VF_LANES
                                                       : cols - c * VF_LANES;
#pragma GCC unroll 16
    for (int i = 0; i < R * CV; i++) {
        const float *src = o[i / CV] + i % CV * VF_LANES;
        acc[i] = vf_mul(vf_set1(alpha[i / CV]), full ? vf_loadu(src) : vf_loadu_n(src, n[i % CV]));
    }
    for (int32_t j = 0; j < jn; j++) {
        vf vv[DOT_ACC];
#pragma GCC unroll 16
        for (int c = 0; c < CV; c++)
            vv[c] = full ? vf_loadu(v + j * ldv + c * VF_LANES)
                         : vf_loadu_n(v + j * ldv + c * VF_LANES, n[c]);
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++) {
            const vf pb = vf_set1(p[(int64_t)j * pp + rr]);
#pragma GCC unroll 16
            for (int c = 0; c < CV; c++)
                acc[rr * CV + c] = vf_fmadd(pb, vv[c], acc[rr * CV + c]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R * CV; i++) {
        float *dst = o[i / CV] + i % CV * VF_LANES;
        if (full)
            vf_storeu(dst, acc[i]);
        else
            vf_storeu_n(dst, n[i % CV], acc[i]);
    }
}

/* pv_rows_cols over all dv columns. */
static inline __attribute__((always_inline)) void pv_rows(int32_t jn, const float *p, int32_t pp,
                                                          const float *v, int64_t ldv,
                                                          float *const *o, const float *alpha,
                                                          int32_t dv, const int R)
{
    const int32_t W = DOT_ACC / R * VF_LANES;
    float *od[4];
    for (int32_t d = 0; d < dv; d += W) {
        for (int rr = 0; rr < R; rr++)
            od[rr] = o[rr] + d;
        if (dv - d >= W)
            pv_rows_cols(jn, p, pp, v + d, ldv, od, alpha, W, 1, R);
        else
            pv_rows_cols(jn, p, pp, v + d, ldv, od, alpha, dv - d, 0, R);
    }
}

/* The P.V of a dot pass's rows [rg, rg + valid), in the row groups of its scores. */
static void pv_dot(pass *ps, int32_t rg, int valid, const float *v, int32_t js, int32_t jv)
{
    const int64_t ldv = ps->blk->v_stride;
    for (int32_t r = rg; r < rg + valid; r += dot_group(rg + valid, r)) {
        const float *p = ps->st + js * ps->rp + r;
        const float *vs = v + js * ldv;
        switch (dot_group(rg + valid, r)) {
        case 4: pv_rows(jv - js, p, ps->rp, vs, ldv, ps->out + r, ps->alpha + r, ps->blk->dv, 4); break;
        case 2: pv_rows(jv - js, p, ps->rp, vs, ldv, ps->out + r, ps->alpha + r, ps->blk->dv, 2); break;
        default: pv_rows(jv - js, p, ps->rp, vs, ldv, ps->out + r, ps->alpha + r, ps->blk->dv, 1); break;
        }
    }
}

/* O = diag(alpha) O + P V[j0 .. j0 + jn) over the pass's rows. A row group
 * runs from the first to the last key any of its rows sees (P is 0 outside),
 * and a group that sees none of the tile keeps O (alpha is 1 or O is 0). */
static void pv(pass *ps, int32_t j0, int32_t jn, int careful)
{
    const int32_t dh = ps->blk->dv;
    const int64_t ldv = ps->blk->v_stride;
    const float *v = ps->blk->v + j0 * ldv;
    const int32_t group = ps->dot ? 4 : PV_ROWS;
    for (int32_t rg = 0; rg < ps->nr; rg += group) {
        const int valid = ps->nr - rg < group ? ps->nr - rg : group;
        const span sp = ps->pv[rg / group];
        const int32_t js = keys_from(sp, j0), jv = keys_to(sp, j0, jn);
        if (jv <= js)
            continue;
        if (careful) {
            for (int32_t r = rg; r < rg + valid; r++)
                pv_row_careful(ps, r, v, js, jv);
            continue;
        }
        if (ps->dot) {
            pv_dot(ps, rg, valid, v, js, jv);
            continue;
        }
        const float *p = ps->st + js * ps->rp + rg;
        int32_t pp = ps->rp;
        float *o[PV_ROWS];
        vf alpha[PV_ROWS];
        for (int i = 0; i < PV_ROWS; i++) { /* rows past the pass repeat its last one */
            const int32_t r = i < valid ? rg + i : ps->nr - 1;
            o[i] = ps->out[r];
            alpha[i] = vf_set1(ps->alpha[r]);
        }
        if (valid < PV_ROWS) {
            for (int32_t j = js; j < jv; j++)
                for (int i = 0; i < PV_ROWS; i++)
                    ps->ptail[(j - js) * PV_ROWS + i] =
                        ps->st[j * ps->rp + (i < valid ? rg + i : ps->nr - 1)];
            p = ps->ptail;
            pp = PV_ROWS;
        }
        float *od[PV_ROWS];
        int32_t d = 0;
        for (; d + PV_COLS <= dh; d += PV_COLS) {
            for (int i = 0; i < PV_ROWS; i++)
                od[i] = o[i] + d;
            pv_tile(jv - js, p, pp, v + js * ldv + d, ldv, od, alpha, valid);
        }
        for (; d < dh; d += VF_LANES) {
            for (int i = 0; i < PV_ROWS; i++)
                od[i] = o[i] + d;
            pv_tail(jv - js, p, pp, v + js * ldv + d, ldv, od, alpha, valid,
                    dh - d < VF_LANES ? dh - d : VF_LANES);
        }
    }
}

static void attend_pass(const mha_attn_block *blk, int32_t r0, int32_t nr)
{
    pass *ps = blk->scratch;
    const int32_t dk = blk->dk, dv = blk->dv;
    ps->blk = blk;
    ps->nr = nr;
    ps->dot = nr <= DOT_ROWS && (int64_t)nr * dk <= QT_FLOATS;
    ps->rp = ps->dot ? (nr + VF_LANES - 1) / VF_LANES * VF_LANES
                     : (nr + QK_ROWS - 1) / QK_ROWS * QK_ROWS;
    ps->bias_shared = blk->bias != NULL;
    /* Row r0 + r is row i of group g: walk (g, i) rather than divide per row. */
    for (int32_t r = 0, g = r0 / blk->group_rows, i = r0 % blk->group_rows; r < nr; r++) {
        ps->q[r] = blk->q + g * blk->q_group_stride + i * blk->q_stride;
        ps->out[r] = blk->out + g * blk->out_group_stride + i * blk->out_stride;
        ps->bias[r] = blk->bias ? blk->bias + g * blk->bias_group_stride + i * blk->bias_stride
                                : NULL;
        ps->bias_shared &= ps->bias[r] == ps->bias[0];
        if (++i == blk->group_rows)
            i = 0, g++;
    }

    int32_t jmax = 0;
    ps->ke_min = INT32_MAX;
    ps->kb_max = 0;
    for (int32_t r = 0; r < ps->rp; r++) {
        ps->ke[r] = r < nr ? blk->kv_end[r0 + r] : 0;
        ps->kb[r] = r < nr && blk->kv_begin ? blk->kv_begin[r0 + r] : 0;
        jmax = ps->ke[r] > jmax ? ps->ke[r] : jmax;
        ps->ke_min = r < nr && ps->ke[r] < ps->ke_min ? ps->ke[r] : ps->ke_min;
        ps->kb_max = ps->kb[r] > ps->kb_max ? ps->kb[r] : ps->kb_max;
        ps->slope[r] = r < nr && blk->alibi_slope ? blk->alibi_slope[r0 + r] : 0.0f;
        ps->pos[r] = r < nr && blk->alibi_slope ? (float)blk->alibi_pos[r0 + r] : 0.0f;
        ps->m[r] = -INFINITY;
        ps->l[r] = 0.0f;
    }
    ps->all = rows_span(ps, 0, nr);
    for (int32_t rg = 0; !ps->dot && rg < ps->rp; rg += QK_ROWS)
        ps->qk[rg / QK_ROWS] = rows_span(ps, rg, rg + QK_ROWS);
    const int32_t group = ps->dot ? 4 : PV_ROWS;
    for (int32_t rg = 0; rg < nr; rg += group)
        ps->pv[rg / group] = rows_span(ps, rg, rg + group < nr ? rg + group : nr);
    const int32_t jmin = keys_from(ps->all, 0);
    ps->jmax = jmax;
    ps->stream = (int64_t)(jmax - jmin) * (dk + dv) > KV_L2_FLOATS;
    for (int32_t r = 0; r < nr; r++) { /* O = 0, in vectors: rows are short */
        int32_t d = 0;
        for (; d + VF_LANES <= dv; d += VF_LANES)
            vf_storeu(ps->out[r] + d, vf_zero());
        if (d < dv)
            vf_storeu_n(ps->out[r] + d, dv - d, vf_zero());
    }
    ps->dc = QT_FLOATS / ps->rp;
    if (ps->dot)
        pack_q_rows(ps);
    else if (dk <= ps->dc)
        pack_qt(ps, 0, dk);

    /* Keys outside the pass's visible range are never read: a window costs
       its width, not the sequence. */
    for (int32_t j0 = jmin; j0 < jmax; j0 += BC) {
        const int32_t jn = jmax - j0 < BC ? jmax - j0 : BC;
        if (blk->bias && !tile_visible(ps, j0, jn))
            continue;
        if (!ps->dot && j0 + jn < jmax)
            prefetch_tile(blk, j0 + jn, jmax - j0 - jn < BC ? jmax : j0 + jn + BC);
        if (ps->dot)
            scores_dot(ps, j0, jn);
        else
            scores(ps, j0, jn);
        if (blk->softcap > 0.0f)
            softcap_tile(ps, jn);
        ps->bias_hides = 0;
        if (blk->bias)
            add_bias(ps, j0, jn);
        if (blk->alibi_slope)
            alibi_tile(ps, j0, jn);
        /* Some row hides a key of the tile that another row sees. */
        const int hides = ps->ke_min < j0 + jn || ps->kb_max > j0 || ps->bias_hides;
        const int careful = hides && !v_finite(blk, j0, jn);
        softmax_tile(ps, j0, jn, careful);
        pv(ps, j0, jn, careful);
    }

    /* O /= l (+ exp(sink - m)); rows that saw no key have l = 0 and O = 0 and
       stay zeros, with lse -inf. */
    for (int32_t r = 0; r < nr; r++) {
        const float l = ps->l[r];
        if (blk->lse)
            blk->lse[r0 + r] = l == 0.0f ? -INFINITY : ps->m[r] + logf(l);
        if (l == 0.0f)
            continue;
        const vf den = vf_set1(blk->sink ? l + expf(blk->sink[r0 + r] - ps->m[r]) : l);
        float *o = ps->out[r];
        int32_t d = 0;
        for (; d + VF_LANES <= dv; d += VF_LANES)
            vf_storeu(o + d, vf_div(vf_loadu(o + d), den));
        if (d < dv)
            vf_storeu_n(o + d, dv - d, vf_div(vf_loadu_n(o + d, dv - d), den));
    }
}

static void flash_attn_block(const mha_attn_block *blk)
{
    const int32_t pr = pass_rows(blk);
    for (int32_t r0 = 0; r0 < blk->rows; r0 += pr)
        attend_pass(blk, r0, blk->rows - r0 < pr ? blk->rows - r0 : pr);
}

#endif
