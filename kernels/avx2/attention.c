/* AVX2+FMA fused attention, flash-attention style: per pass of up to RB query
 * rows, tiles of BC keys, an online softmax, never the Sq x Skv score matrix.
 *
 * Layout. Q is packed once per pass transposed, qt[d][r] (rows padded with
 * zeros to a multiple of 16), so the score tile is computed transposed,
 *     st[j][r] = sum_d K[j][d] qt[d][r]
 * by a 6-key x 16-row register tile that broadcasts K straight from memory:
 * no per-tile packing of K. Vectors run across query rows, so the softmax
 * statistics m, l are vectors too and need no horizontal reductions. P.V is a
 * 6-row x 16-column tile that broadcasts p from st and loads V rows straight
 * from memory; the output rows in blk->out are the accumulator. head_dim is
 * cut in chunks for the packed Q (chunking the d loop of a dot product
 * and resuming from the stored partial sum keeps every bit), so the stack use
 * is fixed (about 80 KiB) for any head_dim.
 *
 * Determinism: every row's arithmetic (the FMA chain over d, the order of the
 * keys, the exp, the sums over j in one lane) is the same whatever the other
 * rows of the block are; keys a row does not see add exact zeros, and a tile
 * that a row does not see at all leaves its m, l and O untouched (alpha is
 * exp(0) = 1 exactly), so skipping it for the whole block changes nothing. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "internal.h"

enum {
    RB = 96,                   /* most rows per pass: 6 groups of 16 (QK^T), 16 of 6 (PV) */
    BC = 72,                   /* keys per tile, a multiple of 6 */
    QT_FLOATS = 128 * RB,      /* packed Q^T: head_dim chunks of QT_FLOATS / padded rows */
    KV_L2_FLOATS = 128 * 1024, /* K and V of a head fitting in half of a 1 MiB L2 */
};

/* Rows per pass: 48 keep a pass's tiles in L1 when K and V come from L2; when
 * they stream from further away, 96 rows halve that traffic (if head_dim still
 * fits one chunk of the packed Q). Results do not depend on this choice. */
static int32_t pass_rows(const mha_attn_block *blk)
{
    const int64_t kv = 2 * (int64_t)blk->seq_kv * blk->head_dim;
    return kv > KV_L2_FLOATS && blk->head_dim <= QT_FLOATS / RB ? RB : 48;
}

/* exp(x) for x <= 0: x = n ln2 + r with |r| <= ln2/2 (n = x log2(e) rounded by
 * the 1.5*2^23 trick; Cody-Waite: ln2 split in a 9-bit head and a tail), then
 * exp(r) = 1 + r + r^2 p(r) with the degree-5 minimax p of Cephes' expf, and 2^n
 * inserted in the exponent field. x < ln(FLT_MIN) gives 0 (so -INFINITY gives
 * 0), NaN stays NaN, exp(0) = 1 exactly.
 * Measured over every float in [-87.3, 0] against glibc expf: max error 1 ulp
 * (99.2% of them exact). */
static inline __m256 exp8(__m256 x)
{
    /* t = x log2(e) + 1.5 * 2^23 + 127 rounds to an integer whose low bits are n + 127. */
    const __m256 magic = _mm256_set1_ps(12583039.0f);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
                                   _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654475f), _CMP_LT_OQ);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

void mha_exp_array__avx2(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(y + i, mask, exp8(_mm256_maskload_ps(x + i, mask)));
    }
}

/* st[i][0..16) (+)= sum_{d < dc} kp[i][d] qt[d][0..16) for 6 keys i; rp is the
 * row pitch of qt and st. accumulate resumes the FMA chains of the previous
 * head_dim chunk from st. Named accumulators (not an array) and noinline (its
 * own register allocation) keep all 12 accumulators and 6 pointers in registers. */
__attribute__((noinline))
static void qk_6x16(int32_t dc, const float *const kp[6], const float *qt, int32_t rp, float *st,
                    int accumulate)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    if (accumulate) {
        c00 = _mm256_load_ps(st), c01 = _mm256_load_ps(st + 8);
        c10 = _mm256_load_ps(st + rp), c11 = _mm256_load_ps(st + rp + 8);
        c20 = _mm256_load_ps(st + 2 * rp), c21 = _mm256_load_ps(st + 2 * rp + 8);
        c30 = _mm256_load_ps(st + 3 * rp), c31 = _mm256_load_ps(st + 3 * rp + 8);
        c40 = _mm256_load_ps(st + 4 * rp), c41 = _mm256_load_ps(st + 4 * rp + 8);
        c50 = _mm256_load_ps(st + 5 * rp), c51 = _mm256_load_ps(st + 5 * rp + 8);
    }
    const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3], *k4 = kp[4], *k5 = kp[5];
    for (int32_t d = 0; d < dc; d++) {
        const __m256 q0 = _mm256_load_ps(qt + (int64_t)d * rp);
        const __m256 q1 = _mm256_load_ps(qt + (int64_t)d * rp + 8);
        __m256 kb = _mm256_broadcast_ss(k0 + d);
        c00 = _mm256_fmadd_ps(kb, q0, c00), c01 = _mm256_fmadd_ps(kb, q1, c01);
        kb = _mm256_broadcast_ss(k1 + d);
        c10 = _mm256_fmadd_ps(kb, q0, c10), c11 = _mm256_fmadd_ps(kb, q1, c11);
        kb = _mm256_broadcast_ss(k2 + d);
        c20 = _mm256_fmadd_ps(kb, q0, c20), c21 = _mm256_fmadd_ps(kb, q1, c21);
        kb = _mm256_broadcast_ss(k3 + d);
        c30 = _mm256_fmadd_ps(kb, q0, c30), c31 = _mm256_fmadd_ps(kb, q1, c31);
        kb = _mm256_broadcast_ss(k4 + d);
        c40 = _mm256_fmadd_ps(kb, q0, c40), c41 = _mm256_fmadd_ps(kb, q1, c41);
        kb = _mm256_broadcast_ss(k5 + d);
        c50 = _mm256_fmadd_ps(kb, q0, c50), c51 = _mm256_fmadd_ps(kb, q1, c51);
    }
    _mm256_store_ps(st, c00), _mm256_store_ps(st + 8, c01);
    _mm256_store_ps(st + rp, c10), _mm256_store_ps(st + rp + 8, c11);
    _mm256_store_ps(st + 2 * rp, c20), _mm256_store_ps(st + 2 * rp + 8, c21);
    _mm256_store_ps(st + 3 * rp, c30), _mm256_store_ps(st + 3 * rp + 8, c31);
    _mm256_store_ps(st + 4 * rp, c40), _mm256_store_ps(st + 4 * rp + 8, c41);
    _mm256_store_ps(st + 5 * rp, c50), _mm256_store_ps(st + 5 * rp + 8, c51);
}

/* o[i][0..16) = alpha[i] o[i] + sum_{j < jn} p[j*pp + i] v[j][0..16) for 6 rows i,
 * storing the first `valid` rows. */
__attribute__((noinline))
static void pv_6x16(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[6], const __m256 alpha[6], int valid)
{
    __m256 c00 = _mm256_mul_ps(alpha[0], _mm256_loadu_ps(o[0]));
    __m256 c01 = _mm256_mul_ps(alpha[0], _mm256_loadu_ps(o[0] + 8));
    __m256 c10 = _mm256_mul_ps(alpha[1], _mm256_loadu_ps(o[1]));
    __m256 c11 = _mm256_mul_ps(alpha[1], _mm256_loadu_ps(o[1] + 8));
    __m256 c20 = _mm256_mul_ps(alpha[2], _mm256_loadu_ps(o[2]));
    __m256 c21 = _mm256_mul_ps(alpha[2], _mm256_loadu_ps(o[2] + 8));
    __m256 c30 = _mm256_mul_ps(alpha[3], _mm256_loadu_ps(o[3]));
    __m256 c31 = _mm256_mul_ps(alpha[3], _mm256_loadu_ps(o[3] + 8));
    __m256 c40 = _mm256_mul_ps(alpha[4], _mm256_loadu_ps(o[4]));
    __m256 c41 = _mm256_mul_ps(alpha[4], _mm256_loadu_ps(o[4] + 8));
    __m256 c50 = _mm256_mul_ps(alpha[5], _mm256_loadu_ps(o[5]));
    __m256 c51 = _mm256_mul_ps(alpha[5], _mm256_loadu_ps(o[5] + 8));
    for (int32_t j = 0; j < jn; j++) {
        const float *pj = p + (int64_t)j * pp;
        const __m256 v0 = _mm256_loadu_ps(v + j * ldv);
        const __m256 v1 = _mm256_loadu_ps(v + j * ldv + 8);
        __m256 pb = _mm256_broadcast_ss(pj);
        c00 = _mm256_fmadd_ps(pb, v0, c00), c01 = _mm256_fmadd_ps(pb, v1, c01);
        pb = _mm256_broadcast_ss(pj + 1);
        c10 = _mm256_fmadd_ps(pb, v0, c10), c11 = _mm256_fmadd_ps(pb, v1, c11);
        pb = _mm256_broadcast_ss(pj + 2);
        c20 = _mm256_fmadd_ps(pb, v0, c20), c21 = _mm256_fmadd_ps(pb, v1, c21);
        pb = _mm256_broadcast_ss(pj + 3);
        c30 = _mm256_fmadd_ps(pb, v0, c30), c31 = _mm256_fmadd_ps(pb, v1, c31);
        pb = _mm256_broadcast_ss(pj + 4);
        c40 = _mm256_fmadd_ps(pb, v0, c40), c41 = _mm256_fmadd_ps(pb, v1, c41);
        pb = _mm256_broadcast_ss(pj + 5);
        c50 = _mm256_fmadd_ps(pb, v0, c50), c51 = _mm256_fmadd_ps(pb, v1, c51);
    }
    const __m256 c[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < valid; i++) {
        _mm256_storeu_ps(o[i], c[i][0]);
        _mm256_storeu_ps(o[i] + 8, c[i][1]);
    }
}

/* The same for 8 columns of which `mask` selects the first 1..8 (head_dim tails). */
static void pv_6x8(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                   float *const o[6], const __m256 alpha[6], int valid, __m256i mask)
{
    __m256 c[6];
    for (int i = 0; i < 6; i++)
        c[i] = _mm256_mul_ps(alpha[i], _mm256_maskload_ps(o[i], mask));
    for (int32_t j = 0; j < jn; j++) {
        const __m256 v0 = _mm256_maskload_ps(v + j * ldv, mask);
        for (int i = 0; i < 6; i++)
            c[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (int64_t)j * pp + i), v0, c[i]);
    }
    for (int i = 0; i < valid; i++)
        _mm256_maskstore_ps(o[i], mask, c[i]);
}

/* The state of one pass over up to RB query rows. */
typedef struct pass {
    const mha_attn_block *blk;
    int32_t nr, rp;  /* rows, and rows padded to a multiple of 16 (the pitch of qt, st) */
    int32_t dc;      /* head_dim chunk: QT_FLOATS / rp */
    const float *q;  /* row 0 of the pass */
    const float *bias;
    float *out;
    _Alignas(32) int32_t ke[RB]; /* kv_end, 0 for padding rows */
    _Alignas(32) float m[RB], l[RB], alpha[RB];
    _Alignas(32) float qt[QT_FLOATS];
    _Alignas(32) float st[BC * RB];
    float ptail[BC * 6]; /* P of a last group of fewer than 6 rows, padded */
} pass;

/* qt[d][r] = scale * q[r][d0 + d] for d < dc, zero for padding rows: with the
 * scale folded into Q, the scores need no multiply. */
static void pack_qt(pass *ps, int32_t d0, int32_t dc)
{
    const float scale = ps->blk->scale;
    for (int32_t r = 0; r < ps->rp; r++) {
        const float *qr = ps->q + r * ps->blk->q_stride + d0;
        for (int32_t d = 0; d < dc; d++)
            ps->qt[d * ps->rp + r] = r < ps->nr ? scale * qr[d] : 0.0f;
    }
}

/* Does any row see a key of [j0, j0 + jn) whose bias is not -INFINITY? */
static int tile_visible(const pass *ps, int32_t j0, int32_t jn)
{
    for (int32_t r = 0; r < ps->nr; r++) {
        const float *b = ps->bias + r * ps->blk->bias_stride + j0;
        const int32_t n = ps->ke[r] - j0 < jn ? ps->ke[r] - j0 : jn;
        for (int32_t j = 0; j < n; j++)
            if (b[j] != -INFINITY)
                return 1;
    }
    return 0;
}

/* Asks for K and V of keys [j0, j1) in L2 (both contiguous), so that the next
 * tile does not wait on memory when K and V are larger than the caches. */
static void prefetch_tile(const mha_attn_block *blk, int32_t j0, int32_t j1)
{
    const int64_t end = (int64_t)j1 * blk->head_dim;
    for (int64_t i = (int64_t)j0 * blk->head_dim; i < end; i += 16) {
        _mm_prefetch((const char *)(blk->k + i), _MM_HINT_T1);
        _mm_prefetch((const char *)(blk->v + i), _MM_HINT_T1);
    }
}

/* Keys of [j0, j0 + jn) that some row r of [r0, r1) sees: j < kv_end[r]. */
static int32_t keys_seen(const pass *ps, int32_t r0, int32_t r1, int32_t j0, int32_t jn)
{
    int32_t end = 0;
    for (int32_t r = r0; r < r1; r++)
        end = ps->ke[r] > end ? ps->ke[r] : end;
    return end - j0 < jn ? end - j0 : jn;
}

/* st = Q K^T for keys [j0, j0 + jn), in chunks of ps->dc of head_dim. A 16-row
 * group skips the 6-key groups that none of its rows sees, which trims the
 * causal diagonal; their entries get -inf (the softmax masks them anyway, but
 * they are never left uninitialized). */
static void scores(pass *ps, int32_t j0, int32_t jn)
{
    const int32_t dh = ps->blk->head_dim;
    for (int32_t d0 = 0; d0 < dh; d0 += ps->dc) {
        const int32_t dc = dh - d0 < ps->dc ? dh - d0 : ps->dc;
        if (dh > ps->dc)
            pack_qt(ps, d0, dc);
        for (int32_t jg = 0; jg < jn; jg += 6) {
            const float *kp[6];
            for (int i = 0; i < 6; i++) /* keys past the tile repeat its last one */
                kp[i] = ps->blk->k + (int64_t)(j0 + (jg + i < jn ? jg + i : jn - 1)) * dh + d0;
            for (int32_t rg = 0; rg < ps->rp; rg += 16) {
                float *st = ps->st + jg * ps->rp + rg;
                if (jg < keys_seen(ps, rg, rg + 16, j0, jn))
                    qk_6x16(dc, kp, ps->qt + rg, ps->rp, st, d0 > 0);
                else
                    for (int i = 0; i < 6; i++) {
                        _mm256_store_ps(st + i * ps->rp, _mm256_set1_ps(-INFINITY));
                        _mm256_store_ps(st + i * ps->rp + 8, _mm256_set1_ps(-INFINITY));
                    }
            }
        }
    }
}

/* 8x8 transpose of rows a[0..8) (in place). */
static void transpose8(__m256 a[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        a[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* st[j][r] += bias[r][j0 + j] for rows r < nr, keys j < jn (all inside the bias
 * tensor); 8x8 blocks are transposed in registers. */
static void add_bias(pass *ps, int32_t j0, int32_t jn)
{
    const int64_t bs = ps->blk->bias_stride;
    int32_t rg = 0;
    for (; rg + 8 <= ps->nr; rg += 8) {
        const float *b = ps->bias + rg * bs + j0;
        int32_t j = 0;
        for (; j + 8 <= jn; j += 8) {
            __m256 a[8];
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_loadu_ps(b + i * bs + j);
            transpose8(a);
            for (int i = 0; i < 8; i++) {
                float *s = ps->st + (j + i) * ps->rp + rg;
                _mm256_store_ps(s, _mm256_add_ps(_mm256_load_ps(s), a[i]));
            }
        }
        for (; j < jn; j++)
            for (int32_t i = 0; i < 8; i++)
                ps->st[j * ps->rp + rg + i] += b[i * bs + j];
    }
    for (int32_t r = rg; r < ps->nr; r++)
        for (int32_t j = 0; j < jn; j++)
            ps->st[j * ps->rp + r] += ps->bias[r * bs + j0 + j];
}

/* The online softmax for one tile, per row (vector lanes across rows):
 *   s_j = (scale q).k_j + bias_j for visible keys, -inf for the others
 *   m' = max(m, max_j s_j);   P_j = exp(s_j - m');   alpha = exp(m - m')
 *   l' = alpha l + sum_j P_j; (then O' = diag(alpha) O + P V in pv)
 * A row that has seen no visible key yet has m' = -inf: it uses 0 in place of
 * m', so P = 0 and alpha = 0 (O and l stay 0) instead of NaN. st becomes P. */
static void softmax_tile(pass *ps, int32_t j0, int32_t jn)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int32_t g = 0; g < ps->rp; g += 8) {
        const __m256i ke = _mm256_load_si256((const __m256i *)(ps->ke + g));
        const __m256i last = _mm256_set1_epi32(j0 + jn - 1);
        __m256 mt = ninf;
        if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(ke, last))) == 0xff) {
            for (int32_t j = 0; j < jn; j++) /* every row sees the whole tile */
                mt = _mm256_max_ps(mt, _mm256_load_ps(ps->st + j * ps->rp + g));
        } else {
            for (int32_t j = 0; j < jn; j++) {
                float *sp = ps->st + j * ps->rp + g;
                const __m256i jv = _mm256_set1_epi32(j0 + j);
                const __m256 vis = _mm256_castsi256_ps(_mm256_cmpgt_epi32(ke, jv));
                const __m256 s = _mm256_blendv_ps(ninf, _mm256_load_ps(sp), vis);
                _mm256_store_ps(sp, s);
                mt = _mm256_max_ps(mt, s);
            }
        }
        const __m256 m = _mm256_load_ps(ps->m + g);
        const __m256 mn = _mm256_max_ps(m, mt);
        const __m256 mu = _mm256_andnot_ps(_mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ), mn);
        const __m256 alpha = exp8(_mm256_sub_ps(m, mu));
        __m256 sum = _mm256_setzero_ps();
        for (int32_t j = 0; j < jn; j++) {
            float *sp = ps->st + j * ps->rp + g;
            const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(sp), mu));
            _mm256_store_ps(sp, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_store_ps(ps->m + g, mn);
        _mm256_store_ps(ps->l + g, _mm256_fmadd_ps(alpha, _mm256_load_ps(ps->l + g), sum));
        _mm256_store_ps(ps->alpha + g, alpha);
    }
}

/* O = diag(alpha) O + P V[j0 .. j0 + jn) over the pass's rows. A 6-row group
 * stops at the last key any of its rows sees (P is 0 past it), and a group
 * that sees none of the tile keeps O (alpha is 1 or O is 0). */
static void pv(pass *ps, int32_t j0, int32_t jn)
{
    const int32_t dh = ps->blk->head_dim;
    const float *v = ps->blk->v + (int64_t)j0 * dh;
    for (int32_t rg = 0; rg < ps->nr; rg += 6) {
        const int valid = ps->nr - rg < 6 ? ps->nr - rg : 6;
        const int32_t jv = keys_seen(ps, rg, rg + valid, j0, jn);
        if (jv <= 0)
            continue;
        const float *p = ps->st + rg;
        int32_t pp = ps->rp;
        float *o[6];
        __m256 alpha[6];
        for (int i = 0; i < 6; i++) { /* rows past the pass repeat its last one */
            const int32_t r = i < valid ? rg + i : ps->nr - 1;
            o[i] = ps->out + r * ps->blk->out_stride;
            alpha[i] = _mm256_broadcast_ss(ps->alpha + r);
        }
        if (valid < 6) {
            for (int32_t j = 0; j < jv; j++)
                for (int i = 0; i < 6; i++)
                    ps->ptail[j * 6 + i] = ps->st[j * ps->rp + (i < valid ? rg + i : ps->nr - 1)];
            p = ps->ptail;
            pp = 6;
        }
        int32_t d = 0;
        for (; d + 16 <= dh; d += 16) {
            float *od[6];
            for (int i = 0; i < 6; i++)
                od[i] = o[i] + d;
            pv_6x16(jv, p, pp, v + d, dh, od, alpha, valid);
        }
        for (; d < dh; d += 8) {
            float *od[6];
            for (int i = 0; i < 6; i++)
                od[i] = o[i] + d;
            const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(dh - d),
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            pv_6x8(jv, p, pp, v + d, dh, od, alpha, valid, mask);
        }
    }
}

static void attend_pass(const mha_attn_block *blk, int32_t r0, int32_t nr)
{
    pass ps_storage;
    pass *ps = &ps_storage;
    const int32_t dh = blk->head_dim;
    ps->blk = blk;
    ps->nr = nr;
    ps->rp = (nr + 15) / 16 * 16;
    ps->q = blk->q + r0 * blk->q_stride;
    ps->bias = blk->bias ? blk->bias + r0 * blk->bias_stride : NULL;
    ps->out = blk->out + r0 * blk->out_stride;

    int32_t jmax = 0;
    for (int32_t r = 0; r < ps->rp; r++) {
        ps->ke[r] = r < nr ? blk->kv_end[r0 + r] : 0;
        jmax = ps->ke[r] > jmax ? ps->ke[r] : jmax;
        ps->m[r] = -INFINITY;
        ps->l[r] = 0.0f;
    }
    for (int32_t r = 0; r < nr; r++)
        memset(ps->out + r * blk->out_stride, 0, (size_t)dh * sizeof(float));
    ps->dc = QT_FLOATS / ps->rp;
    if (dh <= ps->dc)
        pack_qt(ps, 0, dh);

    /* Keys past the block's last visible one are never read. */
    for (int32_t j0 = 0; j0 < jmax; j0 += BC) {
        const int32_t jn = jmax - j0 < BC ? jmax - j0 : BC;
        if (ps->bias && !tile_visible(ps, j0, jn))
            continue;
        if (j0 + jn < jmax)
            prefetch_tile(blk, j0 + jn, jmax - j0 - jn < BC ? jmax : j0 + jn + BC);
        scores(ps, j0, jn);
        if (ps->bias)
            add_bias(ps, j0, jn);
        softmax_tile(ps, j0, jn);
        pv(ps, j0, jn);
    }

    /* O /= l; rows that saw no key have l = 0 and O = 0 and stay zeros. */
    for (int32_t r = 0; r < nr; r++) {
        if (ps->l[r] == 0.0f)
            continue;
        float *o = ps->out + r * blk->out_stride;
        const __m256 l = _mm256_set1_ps(ps->l[r]);
        int32_t d = 0;
        for (; d + 8 <= dh; d += 8)
            _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), l));
        for (; d < dh; d++)
            o[d] /= ps->l[r];
    }
}

void mha_attn_block__avx2(const mha_attn_block *blk)
{
    const int32_t pr = pass_rows(blk);
    for (int32_t r0 = 0; r0 < blk->rows; r0 += pr)
        attend_pass(blk, r0, blk->rows - r0 < pr ? blk->rows - r0 : pr);
}
