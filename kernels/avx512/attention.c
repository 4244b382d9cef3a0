/* AVX-512 fused attention: the register tiles of simd/flash_attention.h, which
 * holds the algorithm (passes of query rows, tiles of keys, the online softmax,
 * masking and normalisation) over the 16-lane layer of avx512/simd.h.
 *
 * Scores: an 8-key x 48-row tile (24 zmm accumulators) on packed scale*Q^T: per
 * d, 3 Q loads and 8 K broadcasts (embedded in the FMAs) for 24 FMAs.
 * P.V: a 6-row x 64-column tile (24 accumulators): per key, 4 V loads and 6 p
 * broadcasts for 24 FMAs; a 6 x 16 opmask tile takes head_dim tails. With two
 * 512-bit FMA pipes of latency 4, 24 independent chains keep both busy. */
#include "avx512/simd.h"

enum { QK_KEYS = 8, QK_ROWS = 48, PV_ROWS = 6, PV_COLS = 64, PV_TAIL_COLS = 16 };
enum { BC = 72 /* keys per tile */, RB = 96, RB_L2 = 48 };

/* st[i][0..48) (+)= sum_{d < dc} kp[i][d] qt[d][0..48) for 8 keys i; rp is the
 * row pitch of qt and st (64-byte aligned). accumulate resumes the FMA chains
 * of the previous head_dim chunk from st. */
__attribute__((noinline))
static void qk_tile(int32_t dc, const float *const kp[8], const float *qt, int32_t rp, float *st,
                    int accumulate)
{
    __m512 c[8][3];
    for (int i = 0; i < 8; i++)
        for (int v = 0; v < 3; v++)
            c[i][v] = accumulate ? _mm512_load_ps(st + i * rp + 16 * v) : _mm512_setzero_ps();
    const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3];
    const float *k4 = kp[4], *k5 = kp[5], *k6 = kp[6], *k7 = kp[7];
    for (int32_t d = 0; d < dc; d++) {
        const float *q = qt + (int64_t)d * rp;
        const __m512 q0 = _mm512_load_ps(q), q1 = _mm512_load_ps(q + 16);
        const __m512 q2 = _mm512_load_ps(q + 32);
        const float kd[8] = {k0[d], k1[d], k2[d], k3[d], k4[d], k5[d], k6[d], k7[d]};
        for (int i = 0; i < 8; i++) {
            const __m512 kb = _mm512_set1_ps(kd[i]);
            c[i][0] = _mm512_fmadd_ps(kb, q0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(kb, q1, c[i][1]);
            c[i][2] = _mm512_fmadd_ps(kb, q2, c[i][2]);
        }
    }
    for (int i = 0; i < 8; i++)
        for (int v = 0; v < 3; v++)
            _mm512_store_ps(st + i * rp + 16 * v, c[i][v]);
}

/* o[i][0..64) = alpha[i] o[i] + sum_{j < jn} p[j*pp + i] v[j][0..64) for 6 rows i,
 * storing the first `valid` rows. */
__attribute__((noinline))
static void pv_tile(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[6], const __m512 alpha[6], int valid)
{
    __m512 c[6][4];
    for (int i = 0; i < 6; i++)
        for (int u = 0; u < 4; u++)
            c[i][u] = _mm512_mul_ps(alpha[i], _mm512_loadu_ps(o[i] + 16 * u));
    for (int32_t j = 0; j < jn; j++) {
        const float *pj = p + (int64_t)j * pp;
        const float *vj = v + j * ldv;
        const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
        const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
        for (int i = 0; i < 6; i++) {
            const __m512 pb = _mm512_set1_ps(pj[i]);
            c[i][0] = _mm512_fmadd_ps(pb, v0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(pb, v1, c[i][1]);
            c[i][2] = _mm512_fmadd_ps(pb, v2, c[i][2]);
            c[i][3] = _mm512_fmadd_ps(pb, v3, c[i][3]);
        }
    }
    for (int i = 0; i < valid; i++)
        for (int u = 0; u < 4; u++)
            _mm512_storeu_ps(o[i] + 16 * u, c[i][u]);
}

/* The same for the first `cols` (1..16) of 16 columns (head_dim tails). */
static void pv_tail(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[6], const __m512 alpha[6], int valid, int32_t cols)
{
    const __mmask16 mask = vm_first(cols);
    __m512 c[6];
    for (int i = 0; i < 6; i++)
        c[i] = _mm512_mul_ps(alpha[i], _mm512_maskz_loadu_ps(mask, o[i]));
    for (int32_t j = 0; j < jn; j++) {
        const __m512 v0 = _mm512_maskz_loadu_ps(mask, v + j * ldv);
        for (int i = 0; i < 6; i++)
            c[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[(int64_t)j * pp + i]), v0, c[i]);
    }
    for (int i = 0; i < valid; i++)
        _mm512_mask_storeu_ps(o[i], mask, c[i]);
}

#include "simd/flash_attention.h"

void mha_attn_block__avx512(const mha_attn_block *blk)
{
    flash_attn_block(blk);
}

void mha_exp_array__avx512(const float *x, float *y, int64_t n)
{
    simd_exp_array(x, y, n);
}
