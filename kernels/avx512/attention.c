/* AVX-512 fused attention: the register tiles of simd/flash_attention.h, which
 * holds the algorithm (passes of query rows, tiles of keys, the online softmax,
 * masking and normalisation) over the 16-lane layer of avx512/simd.h.
 *
 * Scores: an 8-key x 48-row tile (24 zmm accumulators) on packed scale*Q^T: per
 * d, 3 Q loads and 8 K broadcasts (embedded in the FMAs) for 24 FMAs; a 12-key x
 * 32-row tile for the rows past the pass's whole 48-row groups.
 * P.V: a 6-row x 64-column tile (24 accumulators): per key, 4 V loads and 6 p
 * broadcasts for 24 FMAs; head_dim tails take the layer's 6 x 16 opmask tile. With two
 * 512-bit FMA pipes of latency 4, 24 independent chains keep both busy. */
#include <string.h>

#include "avx512/simd.h"

enum { QK_KEYS = 8, QK_ROWS = 48, PV_ROWS = 6, PV_COLS = 64 };
enum { BC = 72 /* keys per tile (64 in a dot pass: whole 16-key steps) */, RB = 96, RB_L2 = 48 };

/* st[i][0..48) (+)= sum_{d < dc} kp[i][d] qt[d][0..48) for 8 keys i; rp is the
 * row pitch of qt and st (64-byte aligned). accumulate resumes the FMA chains
 * of the previous head_dim chunk from st. Named accumulators (an array makes
 * GCC stage them through the stack) and noinline keep all 24 in registers. */
#define QK_ROW(i, ci0, ci1, ci2)                                                  \
    do {                                                                          \
        const __m512 kb = _mm512_set1_ps(k##i[d]);                                \
        ci0 = _mm512_fmadd_ps(kb, q0, ci0);                                       \
        ci1 = _mm512_fmadd_ps(kb, q1, ci1);                                       \
        ci2 = _mm512_fmadd_ps(kb, q2, ci2);                                       \
    } while (0)
#define QK_LOAD(i, ci0, ci1, ci2)                                                 \
    (ci0 = _mm512_load_ps(st + (i) * rp), ci1 = _mm512_load_ps(st + (i) * rp + 16), \
     ci2 = _mm512_load_ps(st + (i) * rp + 32))
#define QK_STORE(i, ci0, ci1, ci2)                                                \
    (_mm512_store_ps(st + (i) * rp, ci0), _mm512_store_ps(st + (i) * rp + 16, ci1), \
     _mm512_store_ps(st + (i) * rp + 32, ci2))
/* The 24 accumulators c<key><vector> at zero, and OP(key, its 3 accumulators) for
   each of the 8 keys: the skeleton of both score tiles. */
#define QK_ACCUMULATORS                                                                   \
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00; \
    __m512 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;              \
    __m512 c40 = c00, c41 = c00, c42 = c00, c50 = c00, c51 = c00, c52 = c00;              \
    __m512 c60 = c00, c61 = c00, c62 = c00, c70 = c00, c71 = c00, c72 = c00
#define QK_EACH_KEY(OP)                                                                   \
    OP(0, c00, c01, c02);                                                                 \
    OP(1, c10, c11, c12);                                                                 \
    OP(2, c20, c21, c22);                                                                 \
    OP(3, c30, c31, c32);                                                                 \
    OP(4, c40, c41, c42);                                                                 \
    OP(5, c50, c51, c52);                                                                 \
    OP(6, c60, c61, c62);                                                                 \
    OP(7, c70, c71, c72)

__attribute__((noinline))
static void qk_tile(int32_t dc, const float *const kp[8], const float *qt, int32_t rp, float *st,
                    int accumulate)
{
    QK_ACCUMULATORS;
    if (accumulate) {
        QK_EACH_KEY(QK_LOAD);
    }
    const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3];
    const float *k4 = kp[4], *k5 = kp[5], *k6 = kp[6], *k7 = kp[7];
    for (int32_t d = 0; d < dc; d++) {
        const float *q = qt + (int64_t)d * rp;
        const __m512 q0 = _mm512_load_ps(q), q1 = _mm512_load_ps(q + 16);
        const __m512 q2 = _mm512_load_ps(q + 32);
        QK_EACH_KEY(QK_ROW);
    }
    QK_EACH_KEY(QK_STORE);
}

/* The narrow tile: st[i][0..32) (+)= sum_{d < dc} kp[i][d] qt[d][0..32) for 12 keys i,
 * for the rows of a pass past its whole 48-row groups (a 128-row head is 48 + 48 +
 * 32 rows, not 3 x 48): per d, 2 Q loads and 12 K broadcasts for 24 FMAs. */
#define QKN_ROW(i, ci0, ci1)                                                      \
    do {                                                                          \
        const __m512 kb = _mm512_set1_ps(k##i[d]);                                \
        ci0 = _mm512_fmadd_ps(kb, q0, ci0);                                       \
        ci1 = _mm512_fmadd_ps(kb, q1, ci1);                                       \
    } while (0)
#define QKN_LOAD(i, ci0, ci1) (ci0 = _mm512_load_ps(st + (i) * rp), ci1 = _mm512_load_ps(st + (i) * rp + 16))
#define QKN_STORE(i, ci0, ci1) (_mm512_store_ps(st + (i) * rp, ci0), _mm512_store_ps(st + (i) * rp + 16, ci1))
#define QKN_EACH_KEY(OP)                                                                  \
    OP(0, c00, c01);                                                                      \
    OP(1, c10, c11);                                                                      \
    OP(2, c20, c21);                                                                      \
    OP(3, c30, c31);                                                                      \
    OP(4, c40, c41);                                                                      \
    OP(5, c50, c51);                                                                      \
    OP(6, c60, c61);                                                                      \
    OP(7, c70, c71);                                                                      \
    OP(8, c80, c81);                                                                      \
    OP(9, c90, c91);                                                                      \
    OP(10, ca0, ca1);                                                                     \
    OP(11, cb0, cb1)

__attribute__((noinline))
static void qk_tile_narrow(int32_t dc, const float *const kp[12], const float *qt, int32_t rp,
                           float *st, int accumulate)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, ca0 = c00, ca1 = c00, cb0 = c00, cb1 = c00;
    if (accumulate) {
        QKN_EACH_KEY(QKN_LOAD);
    }
    const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3], *k4 = kp[4], *k5 = kp[5];
    const float *k6 = kp[6], *k7 = kp[7], *k8 = kp[8], *k9 = kp[9], *k10 = kp[10], *k11 = kp[11];
    for (int32_t d = 0; d < dc; d++) {
        const float *q = qt + (int64_t)d * rp;
        const __m512 q0 = _mm512_load_ps(q), q1 = _mm512_load_ps(q + 16);
        QKN_EACH_KEY(QKN_ROW);
    }
    QKN_EACH_KEY(QKN_STORE);
}
#define QK_NARROW_KEYS 12
#define QK_NARROW_ROWS 32

/* o[i][0..64) = alpha[i] o[i] + sum_{j < jn} p[j*pp + i] v[j][0..64) for 6 rows i,
 * storing the first `valid` rows; named accumulators as in qk_tile. */
#define PV_LOAD(i, ci0, ci1, ci2, ci3)                                              \
    (ci0 = _mm512_mul_ps(alpha[i], _mm512_loadu_ps(o[i])),                          \
     ci1 = _mm512_mul_ps(alpha[i], _mm512_loadu_ps(o[i] + 16)),                     \
     ci2 = _mm512_mul_ps(alpha[i], _mm512_loadu_ps(o[i] + 32)),                     \
     ci3 = _mm512_mul_ps(alpha[i], _mm512_loadu_ps(o[i] + 48)))
#define PV_ROW(i, ci0, ci1, ci2, ci3)                                               \
    do {                                                                            \
        const __m512 pb = _mm512_set1_ps(pj[i]);                                    \
        ci0 = _mm512_fmadd_ps(pb, v0, ci0);                                         \
        ci1 = _mm512_fmadd_ps(pb, v1, ci1);                                         \
        ci2 = _mm512_fmadd_ps(pb, v2, ci2);                                         \
        ci3 = _mm512_fmadd_ps(pb, v3, ci3);                                         \
    } while (0)
#define PV_STORE(i, ci0, ci1, ci2, ci3)                                             \
    if (i < valid)                                                                  \
    _mm512_storeu_ps(o[i], ci0), _mm512_storeu_ps(o[i] + 16, ci1),                  \
        _mm512_storeu_ps(o[i] + 32, ci2), _mm512_storeu_ps(o[i] + 48, ci3)

__attribute__((noinline))
static void pv_tile(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[6], const __m512 alpha[6], int valid)
{
    __m512 c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23;
    __m512 c30, c31, c32, c33, c40, c41, c42, c43, c50, c51, c52, c53;
    PV_LOAD(0, c00, c01, c02, c03), PV_LOAD(1, c10, c11, c12, c13);
    PV_LOAD(2, c20, c21, c22, c23), PV_LOAD(3, c30, c31, c32, c33);
    PV_LOAD(4, c40, c41, c42, c43), PV_LOAD(5, c50, c51, c52, c53);
    for (int32_t j = 0; j < jn; j++) {
        const float *pj = p + (int64_t)j * pp;
        const float *vj = v + j * ldv;
        const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
        const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
        PV_ROW(0, c00, c01, c02, c03);
        PV_ROW(1, c10, c11, c12, c13);
        PV_ROW(2, c20, c21, c22, c23);
        PV_ROW(3, c30, c31, c32, c33);
        PV_ROW(4, c40, c41, c42, c43);
        PV_ROW(5, c50, c51, c52, c53);
    }
    PV_STORE(0, c00, c01, c02, c03);
    PV_STORE(1, c10, c11, c12, c13);
    PV_STORE(2, c20, c21, c22, c23);
    PV_STORE(3, c30, c31, c32, c33);
    PV_STORE(4, c40, c41, c42, c43);
    PV_STORE(5, c50, c51, c52, c53);
}

/* AVX512-BF16, where the CPU has it: vdpbf16ps adds two bf16 products to each f32
 * lane (the odd one, then the even one, each rounded once; products are exact, so
 * each step is an FMA's, subnormal inputs and results read as zeros), twice the MACs
 * of an FMA per instruction. The same 8-key x 48-row tile on q's bf16 pairs, K's pairs
 * broadcast from its rows in place, scale applied once to each score. */
#define QK_BF16DP 1
#define QK_BF16DP_AVAILABLE() mha_cpu_avx512_bf16()
#define QKB_ROW(i, ci0, ci1, ci2)                                                 \
    do {                                                                          \
        uint32_t kw;                                                              \
        memcpy(&kw, k##i + 4 * p, sizeof kw);                                     \
        const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)kw);                 \
        ci0 = _mm512_dpbf16_ps(ci0, q0, kb);                                      \
        ci1 = _mm512_dpbf16_ps(ci1, q1, kb);                                      \
        ci2 = _mm512_dpbf16_ps(ci2, q2, kb);                                      \
    } while (0)
#define QKB_STORE(i, ci0, ci1, ci2)                                                \
    (_mm512_store_ps(st + (i) * rp, _mm512_mul_ps(sc, ci0)),                       \
     _mm512_store_ps(st + (i) * rp + 16, _mm512_mul_ps(sc, ci1)),                  \
     _mm512_store_ps(st + (i) * rp + 32, _mm512_mul_ps(sc, ci2)))

__attribute__((noinline, target("avx512bf16")))
static void qk_tile_bf16dp(int32_t dp, const float *const kp[8], const uint32_t *qt2, int32_t rp,
                           float *st, float scale)
{
    QK_ACCUMULATORS;
    /* kp point at bf16 rows: read as bytes, a pair (4 bytes) at a time */
    const char *k0 = (const char *)kp[0], *k1 = (const char *)kp[1], *k2 = (const char *)kp[2];
    const char *k3 = (const char *)kp[3], *k4 = (const char *)kp[4], *k5 = (const char *)kp[5];
    const char *k6 = (const char *)kp[6], *k7 = (const char *)kp[7];
    for (int32_t p = 0; p < dp; p++) {
        const uint32_t *q = qt2 + (int64_t)p * rp;
        const __m512bh q0 = (__m512bh)_mm512_load_si512(q), q1 = (__m512bh)_mm512_load_si512(q + 16);
        const __m512bh q2 = (__m512bh)_mm512_load_si512(q + 32);
        QK_EACH_KEY(QKB_ROW);
    }
    const __m512 sc = _mm512_set1_ps(scale);
    QK_EACH_KEY(QKB_STORE);
}

/* AMX-BF16, where the CPU and the OS allow it: TDPBF16PS adds to a 16 x 16 f32 tile the
 * products of a 16 x 32 bf16 tile by a 32 x 16 one, taken in pairs: the exact products
 * of vdpbf16ps summed in f32 (in the tile unit's order, subnormal inputs read as zero),
 * 16 times the MACs of an FMA per instruction. S^T = K Q^T for 16 keys x 48 rows: A is
 * 32 values of the 16 K rows in place (ldk bytes apart), B q's pairs as packed for
 * qk_tile_bf16dp (pairs of a row 4 rp bytes apart), C three 16 x 16 tiles stored into
 * st key by key, then scaled. Tiles 0-2: C; 3: A; 4-6: B; all 8 tiles 16 rows of 64
 * bytes, configured once per pass (qk_amx_begin) and released after it (qk_amx_end). */
#define QK_AMX 1
#define QK_AMX_AVAILABLE() mha_cpu_amx_bf16()
enum { QK_AMX_KEYS = 16, QK_AMX_D = 32 /* values per A row */ };

typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Static: _tile_loadconfig tells the compiler it reads 8 bytes, not the 64 that
   ldtilecfg does, so stores into a local config could be dropped. */
static const amx_config qk_amx_config = {.palette = 1,
                                         .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                         .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile"))) static void qk_amx_begin(void)
{
    _tile_loadconfig(&qk_amx_config);
}

__attribute__((target("amx-tile"))) static void qk_amx_end(void)
{
    _tile_release();
}

__attribute__((noinline, target("amx-tile,amx-bf16")))
static void qk_tile_amx(int32_t dk, const char *k, int64_t ldk, const uint32_t *qt2, int32_t rp,
                        float *st, float scale)
{
    const int64_t ldq = (int64_t)rp * (int64_t)sizeof(float);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (int32_t d = 0; d < dk; d += QK_AMX_D) {
        const uint32_t *q = qt2 + (int64_t)d / 2 * rp;
        _tile_loadd(3, k + 2 * d, ldk);
        _tile_loadd(4, q, ldq);
        _tile_loadd(5, q + 16, ldq);
        _tile_loadd(6, q + 32, ldq);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(2, 3, 6);
    }
    _tile_stored(0, st, ldq);
    _tile_stored(1, st + 16, ldq);
    _tile_stored(2, st + 32, ldq);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < QK_AMX_KEYS; i++)
        for (int c = 0; c < QK_ROWS; c += 16)
            _mm512_store_ps(st + i * rp + c, _mm512_mul_ps(sc, _mm512_load_ps(st + i * rp + c)));
}

enum { P_PIECES = 2 }; /* bf16 pieces of P (amx_split_p) */

/* P.V on the same tiles, O[16 n rows][dv] += P V over kn keys (a multiple of 32), n 1
 * or 2: C 16 x 16 blocks of O in place, two columns blocks of each 16 rows (tiles 0, 1
 * and 2, 3: four chains of tile products when n = 2, to cover their latency), A 32 keys
 * of P for 16 rows as P_PIECES bf16 pieces (amx_split_p), one piece at a time (tiles 4,
 * 5), B the pairs of V's rows for the two column blocks (tiles 6, 7). pa: the pieces,
 * [P_PIECES][16 n][kn]; vb: V's rows paired, vb[kp][d] = (V[2 kp][d], V[2 kp + 1][d]);
 * o: the rows' O, dv apart. */
__attribute__((noinline, target("amx-tile,amx-bf16")))
static void pv_tile_amx(int32_t kn, const uint16_t *pa, const uint32_t *vb, int32_t dv, float *o,
                        int n)
{
    const int64_t ldo = (int64_t)dv * (int64_t)sizeof(float), lda = (int64_t)kn * 2;
    const int64_t piece = 16 * (int64_t)n * kn, half = 16 * (int64_t)kn;
    float *o1 = o + 16 * (int64_t)dv;
    for (int32_t d = 0; d < dv; d += 32) {
        _tile_loadd(0, o + d, ldo);
        _tile_loadd(1, o + d + 16, ldo);
        if (n == 2) {
            _tile_loadd(2, o1 + d, ldo);
            _tile_loadd(3, o1 + d + 16, ldo);
        }
        for (int32_t k = 0; k < kn; k += QK_AMX_D) {
            const uint32_t *v = vb + (int64_t)k / 2 * dv + d;
            _tile_loadd(6, v, ldo);
            _tile_loadd(7, v + 16, ldo);
            for (int i = 0; i < P_PIECES; i++) {
                _tile_loadd(4, pa + i * piece + k, lda);
                if (n == 2)
                    _tile_loadd(5, pa + i * piece + half + k, lda);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (n == 2) {
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
        }
        _tile_stored(0, o + d, ldo);
        _tile_stored(1, o + d + 16, ldo);
        if (n == 2) {
            _tile_stored(2, o1 + d, ldo);
            _tile_stored(3, o1 + d + 16, ldo);
        }
    }
}

/* vb[kp][d] = (V[2 kp][d], V[2 kp + 1][d]) for kp < kn / 2 and d < dv (a multiple of 32),
 * V's bf16 rows vr[j] for j < jn, zeros past them. */
static void amx_pair_v(const char *const *vr, int32_t jn, int32_t kn, int32_t dv, uint32_t *vb)
{
    /* lane 2i of the low (high) half: x[i] (x[16 + i]), lane 2i + 1: y[i] (y[16 + i]);
       y's values are 32 on in vpermt2w's index */
    static const uint16_t pair_lo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                         37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                         11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t pair_hi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                         53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                         27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i lo = _mm512_loadu_si512(pair_lo), hi = _mm512_loadu_si512(pair_hi);
    for (int32_t kp = 0; kp < kn / 2; kp++) {
        const char *x = 2 * kp < jn ? vr[2 * kp] : NULL;
        const char *y = 2 * kp + 1 < jn ? vr[2 * kp + 1] : NULL;
        uint32_t *row = vb + (int64_t)kp * dv;
        for (int32_t d = 0; d < dv; d += 32) {
            const __m512i a = x ? _mm512_loadu_si512(x + 2 * d) : _mm512_setzero_si512();
            const __m512i b = y ? _mm512_loadu_si512(y + 2 * d) : _mm512_setzero_si512();
            _mm512_storeu_si512(row + d, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(row + d + 16, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* pa[i][r][k] for rows r < 16 n (st's lanes from st, rp floats per key) and keys k < kn:
 * P as two bf16 pieces, hi = P rounded to bf16 and lo = P - hi (exact in f32) rounded:
 * |P - hi| <= 2^-8 P and lo is within half its unit, so |hi + lo - P| <= 2^-17 P, and
 * the P.V of a row errs by at most 2^-17 max |V| (7.6e-6 for |V| <= 1), within the f32
 * tolerance; an AMX pass's out is bf16, whose half unit is up to 2^-8 of it. A third
 * piece would make the sum exact at 1.1-1.2x the time.
 * Zeros for keys past jn; pieces below 2^-126 are read as zero by the tiles. */
_Static_assert(P_PIECES == 2, "amx_split_p writes hi and lo");
__attribute__((target("avx512bf16")))
static void amx_split_p(const float *st, int32_t rp, int32_t jn, int32_t kn, uint16_t *pa, int n)
{
    for (int b = 0; b < n; b++)
        for (int32_t k0 = 0; k0 < kn; k0 += 32) {
            __m512 t[2][16];
            for (int h = 0; h < 2; h++) {
                for (int i = 0; i < 16; i++) {
                    const int32_t k = k0 + 16 * h + i;
                    t[h][i] = k < jn ? _mm512_load_ps(st + (int64_t)k * rp + 16 * b)
                                     : _mm512_setzero_ps();
                }
                vf_transpose(t[h]);
            }
            for (int r = 0; r < 16; r++) {
                const __m512 x = t[0][r], y = t[1][r];
                const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(y, x);
                const __m512 xh = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
                const __m512 yh = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
                uint16_t *row = pa + ((int64_t)b * 16 + r) * kn + k0;
                _mm512_storeu_si512(row, hi);
                _mm512_storeu_si512(row + (int64_t)n * 16 * kn,
                                    (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(y, yh),
                                                                 _mm512_sub_ps(x, xh)));
            }
        }
}

/* The packing of q into bf16 pairs for qk_tile_bf16dp (simd/flash_attention.h). */
static inline void qk_store_bf16_pairs(uint32_t *dst, __m512 even, __m512 odd)
{
    const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(even), 16);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(odd), _mm512_set1_epi32((int)0xffff0000u));
    _mm512_store_si512(dst, _mm512_or_si512(lo, hi));
}

#include "simd/flash_attention.h"

size_t mha_attn_scratch_bytes__avx512(void)
{
    return sizeof(pass);
}

void mha_attn_block__avx512(const mha_attn_block *blk)
{
    flash_attn_block(blk);
}
