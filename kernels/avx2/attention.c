/* AVX2+FMA fused attention: the register tiles of simd/flash_attention.h,
 * which holds the algorithm (passes of query rows, tiles of keys, the online
 * softmax, masking and normalisation) over the 8-lane layer of avx2/simd.h.
 *
 * Scores: a 6-key x 16-row tile (12 ymm accumulators) on packed scale*Q^T,
 * broadcasting K from memory: per d, 2 Q loads and 6 broadcasts for 12 FMAs.
 * P.V: a 6-row x 16-column tile (12 accumulators) broadcasting p from the
 * score tile and loading V rows: per key, 2 V loads and 6 broadcasts for 12
 * FMAs; head_dim tails take the layer's masked 6 x 8 tile. */
#include "avx2/simd.h"

enum { QK_KEYS = 6, QK_ROWS = 16, PV_ROWS = 6, PV_COLS = 16 };
enum { BC = 72 /* keys per tile */, RB = 96, RB_L2 = 48 };

/* st[i][0..16) (+)= sum_{d < dc} kp[i][d] qt[d][0..16) for 6 keys i; rp is the
 * row pitch of qt and st. accumulate resumes the FMA chains of the previous
 * head_dim chunk from st. Named accumulators (not an array) and noinline (its
 * own register allocation) keep all 12 accumulators and 6 pointers in registers. */
__attribute__((noinline))
static void qk_tile(int32_t dc, const float *const kp[6], const float *qt, int32_t rp, float *st,
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
static void pv_tile(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
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

#include "simd/flash_attention.h"

size_t mha_attn_scratch_bytes__avx2(void)
{
    return sizeof(pass);
}

void mha_attn_block__avx2(const mha_attn_block *blk)
{
    flash_attn_block(blk);
}
