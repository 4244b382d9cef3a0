/* NEON fused attention: the register tiles of simd/flash_attention.h, which
 * holds the algorithm (passes of query rows, tiles of keys, the online
 * softmax, masking and normalisation) over the 4-lane layer of neon/simd.h.
 *
 * Scores: a 6-key x 16-row tile (24 q-register accumulators) on packed
 * scale*Q^T: per d, 4 Q loads and 6 K values broadcast by lane for 24 FMAs.
 * P.V: a 6-row x 16-column tile (24 accumulators): per key, 4 V loads and 6 p
 * values broadcast for 24 FMAs; head_dim tails take the layer's masked 6 x 4
 * tile. The arrays of vectors live in registers: every loop over them is
 * unrolled, and noinline gives each tile a register allocation of its own. */
#include "neon/simd.h"

enum { QK_KEYS = 6, QK_ROWS = 16, PV_ROWS = 6, PV_COLS = 16 };
enum { BC = 72 /* keys per tile */, RB = 96, RB_L2 = 48 };

#define UNROLL _Pragma("GCC unroll 24")

/* st[i][0..16) (+)= sum_{d < dc} kp[i][d] qt[d][0..16) for 6 keys i; rp is the
 * row pitch of qt and st. accumulate resumes the FMA chains of the previous
 * head_dim chunk from st. */
__attribute__((noinline))
static void qk_tile(int32_t dc, const float *const kp[6], const float *qt, int32_t rp, float *st,
                    int accumulate)
{
    float32x4_t c[QK_KEYS][4];
    UNROLL
    for (int i = 0; i < QK_KEYS; i++)
        UNROLL
        for (int v = 0; v < 4; v++)
            c[i][v] = accumulate ? vld1q_f32(st + i * rp + 4 * v) : vdupq_n_f32(0.0f);
    for (int32_t d = 0; d < dc; d++) {
        const float *q = qt + (int64_t)d * rp;
        const float32x4_t q0 = vld1q_f32(q), q1 = vld1q_f32(q + 4);
        const float32x4_t q2 = vld1q_f32(q + 8), q3 = vld1q_f32(q + 12);
        UNROLL
        for (int i = 0; i < QK_KEYS; i++) {
            const float k = kp[i][d];
            c[i][0] = vfmaq_n_f32(c[i][0], q0, k);
            c[i][1] = vfmaq_n_f32(c[i][1], q1, k);
            c[i][2] = vfmaq_n_f32(c[i][2], q2, k);
            c[i][3] = vfmaq_n_f32(c[i][3], q3, k);
        }
    }
    UNROLL
    for (int i = 0; i < QK_KEYS; i++)
        UNROLL
        for (int v = 0; v < 4; v++)
            vst1q_f32(st + i * rp + 4 * v, c[i][v]);
}

/* o[i][0..16) = alpha[i] o[i] + sum_{j < jn} p[j*pp + i] v[j][0..16) for 6 rows i,
 * storing the first `valid` rows. */
__attribute__((noinline))
static void pv_tile(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[6], const float32x4_t alpha[6], int valid)
{
    float32x4_t c[PV_ROWS][4];
    UNROLL
    for (int i = 0; i < PV_ROWS; i++)
        UNROLL
        for (int x = 0; x < 4; x++)
            c[i][x] = vmulq_f32(alpha[i], vld1q_f32(o[i] + 4 * x));
    for (int32_t j = 0; j < jn; j++) {
        const float *pj = p + (int64_t)j * pp;
        const float *vj = v + j * ldv;
        const float32x4_t v0 = vld1q_f32(vj), v1 = vld1q_f32(vj + 4);
        const float32x4_t v2 = vld1q_f32(vj + 8), v3 = vld1q_f32(vj + 12);
        UNROLL
        for (int i = 0; i < PV_ROWS; i++) {
            const float w = pj[i];
            c[i][0] = vfmaq_n_f32(c[i][0], v0, w);
            c[i][1] = vfmaq_n_f32(c[i][1], v1, w);
            c[i][2] = vfmaq_n_f32(c[i][2], v2, w);
            c[i][3] = vfmaq_n_f32(c[i][3], v3, w);
        }
    }
    UNROLL
    for (int i = 0; i < PV_ROWS; i++)
        if (i < valid)
            UNROLL
            for (int x = 0; x < 4; x++)
                vst1q_f32(o[i] + 4 * x, c[i][x]);
}

#include "simd/flash_attention.h"

size_t mha_attn_scratch_bytes__neon(void)
{
    return sizeof(pass);
}

void mha_attn_block__neon(const mha_attn_block *blk)
{
    flash_attn_block(blk);
}
