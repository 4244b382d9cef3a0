/* The fused attention block (flash-attention style) written once over a thin
 * SIMD layer, for every ISA whose vectors run across query rows. An ISA's
 * attention.c includes its simd.h (the vf/vi/vm types and operations), defines
 * its register tiles and their sizes, then includes this file and wraps
 * flash_attn_block() and sizeof(pass), the block's scratch, under its own names:
 *
 *   QK_KEYS x QK_ROWS   score tile: st[j][r] (+)= sum_d K[j][d] qt[d][r] over a
 *                       dk chunk, QK_ROWS a multiple of VF_LANES
 *       qk_tile(dc, kp[QK_KEYS], qt, rp, st, accumulate)
 *   QK_NARROW_KEYS x QK_NARROW_ROWS
 *                       optional (QK_NARROW_ROWS defined): the same over fewer rows,
 *                       a multiple of VF_LANES, with BC % QK_NARROW_KEYS == 0, for the
 *                       rows past a pass's whole QK_ROWS groups
 *       qk_tile_narrow(dc, kp[QK_NARROW_KEYS], qt, rp, st, accumulate)
 *   PV_ROWS x PV_COLS   o[i] = alpha[i] o[i] + sum_j p[j*pp + i] v[j] for PV_ROWS
 *                       rows, storing the first `valid` (the last dv % PV_COLS
 *                       columns go through pv_tail below, VF_LANES at a time)
 *       pv_tile(jn, p, pp, v, ldv, o[PV_ROWS], alpha[PV_ROWS], valid)
 *   BC                  keys per tile, a multiple of QK_KEYS
 * and, optionally (QK_BF16DP defined, QK_BF16DP_AVAILABLE() true on this CPU), the
 * score tile of passes of many rows whose q and K values are all bfloat16:
 *       qk_tile_bf16dp(dk / 2, kp[QK_KEYS], qt2, rp, st, scale), kp the bf16 rows
 *                       st[j][r] = scale * sum_p (q[r][2p] K[j][2p] + q[r][2p+1] K[j][2p+1]),
 *                       K's bf16 rows in place; a bf16 product is exact in f32, so
 *                       each term is one rounded addition, as an FMA's
 *       qk_store_bf16_pairs(dst, even, odd)
 *                       dst[i] (64-byte aligned, VF_LANES of them) = the bf16 pair of
 *                       lane i: even's value in the low half, odd's in the high one
 *                       (both vectors hold bfloat16 values: their upper halves, exactly)
 * and, optionally (QK_AMX defined, QK_AMX_AVAILABLE() true), the same scores QK_AMX_KEYS
 * keys at a time by a tile unit, for those passes when dk % QK_AMX_D == 0:
 *       qk_amx_begin(), qk_amx_end()    before and after such a pass
 *       qk_tile_amx(dk, k, ldk, qt2, rp, st, scale)
 *                       the QK_AMX_KEYS x QK_ROWS tile of qk_tile_bf16dp, K's rows
 *                       ldk bytes apart from k
 *       amx_pair_v, amx_split_p, pv_tile_amx
 *                       the P.V of 16 or 32 rows of such a pass (see pv_amx)
 *   RB, RB_L2           rows per pass when K and V stream from memory, and when
 *                       they sit in L2 (multiples of QK_ROWS)
 *
 * Layout. Q is packed once per pass transposed and scaled, qt[d][r] (rows padded
 * with zeros to whole score groups: wide ones of QK_ROWS, then narrow ones where
 * they pad fewer rows), so the score tile is computed
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
 * 2^0 = 1 exactly), so skipping it for the whole block changes nothing. */
#ifndef MHA_SIMD_FLASH_ATTENTION_H
#define MHA_SIMD_FLASH_ATTENTION_H

#include <math.h>
#include <string.h>

/* log2(e), rounded: the kernels hold scores in base 2 (exp(s) = 2^(log2(e) s)). */
#define SCORE_LOG2E 0x1.715476p+0f
/* ln(2) in double, for lse and sinks, back in base e. */
#define SCORE_LN2 0x1.62e42fefa39efp-1

#include "internal.h"
#include "simd/convert.h"
#include "simd/math.h"

/* Loops over a register tile's vectors are unrolled whole, so that its arrays live in
 * registers. Builds under AddressSanitizer, which instruments every access, keep
 * the loops: the same arithmetic in the same order, in far less code to compile. */
#if defined(__SANITIZE_ADDRESS__)
#define SIMD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMD_ASAN 1
#endif
#endif
#define SIMD_PRAGMA_(x) _Pragma(#x)
#ifdef SIMD_ASAN
#define SIMD_UNROLL(n) SIMD_PRAGMA_(GCC unroll 1)
#else
#define SIMD_UNROLL(n) SIMD_PRAGMA_(GCC unroll n)
#endif
/* The tiles written over (rows, type, ...) inline into one function per instance set;
 * under AddressSanitizer, which keeps every inlined array in its own stack slot, they
 * stay calls instead: one frame holding all of them (77 KiB on AVX-512) would overflow a
 * 64 KiB worker stack. */
#ifdef SIMD_ASAN
#define SIMD_INSTANCE __attribute__((noinline))
#else
#define SIMD_INSTANCE inline __attribute__((always_inline))
#endif

#ifndef QK_NARROW_ROWS /* no narrow score tile: every group is a wide one */
#define QK_NARROW_ROWS QK_ROWS
#define QK_NARROW_KEYS QK_KEYS
#define qk_tile_narrow qk_tile
#endif

#ifdef QK_AMX
/* Keys per tile of a tile-unit pass: whole 16-key score blocks and 32-key P.V chunks. */
enum { AMX_BC = 64 };
_Static_assert((int)AMX_BC <= (int)BC && AMX_BC % QK_AMX_KEYS == 0 && AMX_BC % QK_AMX_D == 0,
               "a tile-unit pass's tiles fit the pass's buffers");
#else
enum { QK_AMX_KEYS = 0, AMX_BC = BC };
#endif

enum {
    QT_FLOATS = 128 * RB,     /* packed Q^T: dk chunks of QT_FLOATS / padded rows */
    KV_L2_BYTES = 512 * 1024, /* K and V of a head fitting in half of a 1 MiB L2 */
    DOT_ROWS = QK_ROWS / 2,   /* passes of at most this many rows score by dot products */
    STAGE_D = 128,            /* values per row of a staged (converted) K or V tile */
    OST_D = 128,              /* the largest dv whose O accumulates in the pass's scratch */
    PAIR = 2 * VF_LANES,      /* values of a bf16 pair load (vf_load_bf16_pair) */
};
_Static_assert(BC % QK_KEYS == 0 && RB % QK_ROWS == 0 && RB_L2 % QK_ROWS == 0
                   && QK_ROWS % VF_LANES == 0 && RB % VF_LANES == 0 && BC % QK_NARROW_KEYS == 0
                   && QK_NARROW_ROWS % VF_LANES == 0 && QK_NARROW_ROWS <= QK_ROWS,
               "tile sizes of the ISA's attention");

/* Passes of many rows read f32 K rows in place, and f32 V rows of a tile at one
 * stride; others (16-bit, q8_0, a paged tile across blocks) they stage, converted or
 * gathered, into kst and vst. */
static int kv_staged(const mha_attn_block *blk)
{
    return blk->kv_type != MHA_F32 || blk->k.table;
}

/* Rows per pass: RB_L2 keep a pass's tiles in L1 when K and V come from L2;
 * when they stream from further away, RB rows cut that traffic (if dk
 * still fits one chunk of the packed Q), and when each pass converts or gathers
 * its tiles (16-bit, q8_0 or paged K and V) RB rows convert them half as often
 * (Zen 5, dh 64: f16 S=2048 3-4% faster, bf16 and S=128 1-1.5%). Results do not
 * depend on this choice. */
static int32_t pass_rows(const mha_attn_block *blk)
{
    const int64_t kv = (int64_t)blk->seq_kv
                       * (mha_row_bytes(blk->kv_type, blk->dk) + mha_row_bytes(blk->kv_type, blk->dv));
    return (kv > KV_L2_BYTES || kv_staged(blk)) && blk->dk <= QT_FLOATS / RB ? RB : RB_L2;
}

typedef struct span {
    int32_t begin, end;
} span;

_Static_assert(PV_ROWS >= 4, "P.V row groups of the pass's spans");

/* A score group: rows [r0, r0 + rows) of qt and st, scored by the wide tile (rows
 * QK_ROWS) or the narrow one, and the keys its rows see. */
typedef struct qk_group {
    int32_t r0, rows;
    span keys;
} qk_group;

/* The state of one pass over up to RB query rows: the block's scratch. */
typedef struct pass {
    const mha_attn_block *blk;
    int32_t nr, rp;  /* rows, and rows padded to whole score groups (the pitch of qt, st);
                        for dot products to a power of two below VF_LANES, else a multiple of it */
    int32_t kpv;     /* keys per vector of st: VF_LANES / rp when rp < VF_LANES, else 1 */
    int32_t dc;      /* dk chunk of the packed Q^T: QT_FLOATS / rp, a multiple of 32 */
    int dot;         /* scores by dot products along dk; qt holds qscale * q row by row */
    float qscale;    /* scale log2(e): scores in base 2, for exp2 (see softmax_tile) */
    int paired;      /* a dot pass over bf16 K and V, which it loads PAIR values at a time
                        (vf_load_bf16_pair): each whole PAIR chunk of a row of qt and of O
                        holds its even values, then its odd ones (see paired_order) */
    int bias_shared; /* every row reads the same bias row */
    int32_t ke_min;  /* the smallest kv_end of the pass's rows */
    int32_t kb_max;  /* the largest kv_begin of the pass's rows */
    int32_t jmax;    /* the end of the keys the pass reads */
    span all, pv[RB / 4]; /* keys seen by the pass, and by its P.V groups */
    qk_group qk[RB / VF_LANES]; /* the score groups, nqk of them */
    int32_t nqk;
    int stream;      /* prefetch K and V (prefetch_row) when the call's exceed L2: a dot
                        pass, whose chunk may be small, whatever its own keys; a pass of
                        many rows when its own exceed L2 too */
    int kdirect;     /* K is f32: the score tiles read its rows in place (kr); else they
                        are staged (converted) into kst */
    int vdirect;     /* the tile's V rows are f32 at one stride: the P.V reads them in
                        place; else they are staged (converted, gathered) into vst */
    int64_t ldv;     /* V's row pitch in floats, when vdirect */
    int32_t kbytes, vbytes; /* bytes of a K row and of a V row */
    int32_t far_kbytes; /* bytes of each K row a dot pass asks for far ahead (0: none;
                           1: the first line; see dot_step) */
    int bias_hides;  /* the bias of the current tile holds -INFINITY */
    const float *q[RB], *bias[RB]; /* the pass's rows (bias NULL without one) */
    float *out[RB];  /* O of the pass's rows: in ost when dv <= OST_D, else in place */
    float *dst[RB];  /* the rows of out, written once, at the end */
    /* Per row, lane for lane with st: when rp < VF_LANES, lane i holds row i % rp. */
    _Alignas(64) int32_t kb[RB], ke[RB]; /* kv_begin, kv_end; 0 for padding rows */
    _Alignas(64) int32_t kbl[RB], kel[RB]; /* the same less lane_key: a lane's key j sees
                                              kbl <= j - j0' < kel, j0' the vector's first */
    _Alignas(64) float slope[RB], pos[RB]; /* ALiBi: slope and position, as floats */
    _Alignas(64) float m[RB], l[RB], alpha[RB];
    _Alignas(64) int32_t lane_key[VF_LANES]; /* key of lane i within a vector of st: i / rp */
    _Alignas(64) float lane_keyf[VF_LANES];
    union { /* packed Q^T: qscale * q as floats, qt[d][r]; or, for bf16dp, q's bf16 pairs
               qt2[d / 2][r] (value 2i in the low half, 2i + 1 in the high one) */
        _Alignas(64) float qt[QT_FLOATS];
        uint32_t qt2[QT_FLOATS];
    };
    int bf16dp;      /* a pass of many rows over bf16 q and K: scores by bf16 dot products
                        (the ISA's qk_tile_bf16dp), from the K rows in place */
    int amx;         /* a bf16dp pass whose dk is a multiple of QK_AMX_D: 16-key blocks of
                        scores by the ISA's tile unit (qk_tile_amx) */
    int amx_pv;      /* an amx pass whose O rows are in ost and dv % 32 == 0: P.V by the
                        tile unit too (pv_amx), but in careful tiles */
    int32_t bc;      /* keys per tile: BC, AMX_BC in amx passes, whole dot steps of
                        DOT_SCORES keys in dot passes */
    _Alignas(64) float st[BC * RB];
    const char *kr[BC], *vr[BC]; /* the rows of the tile's keys */
    const char *nkr[BC], *nvr[BC]; /* the rows of the next tile's keys, */
    int32_t nn;                    /* nn of them (0 when not streaming) */
    int32_t tn;                    /* the tile's keys */
    _Alignas(64) float kst[BC * STAGE_D], vst[BC * STAGE_D]; /* staged K and V columns */
    float ptail[BC * PV_ROWS]; /* P of a last group of fewer than PV_ROWS rows, padded */
    _Alignas(64) float ost[RB * OST_D]; /* O at pitch dv: its rows stay in L1 across the
                                           tiles whatever out's stride ([B][S][H][d] rows
                                           H*d floats apart share a few of L1's sets) */
} pass;

/* qt[d][r] = qscale * q[r][d0 + d] for d < dc, zero for padding rows: with the
 * scale folded into Q, the scores need no multiply. VF_LANES x VF_LANES blocks
 * are transposed in registers. */
static void pack_qt(pass *ps, int32_t d0, int32_t dc)
{
    const vf scale = vf_set1(ps->qscale);
    for (int32_t r0 = 0; r0 < ps->rp; r0 += VF_LANES)
        for (int32_t d = 0; d < dc; d += VF_LANES) {
            const int32_t n = dc - d < VF_LANES ? dc - d : VF_LANES;
            vf a[VF_LANES];
            if (n == VF_LANES && r0 + VF_LANES <= ps->nr) { /* a whole block, in registers */
SIMD_UNROLL(16)
                for (int32_t i = 0; i < VF_LANES; i++)
                    a[i] = vf_mul(scale, vf_loadu(ps->q[r0 + i] + d0 + d));
            } else
                for (int32_t i = 0; i < VF_LANES; i++) {
                    const float *qr = ps->q[r0 + i < ps->nr ? r0 + i : 0] + d0 + d;
                    a[i] = r0 + i >= ps->nr ? vf_zero()
                           : n == VF_LANES  ? vf_mul(scale, vf_loadu(qr))
                                            : vf_mul(scale, vf_loadu_n(qr, n));
                }
            vf_transpose(a);
SIMD_UNROLL(16)
            for (int32_t i = 0; i < VF_LANES; i++)
                if (i < n)
                    vf_store(ps->qt + (d + i) * ps->rp + r0, a[i]);
        }
}

#ifdef QK_BF16DP
/* qt2[p][r] = the bf16 pair (q[r][2p], q[r][2p + 1]) for p < dk / 2, zero for padding
 * rows: q's values are bfloat16, so the pair is their upper halves, exactly. Blocks of
 * VF_LANES rows by 2 VF_LANES values are transposed in registers, then paired (at
 * S=128 a pass has few keys to amortize a value-by-value packing over: Zen 5, bf16
 * B=1 and 8, 6-8% faster); the last pairs of a dk that is not a multiple of 2
 * VF_LANES go one by one. */
static void pack_qt_bf16(pass *ps)
{
    const int32_t pairs = ps->blk->dk / 2, whole = pairs / VF_LANES * VF_LANES;
    for (int32_t r0 = 0; r0 < ps->rp; r0 += VF_LANES)
        for (int32_t p0 = 0; p0 < whole; p0 += VF_LANES) {
            /* rows' values 2 p0 + [0, VF_LANES), then the next VF_LANES: once transposed,
               column c of the 2 VF_LANES values is col[c] */
            vf col[2 * VF_LANES];
            for (int32_t i = 0; i < VF_LANES; i++) {
                const int real = r0 + i < ps->nr;
                col[i] = real ? vf_loadu(ps->q[r0 + i] + 2 * p0) : vf_zero();
                col[VF_LANES + i] = real ? vf_loadu(ps->q[r0 + i] + 2 * p0 + VF_LANES) : vf_zero();
            }
            vf_transpose(col);
            vf_transpose(col + VF_LANES);
            for (int32_t i = 0; i < VF_LANES; i++)
                qk_store_bf16_pairs(ps->qt2 + (int64_t)(p0 + i) * ps->rp + r0, col[2 * i],
                                    col[2 * i + 1]);
        }
    for (int32_t r = 0; r < ps->rp; r++)
        for (int32_t p = whole; p < pairs; p++) {
            const uint32_t even = r < ps->nr ? mha_f32_bits(ps->q[r][2 * p]) : 0;
            const uint32_t odd = r < ps->nr ? mha_f32_bits(ps->q[r][2 * p + 1]) : 0;
            ps->qt2[(int64_t)p * ps->rp + r] = even >> 16 | (odd & 0xffff0000u);
        }
}
#endif

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

/* kr[j], vr[j]: the K and V rows of keys j0 + j, j < jn; with a block table, the
 * table is read once per block and the rows stepped by their stride within it. */
static void tile_rows(const mha_attn_block *blk, int32_t j0, int32_t jn, const char **kr,
                      const char **vr)
{
    if (jn <= 0)
        return;
    const mha_rows *k = &blk->k, *v = &blk->v;
    const char *kp = mha_row(k, j0), *vp = mha_row(v, j0);
    if (!k->table) {
        for (int32_t j = 0; j < jn; j++)
            kr[j] = kp + j * k->stride, vr[j] = vp + j * v->stride;
        return;
    }
    const int32_t bs = k->block_size;
    int32_t b = (k->first + j0) / bs, run = bs - (k->first + j0) % bs; /* rows left in b */
    for (int32_t j = 0; j < jn; run = bs) {
        const int32_t n = jn - j < run ? jn - j : run;
        for (int32_t i = 0; i < n; i++)
            kr[j + i] = kp + i * k->stride, vr[j + i] = vp + i * v->stride;
        if ((j += n) < jn) {
            b++;
            kp = k->base + (int64_t)k->table[b] * k->block_stride;
            vp = v->base + (int64_t)v->table[b] * v->block_stride;
        }
    }
}

/* Are rows[j] = rows[0] + j stride for j < n (a paged tile within one block)? */
static int even_rows(const char *const *rows, int32_t n, int64_t stride)
{
    for (int32_t j = 1; j < n; j++)
        if (rows[j] != rows[0] + j * stride)
            return 0;
    return 1;
}

/* The cache lines of a row of `bytes` bytes into L2, or into L1 with l1. While K
 * and V stream from beyond L2, the rows of the next tile are asked for (nkr, nvr):
 * a pass of many rows asks for them into L2 at the tile's start (a tile would not
 * fit L1); a dot pass, whose compute per key is small, asks for K rows a few keys
 * ahead into L1 at each of its steps (dot_step), and for the next tile's V rows into
 * L2 during its P.V (pv_dot). */
static inline void prefetch_row(const char *row, int32_t bytes, int l1)
{
    for (const char *c = row - (uintptr_t)row % 64; c < row + bytes; c += 64)
        if (l1)
            prefetch_l1(c);
        else
            prefetch_l2(c);
}

/* A row's values from d (a multiple of 32 for q8_0), as a typed pointer. */
static inline const char *row_at(mha_dtype t, const char *row, int32_t d)
{
    return row + mha_row_bytes(t, d);
}

/* dst[j][0..cw) (pitch STAGE_D) = values [d, d + cw) of the rows rows[j], keys
 * j0 <= j < j1: a K or V tile converted to floats. */
static void stage(mha_dtype t, float *dst, const char *const *rows, int32_t j0, int32_t j1,
                  int32_t d, int32_t cw)
{
    for (int32_t j = j0; j < j1; j++) {
        const char *src = row_at(t, rows[j], d);
        float *out = dst + (int64_t)j * STAGE_D;
        switch (t) {
        case MHA_F16: simd_load_row(MHA_F16, out, src, cw); break;
        case MHA_BF16: simd_load_row(MHA_BF16, out, src, cw); break;
        case MHA_Q8_0: simd_load_row(MHA_Q8_0, out, src, cw); break;
        default: simd_load_row(MHA_F32, out, src, cw); break;
        }
    }
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

#ifdef QK_AMX
enum { KP_KEYS = (int)QK_AMX_KEYS > (int)QK_KEYS ? (int)QK_AMX_KEYS : (int)QK_KEYS };
/* A bf16dp pass has dk <= 2 QT_FLOATS / QK_ROWS: rows of 2 dk bytes. */
_Static_assert(QK_AMX_KEYS * 4 * QT_FLOATS / QK_ROWS <= (int)sizeof(float) * BC * STAGE_D,
               "kst holds QK_AMX_KEYS bf16 rows of any dk of a bf16dp pass");

/* The bf16 rows kp[0 .. QK_AMX_KEYS) as one tile operand, ldk bytes apart: in place when
 * they are equally spaced (any spacing, even 0), else copied into kst. */
static const char *amx_rows(pass *ps, const float *const *kp, int64_t *ldk)
{
    const char *k0 = (const char *)kp[0];
    const ptrdiff_t step = (const char *)kp[1] - k0;
    int even = 1;
    for (int i = 2; i < QK_AMX_KEYS; i++)
        even &= (const char *)kp[i] - (const char *)kp[i - 1] == step;
    if (even) {
        *ldk = step;
        return k0;
    }
    const int64_t bytes = (int64_t)ps->blk->dk * 2;
    char *rows = (char *)ps->kst;
    for (int i = 0; i < QK_AMX_KEYS; i++)
        memcpy(rows + i * bytes, kp[i], (size_t)bytes);
    *ldk = bytes;
    return rows;
}

/* P.V of a tile on the tile unit (pv_tile_amx): V's rows paired into vst, then per 32
 * rows (16 for a last 16) P's pieces into kst and O += P V in place, after O = alpha O.
 * Keys past the tile up to a multiple of QK_AMX_D have P = 0 and V = 0. */
_Static_assert(AMX_BC / 2 * OST_D * 4 <= (int)sizeof(float) * BC * STAGE_D
                   && P_PIECES * 32 * AMX_BC * 2 <= (int)sizeof(float) * BC * STAGE_D,
               "vst holds a tile's V paired, kst 32 rows of P's pieces");
static void pv_amx(pass *ps, int32_t jn)
{
    const int32_t dv = ps->blk->dv, kn = (jn + QK_AMX_D - 1) / QK_AMX_D * QK_AMX_D;
    amx_pair_v(ps->vr, jn, kn, dv, (uint32_t *)ps->vst);
    for (int32_t r = 0; r < ps->nr; r++) {
        if (ps->alpha[r] == 1.0f) /* the row's max held */
            continue;
        const vf a = vf_set1(ps->alpha[r]);
        for (int32_t d = 0; d < dv; d += VF_LANES)
            vf_storeu(ps->out[r] + d, vf_mul(a, vf_loadu(ps->out[r] + d)));
    }
    for (int32_t r0 = 0, n; r0 < ps->rp; r0 += 16 * n) {
        n = ps->rp - r0 >= 32 ? 2 : 1;
        amx_split_p(ps->st + r0, ps->rp, jn, kn, (uint16_t *)ps->kst, n);
        pv_tile_amx(kn, (const uint16_t *)ps->kst, (const uint32_t *)ps->vst, dv,
                    ps->ost + (int64_t)r0 * dv, n);
    }
}
#else
enum { KP_KEYS = QK_KEYS > QK_NARROW_KEYS ? QK_KEYS : QK_NARROW_KEYS };
#endif

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
        /* Staged K goes STAGE_D columns at a time; resuming the FMA chains from st
           between them keeps every bit. */
        const int32_t cstep = ps->kdirect || ps->bf16dp ? dc : STAGE_D;
        for (int32_t ds = d0; ds < d0 + dc; ds += cstep) {
            const int32_t cw = d0 + dc - ds < cstep ? d0 + dc - ds : cstep;
            if (!ps->kdirect && !ps->bf16dp)
                stage(ps->blk->kv_type, ps->kst, ps->kr, 0, jn, ds, cw);
            for (int32_t g = 0; g < ps->nqk; g++) {
                const qk_group gr = ps->qk[g];
                const int wide = gr.rows == QK_ROWS;
                const int32_t keys = ps->amx ? QK_AMX_KEYS : wide ? QK_KEYS : QK_NARROW_KEYS;
                for (int32_t jg = 0; jg < jn; jg += keys) {
                    float *st = ps->st + jg * ps->rp + gr.r0;
                    if (jg >= keys_to(gr.keys, j0, jn) || jg + keys <= keys_from(gr.keys, j0)) {
                        for (int32_t i = 0; ds == 0 && i < keys; i++)
                            for (int32_t c = 0; c < gr.rows; c += VF_LANES)
                                vf_store(st + i * ps->rp + c, vf_set1(-INFINITY));
                        continue;
                    }
                    const float *kp[KP_KEYS];
                    for (int i = 0; i < keys; i++) { /* keys past the tile repeat its last one */
                        const int32_t j = jg + i < jn ? jg + i : jn - 1;
                        kp[i] = ps->bf16dp    ? (const float *)ps->kr[j] /* bf16 pairs in place */
                                : ps->kdirect ? (const float *)ps->kr[j] + ds
                                              : ps->kst + (int64_t)j * STAGE_D;
                    }
#ifdef QK_AMX
                    if (ps->amx) {
                        int64_t ldk;
                        const char *k = amx_rows(ps, kp, &ldk);
                        qk_tile_amx(dh, k, ldk, ps->qt2 + gr.r0, ps->rp, st, ps->qscale);
                        continue;
                    }
#endif
#ifdef QK_BF16DP
                    if (ps->bf16dp) { /* wide groups only (plan_groups) */
                        qk_tile_bf16dp(dh / 2, kp, ps->qt2 + gr.r0, ps->rp, st, ps->qscale);
                        continue;
                    }
#endif
                    const float *qt = ps->qt + (int64_t)(ds - d0) * ps->rp + gr.r0;
                    if (wide)
                        qk_tile(cw, kp, qt, ps->rp, st, ds > 0);
                    else
                        qk_tile_narrow(cw, kp, qt, ps->rp, st, ds > 0);
                }
            }
        }
    }
}

/* The whole PAIR chunks of x[0..n) from natural order to the even values then the
 * odd ones (to_pairs), or back: the order of bf16 pair loads. */
static void paired_order(float *x, int32_t n, int to_pairs)
{
    float t[PAIR];
    for (int32_t c = 0; c + PAIR <= n; c += PAIR) {
        for (int32_t i = 0; i < PAIR; i++)
            if (to_pairs)
                t[i % 2 * VF_LANES + i / 2] = x[c + i];
            else
                t[i] = x[c + i % 2 * VF_LANES + i / 2];
        memcpy(x + c, t, sizeof t);
    }
}

/* qt[r][d] = qscale * q[r][d] row by row for the dot products (in pairs order when paired). */
static void pack_q_rows(pass *ps)
{
    const int32_t dk = ps->blk->dk;
    const vf scale = vf_set1(ps->qscale);
    for (int32_t r = 0; r < ps->nr; r++) {
        float *dst = ps->qt + (int64_t)r * dk;
        int32_t d = 0;
        for (; d + VF_LANES <= dk; d += VF_LANES)
            vf_storeu(dst + d, vf_mul(scale, vf_loadu(ps->q[r] + d)));
        if (d < dk)
            vf_storeu_n(dst + d, dk - d, vf_mul(scale, vf_loadu_n(ps->q[r] + d, dk - d)));
        if (ps->paired)
            paired_order(dst, dk, 1);
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

/* The VF_LANES values of K or V at d of a row of type T; a q8_0 row's values of
 * one block take its scale sc (vf_q8_scale, hoisted by the callers per block). */
static inline __attribute__((always_inline)) vf load_kv(const int T, const char *row, int32_t d,
                                                       vf sc)
{
    if (T == MHA_Q8_0)
        return vf_load_q8((const int8_t *)row + d / MHA_Q8_BLOCK * MHA_Q8_BYTES + 2
                              + d % MHA_Q8_BLOCK,
                          sc);
    return vf_load_as(T, row, d);
}

/* s[kk*R + rr] = sum over d of q[rr*dk + d] k[kk][d] for DOT_SCORES / R keys (rows of
 * type T) and R rows: the lane-wise partial sums, a q8_0 block's scales loaded once
 * per block, then vf_reduce_lanes, which sums every lane in the same order, so that
 * a score does not depend on its slot. */
static SIMD_INSTANCE void dot_tile(const float *q, int32_t dk,
                                   const char *const *k, float *s,
                                   const int R, const int T)
{
    const int KS = DOT_SCORES / R;
    const int CH = T == MHA_Q8_0 ? MHA_Q8_BLOCK : VF_LANES; /* values per scale */
    vf acc[DOT_SCORES];
SIMD_UNROLL(16)
    for (int i = 0; i < DOT_SCORES; i++)
        acc[i] = vf_zero();
    const int32_t tail = dk % VF_LANES; /* 0 for q8_0 (dk % 32 == 0) */
    /* bf16: whole PAIR chunks as even and odd values, q in the same order (pack_q_rows) */
    const int32_t paired = T == MHA_BF16 ? dk - dk % PAIR : 0;
    for (int32_t d0 = 0; d0 < paired; d0 += PAIR)
SIMD_UNROLL(2)
        for (int h = 0; h < 2; h++) {
            vf qv[4];
SIMD_UNROLL(4)
            for (int rr = 0; rr < R; rr++) {
                qv[rr] = vf_loadu(q + rr * dk + d0 + h * VF_LANES);
                vf_keep(&qv[rr]);
            }
SIMD_UNROLL(16)
            for (int kk = 0; kk < KS; kk++) {
                vf even, odd;
                vf_load_bf16_pair((const uint16_t *)k[kk] + d0, &even, &odd);
                const vf kv = h ? odd : even;
SIMD_UNROLL(4)
                for (int rr = 0; rr < R; rr++)
                    acc[kk * R + rr] = vf_fmadd(qv[rr], kv, acc[kk * R + rr]);
            }
        }
    for (int32_t d0 = paired; d0 < dk - tail; d0 += CH) {
        vf sc[DOT_SCORES];
SIMD_UNROLL(16)
        for (int kk = 0; kk < KS; kk++)
            sc[kk] = T == MHA_Q8_0 ? vf_q8_scale(k[kk] + d0 / MHA_Q8_BLOCK * MHA_Q8_BYTES)
                                   : vf_zero();
SIMD_UNROLL(4)
        for (int32_t d = d0; d < d0 + CH; d += VF_LANES) {
            vf qv[4];
SIMD_UNROLL(4)
            for (int rr = 0; rr < R; rr++) {
                qv[rr] = vf_loadu(q + rr * dk + d);
                vf_keep(&qv[rr]); /* one load for the KS keys, not one per FMA */
            }
SIMD_UNROLL(16)
            for (int kk = 0; kk < KS; kk++) {
                const vf kv = load_kv(T, k[kk], d, sc[kk]);
SIMD_UNROLL(4)
                for (int rr = 0; rr < R; rr++)
                    acc[kk * R + rr] = vf_fmadd(qv[rr], kv, acc[kk * R + rr]);
            }
        }
    }
    if (T != MHA_Q8_0 && tail) {
        const int32_t d = dk - tail;
        vf qv[4];
SIMD_UNROLL(4)
        for (int rr = 0; rr < R; rr++)
            qv[rr] = vf_loadu_n(q + rr * dk + d, tail);
SIMD_UNROLL(16)
        for (int kk = 0; kk < KS; kk++) {
            const vf kv = vf_load_as_n(T, k[kk], d, tail);
SIMD_UNROLL(4)
            for (int rr = 0; rr < R; rr++)
                acc[kk * R + rr] = vf_fmadd(qv[rr], kv, acc[kk * R + rr]);
        }
    }
SIMD_UNROLL(4)
    for (int i = 0; i < DOT_REDUCES; i++)
        vf_storeu(s + i * VF_LANES, vf_reduce_lanes(acc + i * VF_LANES));
}

/* The out-of-line instances of a kernel over (R rows, K or V rows of type T): case
 * R * MHA_DTYPE_COUNT + T runs RT_CALL_(R, T), for R in 4, 2, 1 and every type of
 * the list; the caller defines RT_CALL_ around RT_SWITCH_. */
#define RT_CASE_(r, t)                \
    case r * MHA_DTYPE_COUNT + t:     \
        RT_CALL_(r, t);               \
        break;
#define RT_CASE_4_(name, t, bytes, values, io) RT_CASE_(4, t)
#define RT_CASE_2_(name, t, bytes, values, io) RT_CASE_(2, t)
#define RT_CASE_1_(name, t, bytes, values, io) RT_CASE_(1, t)
#define RT_SWITCH_(R, T)                                                                  \
    switch ((R) * MHA_DTYPE_COUNT + (int)(T)) {                                           \
        MHA_DTYPE_LIST(RT_CASE_4_) MHA_DTYPE_LIST(RT_CASE_2_) MHA_DTYPE_LIST(RT_CASE_1_) \
    default: break;                                                                       \
    }

/* The row groups of a dot pass: 4 rows while 4 remain, then 2, then 1. */
static int32_t dot_group(int32_t nr, int32_t r)
{
    return nr - r >= 4 ? 4 : nr - r >= 2 ? 2 : 1;
}

/* Is key i from the tile's start (past it: the next tile's) known to the pass? */
static inline int ahead(const pass *ps, int32_t i)
{
    return i < ps->tn + ps->nn;
}

/* The row of key i of ahead(): rows[i] of the tile, or next[i - tn] of the next. */
static inline const char *row_ahead(const pass *ps, const char *const *rows,
                                    const char *const *next, int32_t i)
{
    return i < ps->tn ? rows[i] : next[i - ps->tn];
}

/* st[j][r0 + rr] for keys [j, j + DOT_SCORES) of the tile (those past jt repeat
 * the key jt - 1, and are not stored) and R rows from r0. With pf, a sub-step's
 * worth of K rows DOT_PF_KEYS keys ahead (into the next tile) are asked for into L1
 * before its dot products: the requests stay spread while the FMAs run (a burst
 * would stall on the fill buffers). The rows DOT_PF_FAR keys ahead are asked for into
 * L2 too (far_kbytes of the K row, the first line of the V row, whose other lines the
 * P.V asks for): whole K rows where they come from memory (K and V past L3) or from
 * runs of at most PF_ROWS_SPAN bytes (a paged cache's blocks: two 4 KiB pages are too
 * few for the hardware's prefetchers to pick the run up), so that K, asked for only
 * DOT_PF_KEYS keys ahead otherwise, keeps enough lines in flight (Zen 4, Skv=4096:
 * B=8 f32 1.06-1.2x, f16 and bf16 1.05-1.2x, paged f32 block_size 16 1.2x; in L3,
 * B=1 f16 1.13x slower). q8_0 keeps the first line: its decode is bound by the
 * dequantization (Zen 4, B=8 from memory 1.07x slower with whole rows). Else, in a
 * paged cache whose blocks hold a head's rows in less than PF_FAR_SPAN bytes, the
 * first line starts the walks of the scattered blocks' pages early (Xeon, block_size
 * 16, B=8: f16 1.10x, f32 1.08x); over longer runs the prefetchers have the rows, and
 * the requests only got in their way (Xeon, f16, block_size 256, B=1: 1.04-1.06x
 * faster without). */
enum { DOT_PF_KEYS = 8, DOT_PF_FAR = 64, PF_FAR_SPAN = 32 * 1024, PF_ROWS_SPAN = 8 * 1024 };
static SIMD_INSTANCE void dot_step(pass *ps, int32_t r0, int32_t j,
                                   int32_t jt, const char *const *k,
                                   int pf, const int R, const int T)
{
    const int KS = DOT_SCORES / R;
    const int32_t dk = ps->blk->dk;
    for (int sub = 0; sub < R; sub++) {
        const int32_t jk = j + sub * KS; /* a score row of R floats per key */
        for (int32_t i = jk + DOT_PF_KEYS; pf && i < jk + KS + DOT_PF_KEYS && ahead(ps, i); i++)
            prefetch_row(row_ahead(ps, ps->kr, ps->nkr, i), ps->kbytes, 1);
        for (int32_t i = jk + DOT_PF_FAR; pf && ps->far_kbytes && i < jk + KS + DOT_PF_FAR
                                          && ahead(ps, i); i++)
            prefetch_row(row_ahead(ps, ps->kr, ps->nkr, i), ps->far_kbytes, 0),
                prefetch_l2(row_ahead(ps, ps->vr, ps->nvr, i));
        /* a group of all the pass's rows writes its keys' scores in place */
        const int whole = R == ps->rp && jk + KS <= jt;
        float s[DOT_SCORES];
        dot_tile(ps->qt + (int64_t)r0 * dk, dk, k + sub * KS, whole ? ps->st + jk * R : s, R, T);
        for (int kk = 0; !whole && kk < KS && jk + kk < jt; kk++)
            memcpy(ps->st + (jk + kk) * ps->rp + r0, s + kk * R, (size_t)R * sizeof(float));
    }
}

/* dot_step for R rows of K rows of type T, out of line: one instance of each
 * (R, T), called per key step (sanitizer builds would otherwise compile many
 * inlined copies). */
__attribute__((noinline)) static void dot_steps(pass *ps, int32_t r0, int32_t j, int32_t jt,
                                                const char *const *k, int pf, int R, mha_dtype T)
{
#define RT_CALL_(r, t) dot_step(ps, r0, j, jt, k, pf, r, t)
    RT_SWITCH_(R, T)
#undef RT_CALL_
}

/* st[j][r] = -inf for the pass's rows r and the tile's keys j0 <= j < j1. */
static void hide_keys(pass *ps, int32_t j0, int32_t j1)
{
    for (int32_t j = j0; j < j1; j++)
        for (int32_t r = 0; r < ps->nr; r++)
            ps->st[j * ps->rp + r] = -INFINITY;
}

/* st[j][r] = (scale q[r]).k[j0 + j] for a pass of few rows, DOT_SCORES keys per
 * step for every row group; while K and V stream, the first group asks for the
 * keys one tile ahead. Keys no row sees are not read (-inf). */
static SIMD_INSTANCE void scores_dot_as(pass *ps, int32_t j0, int32_t jn,
                                        const int T)
{
    const int32_t nr = ps->nr;
    const int32_t jf = keys_from(ps->all, j0), jt = keys_to(ps->all, j0, jn);
    hide_keys(ps, 0, jf);
    hide_keys(ps, jt > jf ? jt : jf, jn);
    for (int32_t j = jf; j < jt; j += DOT_SCORES) {
        const char *k[DOT_SCORES];
        for (int kk = 0; kk < DOT_SCORES; kk++) /* keys past the range repeat its last one */
            k[kk] = ps->kr[j + kk < jt ? j + kk : jt - 1];
        for (int32_t r = 0; r < nr; r += dot_group(nr, r))
            dot_steps(ps, r, j, jt, k, r == 0 && ps->stream, dot_group(nr, r), (mha_dtype)T);
    }
}

/* One instance per element type of K. */
static void scores_dot(pass *ps, int32_t j0, int32_t jn)
{
    switch (ps->blk->kv_type) {
    case MHA_F16: scores_dot_as(ps, j0, jn, MHA_F16); break;
    case MHA_BF16: scores_dot_as(ps, j0, jn, MHA_BF16); break;
    case MHA_Q8_0: scores_dot_as(ps, j0, jn, MHA_Q8_0); break;
    default: scores_dot_as(ps, j0, jn, MHA_F32); break;
    }
}

/* s + log2(e) b (scores in base 2), or -inf where b is -INFINITY whatever s is (a
   NaN score of a hidden key). */
static inline vf biased(vf s, vf b, vm *hides)
{
    const vm inf = vf_eq(b, vf_set1(-INFINITY));
    *hides = vm_or(*hides, inf);
    return vf_select(inf, b, vf_fmadd(b, vf_set1(SCORE_LOG2E), s));
}

static inline float biased1(float s, float b, int *hides)
{
    *hides |= b == -INFINITY;
    return b == -INFINITY ? b : fmaf(b, SCORE_LOG2E, s);
}

/* st[j][r] = biased(st[j][r], bias[r][j0 + j]) for rows r < nr, keys j < jn (all
 * inside the bias tensor); notes in ps->bias_hides whether any was -INFINITY. A
 * bias shared by all rows (stride 0, BERT's [B,1,1,S]) is broadcast; otherwise
 * VF_LANES x VF_LANES blocks are transposed in registers. */
static void add_bias(pass *ps, int32_t j0, int32_t jn)
{
    vm hides = vm_none();
    int hides1 = 0;
    if (ps->bias_shared && ps->kpv == 1) {
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

/* The n (1..VF_LANES) values at d of a row of type t, whatever t is at run time:
 * for the paths that are not hot (the careful P.V, the finiteness check). */
static vf load_any(mha_dtype t, const char *row, int32_t d, int32_t n)
{
    switch (t) {
    case MHA_F16: return vf_load_as_n(MHA_F16, row, d, n);
    case MHA_BF16: return vf_load_as_n(MHA_BF16, row, d, n);
    case MHA_Q8_0: return load_kv(MHA_Q8_0, row, d, vf_q8_scale(row_at(MHA_Q8_0, row, d)));
    default: return vf_load_as_n(MHA_F32, row, d, n);
    }
}

/* Are the V rows of the tile's jn keys all finite? (x * 0 is 0 for finite x, NaN
 * otherwise.) */
static int v_finite(const pass *ps, int32_t jn)
{
    const int32_t dv = ps->blk->dv;
    vf acc = vf_zero();
    for (int32_t j = 0; j < jn; j++)
        for (int32_t d = 0; d < dv; d += VF_LANES)
            acc = vf_fmadd(load_any(ps->blk->kv_type, ps->vr[j], d, dv - d < VF_LANES ? dv - d : VF_LANES),
                           vf_zero(), acc);
    return vm_all(vf_eq(acc, acc));
}

/* st = c tanh(st / c) with c = softcap log2(e) (scores in base 2) over the tile's
 * rows (and, when rp < VF_LANES, the lanes of its last vector past the tile, zeros
 * here, which softmax_tile masks). */
static void softcap_tile(pass *ps, int32_t jn)
{
    const float cap2 = ps->blk->softcap * SCORE_LOG2E;
    const vf cap = vf_set1(cap2), inv = vf_set1(1.0f / cap2);
    for (int32_t i = jn * ps->rp; i % VF_LANES; i++)
        ps->st[i] = 0.0f;
    for (int32_t i = 0; i < jn * ps->rp; i += VF_LANES) {
        float *sp = ps->st + i;
        vf_store(sp, vf_mul(cap, vf_tanh(vf_mul(vf_load(sp), inv))));
    }
}

/* Lanes per row group of st and the per-row arrays (at least a vector), vectors of
 * st per tile of jn keys, and the floats between two of them. */
static int32_t st_lanes(const pass *ps)
{
    return ps->rp < VF_LANES ? VF_LANES : ps->rp;
}

static int32_t st_vectors(const pass *ps, int32_t jn)
{
    return (jn + ps->kpv - 1) / ps->kpv;
}

static int32_t st_step(const pass *ps)
{
    return ps->kpv * ps->rp;
}

/* st += slope * (j - pos) for key j of the tile: ALiBi from the slopes (times log2(e)).
 * The bounds are locals: stores to st could alias ps, and the compiler would
 * otherwise recompute st_vectors, a division, for every vector. */
static void alibi_tile(pass *ps, int32_t j0, int32_t jn)
{
    const vf lk = vf_load(ps->lane_keyf);
    const int32_t lanes = st_lanes(ps), nv = st_vectors(ps, jn), step = st_step(ps), kpv = ps->kpv;
    for (int32_t g = 0; g < lanes; g += VF_LANES) {
        const vf slope = vf_load(ps->slope + g), pos = vf_load(ps->pos + g);
        for (int32_t v = 0; v < nv; v++) {
            float *sp = ps->st + v * step + g;
            const vf j = vf_add(vf_set1((float)(j0 + v * kpv)), lk);
            vf_store(sp, vf_fmadd(slope, vf_sub(j, pos), vf_load(sp)));
        }
    }
}

/* x[i] = the max (sum) of the lanes of x that hold the row of lane i (i % rp, rp <
 * VF_LANES, a power of two): the keys of a vector of st folded by butterfly steps,
 * each combining lanes i and i ^ s, so every lane of a row gets the same bits (but
 * for a max over a NaN score, whose row's P, l and O are NaN whatever its max). */
static vf fold_keys(vf x, int32_t rp, int sum)
{
    for (int32_t s = VF_LANES / 2; s >= rp; s /= 2)
        x = sum ? vf_add(x, vf_swap_lanes(x, s)) : vf_max(x, vf_swap_lanes(x, s));
    return x;
}

/* x_v = 2^(x_v - mu) for the nv vectors x_v at x + v step; returns their sum.
 * Its own function (noinline): its constants and chains get the register file,
 * which the softmax's caller would otherwise spill to the stack. */
__attribute__((noinline))
static vf exp2_sum(float *x, int32_t nv, int32_t step, vf mu)
{
    vf sum = vf_zero();
    for (int32_t v = 0; v < nv; v++, x += step) {
        const vf p = vf_exp2(vf_sub(vf_load(x), mu));
        vf_store(x, p);
        sum = vf_add(sum, p);
    }
    return sum;
}

/* The online softmax for one tile, per row (vector lanes across rows, and across
 * kpv keys when rp < VF_LANES), on scores in base 2 (exp(x) = 2^(log2(e) x)):
 *   s_j = log2(e) ((scale q).k_j + bias_j) for visible keys, -inf for the others
 *   m' = max(m, max_j s_j);   P_j = 2^(s_j - m');   alpha = 2^(m - m')
 *   l' = alpha l + sum_j P_j; (then O' = diag(alpha) O + P V in pv)
 * A row that has seen no visible key yet has m' = -inf: it uses 0 in place of
 * m', so P = 0 and alpha = 0 (O and l stay 0) instead of NaN. st becomes P;
 * with `careful`, the P of hidden keys (s = -inf) is -0.0f. */
static void softmax_tile(pass *ps, int32_t j0, int32_t jn, int careful)
{
    const vf ninf = vf_set1(-INFINITY);
    const int32_t nv = st_vectors(ps, jn), step = st_step(ps);
    for (int32_t i = jn * ps->rp; i < nv * step; i++) /* keys past the tile */
        ps->st[i] = -INFINITY;
    for (int32_t g = 0; g < st_lanes(ps); g += VF_LANES) {
        const vi ke = vi_load(ps->ke + g), kb = vi_load(ps->kb + g);
        vf mt = ninf;
        if (vm_all(vi_gt(ke, j0 + jn - 1)) && vm_empty(vi_gt(kb, j0))) {
            /* Every row sees the whole tile: four independent chains of max. */
            vf m1 = ninf, m2 = ninf, m3 = ninf;
            int32_t v = 0;
            for (; v + 4 <= nv; v += 4) {
                mt = vf_max(mt, vf_load(ps->st + v * step + g));
                m1 = vf_max(m1, vf_load(ps->st + (v + 1) * step + g));
                m2 = vf_max(m2, vf_load(ps->st + (v + 2) * step + g));
                m3 = vf_max(m3, vf_load(ps->st + (v + 3) * step + g));
            }
            for (; v < nv; v++)
                mt = vf_max(mt, vf_load(ps->st + v * step + g));
            mt = vf_max(vf_max(mt, m1), vf_max(m2, m3));
        } else {
            const vi kel = vi_load(ps->kel + g), kbl = vi_load(ps->kbl + g);
            for (int32_t v = 0; v < nv; v++) {
                float *sp = ps->st + v * step + g;
                const int32_t j = j0 + v * ps->kpv;
                const vf s = vf_select(vm_andnot(vi_gt(kel, j), vi_gt(kbl, j)), vf_load(sp), ninf);
                vf_store(sp, s);
                mt = vf_max(mt, s);
            }
        }
        if (ps->kpv > 1)
            mt = fold_keys(mt, ps->rp, 0);
        const vf m = vf_load(ps->m + g);
        const vf mn = vf_max(m, mt);
        const vf mu = vf_select(vf_eq(mn, ninf), vf_zero(), mn);
        const vf alpha = vf_exp2(vf_sub(m, mu));
        vf sum = vf_zero();
        if (careful)
            for (int32_t v = 0; v < nv; v++) {
                float *sp = ps->st + v * step + g;
                const vf s = vf_load(sp);
                const vf p = vf_select(vf_eq(s, ninf), vf_set1(-0.0f), vf_exp2(vf_sub(s, mu)));
                vf_store(sp, p);
                sum = vf_add(sum, p);
            }
        else
            sum = exp2_sum(ps->st + g, nv, step, mu);
        if (ps->kpv > 1)
            sum = fold_keys(sum, ps->rp, 1);
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
 * not the -0.0f of a hidden key of P_j V_j, in the order of the tile kernels (and
 * the pairs order of O when paired). */
static void pv_row_careful(pass *ps, int32_t r, int32_t js, int32_t jv)
{
    const int32_t dh = ps->blk->dv, pairs = ps->paired ? dh - dh % PAIR : 0;
    float *o = ps->out[r];
    const vf alpha = vf_set1(ps->alpha[r]);
    for (int32_t d = 0; d < dh; d += VF_LANES) {
        const int32_t n = dh - d < VF_LANES ? dh - d : VF_LANES;
        vf acc = vf_mul(alpha, vf_loadu_n(o + d, n));
        for (int32_t j = js; j < jv; j++) {
            const float p = ps->st[j * ps->rp + r];
            if (p == 0.0f && signbit(p))
                continue;
            vf v[2];
            if (d < pairs)
                vf_load_bf16_pair((const uint16_t *)ps->vr[j] + d - d % PAIR, &v[0], &v[1]);
            else
                v[0] = load_any(ps->blk->kv_type, ps->vr[j], d, n);
            acc = vf_fmadd(vf_set1(p), v[d < pairs ? d % PAIR / VF_LANES : 0], acc);
        }
        vf_storeu_n(o + d, n, acc);
    }
}

/* Column vectors per sweep of the dot passes' P.V for R rows: half the register
 * file in accumulators, at most 8 per row (8 independent chains cover the latency). */
#define DOT_COLS(R) (VF_REGS / 2 / (R) < 8 ? VF_REGS / 2 / (R) : 8)
_Static_assert(DOT_COLS(4) % 2 == 0, "sweeps of whole bf16 pairs");
_Static_assert((int)BC >= (int)DOT_SCORES, "a dot pass's tile holds a step of keys");

/* o[rr][d ..] = alpha[rr] o[rr] + sum_{j < jn} p[j*pp + rr] v_j[d ..] for R rows (4,
 * 2 or 1) over NV column vectors from d, v_j the row vr[j] of type T: R x NV
 * accumulators, each V vector loaded once for the R rows; MASKED: one vector of
 * `last` lanes (a dv tail); alpha NULL: o is not rescaled. A sweep lies within one
 * q8_0 block or covers whole ones (dv % 32 == 0): each block's scale is loaded once
 * per key. bf16 (not MASKED, NV even): whole PAIR chunks in pairs order. The lines
 * that start within the sweep's bytes of a row are asked for into L2 in each row
 * nv[j < nn] (the next tile's V), so the sweeps together ask for every line of a row
 * on 64-byte lines (AVX-512's sweeps of 4 or 8 vectors span 4 or 8 f32 lines: asking
 * for only the first, decode over an f32 cache on Zen 4 took 1.05-1.18x the time). */
static SIMD_INSTANCE void pv_sweep(
                                   int32_t jn, const float *p, int32_t pp, const char *const *vr, int32_t d, float *const *o,
                                   const float *alpha, int32_t last, const char *const *nv, int32_t nn,
                                   const int R, const int T, const int NV, const int MASKED)
{
    /* the first line that starts in the sweep's bytes [b0, b1) of a row, if any */
    const int32_t b0 = (int32_t)mha_row_bytes((mha_dtype)T, d);
    const int32_t b1 = (int32_t)mha_row_bytes((mha_dtype)T, d + NV * VF_LANES);
    const int32_t line = (b0 + 63) / 64 * 64;
    const int32_t ask = line < b1 ? nn : 0;
    const int VPB = T == MHA_Q8_0 && NV * VF_LANES >= MHA_Q8_BLOCK ? MHA_Q8_BLOCK / VF_LANES : NV;
    vf acc[4 * 8];
SIMD_UNROLL(32)
    for (int i = 0; i < R * NV; i++) {
        const float *src = o[i / NV] + d + i % NV * VF_LANES;
        const vf x = MASKED ? vf_loadu_n(src, last) : vf_loadu(src);
        acc[i] = alpha ? vf_mul(vf_set1(alpha[i / NV]), x) : x;
    }
    for (int32_t j = 0; j < jn; j++) {
        for (int32_t b = line; j < ask && b < b1; b += 64)
            prefetch_l2(nv[j] + b);
        vf vv[8];
SIMD_UNROLL(8)
        for (int c0 = 0; c0 < NV; c0 += VPB) {
            const vf sc = T == MHA_Q8_0 ? vf_q8_scale(row_at(MHA_Q8_0, vr[j], d + c0 * VF_LANES))
                                        : vf_zero();
SIMD_UNROLL(8)
            for (int c = c0; c < c0 + VPB; c++)
                if (T == MHA_BF16 && !MASKED && NV % 2 == 0) {
                    if (c % 2 == 0)
                        vf_load_bf16_pair((const uint16_t *)vr[j] + d + c * VF_LANES, &vv[c], &vv[c + 1]);
                } else {
                    vv[c] = MASKED && T != MHA_Q8_0 ? vf_load_as_n(T, vr[j], d + c * VF_LANES, last)
                                                    : load_kv(T, vr[j], d + c * VF_LANES, sc);
                }
        }
SIMD_UNROLL(4)
        for (int rr = 0; rr < R; rr++) {
            const vf pb = vf_set1(p[(int64_t)j * pp + rr]);
SIMD_UNROLL(8)
            for (int c = 0; c < NV; c++)
                acc[rr * NV + c] = vf_fmadd(pb, vv[c], acc[rr * NV + c]);
        }
    }
SIMD_UNROLL(32)
    for (int i = 0; i < R * NV; i++) {
        float *dst = o[i / NV] + d + i % NV * VF_LANES;
        if (MASKED)
            vf_storeu_n(dst, last, acc[i]);
        else
            vf_storeu(dst, acc[i]);
    }
}

/* The P.V of R rows over all dv columns: sweeps of DOT_COLS(R) vectors, then one
 * vector at a time (the last masked), over DOT_PV_KEYS keys at a time, whose V rows
 * stay in L1 through the sweeps (a whole tile's rows at a power-of-two stride
 * would fall in a few L1 sets and be evicted between sweeps); the first key block
 * applies alpha; the sweeps ask for the rows nv[j < nn] ahead. One instance per
 * (R, T), out of line as dot_tiles. */
enum { DOT_PV_KEYS = 32 };
static SIMD_INSTANCE void pv_rows_as(
                                     int32_t jn, const float *p, int32_t pp, const char *const *vr, float *const *o,
                                     const float *alpha, int32_t dv, const char *const *nv, int32_t nn,
                                     const int R, const int T)
{
    for (int32_t j0 = 0; j0 < jn; j0 += DOT_PV_KEYS) {
        const int32_t kn = jn - j0 < DOT_PV_KEYS ? jn - j0 : DOT_PV_KEYS;
        const float *pj = p + (int64_t)j0 * pp, *aj = j0 ? NULL : alpha;
        const char *const *nj = nv + j0;
        const int32_t nk = nn - j0;
        int32_t d = 0;
        for (; d + DOT_COLS(R) * VF_LANES <= dv; d += DOT_COLS(R) * VF_LANES)
            pv_sweep(kn, pj, pp, vr + j0, d, o, aj, VF_LANES, nj, nk, R, T, DOT_COLS(R), 0);
        for (; T == MHA_BF16 && d + PAIR <= dv; d += PAIR) /* the rest of the pairs */
            pv_sweep(kn, pj, pp, vr + j0, d, o, aj, VF_LANES, nj, nk, R, T, 2, 0);
        for (; d < dv; d += VF_LANES)
            pv_sweep(kn, pj, pp, vr + j0, d, o, aj, dv - d < VF_LANES ? dv - d : VF_LANES, nj,
                     nk, R, T, 1, 1);
    }
}

__attribute__((noinline)) static void pv_rows(int32_t jn, const float *p, int32_t pp,
                                              const char *const *vr, float *const *o,
                                              const float *alpha, int32_t dv,
                                              const char *const *nv, int32_t nn, int R, mha_dtype T)
{
#define RT_CALL_(r, t) pv_rows_as(jn, p, pp, vr, o, alpha, dv, nv, nn, r, t)
    RT_SWITCH_(R, T)
#undef RT_CALL_
}

/* The P.V of a dot pass's rows [rg, rg + valid), keys [js, jv) of the tile, in the
 * row groups of its scores. While K and V stream, the pass's first group asks for
 * the next tile's V rows of those keys into L2, spread over its sweeps: the P.V then
 * keeps requests in flight as the dot products do (with all of them in the dot
 * steps, an f32 cache on Zen 1 read 10% slower). Asking for the tile's own V rows
 * into L1 during its dot steps instead, as 16-bit and q8_0 tiles did where they fit
 * 3/4 of L1: Zen 4, decode Skv=4096 B=8 f16 and bf16 1.2-1.3x the time, paged f16
 * 1.2x, B=1 Skv=16384 bf16 1.2x, q8_0 within noise. */
static void pv_dot(pass *ps, int32_t rg, int valid, int32_t js, int32_t jv)
{
    for (int32_t r = rg; r < rg + valid; r += dot_group(rg + valid, r))
        pv_rows(jv - js, ps->st + js * ps->rp + r, ps->rp, ps->vr + js, ps->out + r, ps->alpha + r,
                ps->blk->dv, ps->nvr + js, r == 0 ? ps->nn - js : 0,
                dot_group(rg + valid, r), ps->blk->kv_type);
}

/* The tiles of one row group over columns [c0, c1) of V, whose rows (pitch ldv
 * floats) are at v for key js of the tile: PV_COLS at a time, then VF_LANES. */
static void pv_cols(int32_t jn, const float *p, int32_t pp, const float *v, int64_t ldv,
                    float *const o[PV_ROWS], const vf alpha[PV_ROWS], int valid, int32_t c0,
                    int32_t c1)
{
    float *od[PV_ROWS];
    int32_t d = c0;
    for (; d + PV_COLS <= c1; d += PV_COLS) {
        for (int i = 0; i < PV_ROWS; i++)
            od[i] = o[i] + d;
        pv_tile(jn, p, pp, v + (d - c0), ldv, od, alpha, valid);
    }
    for (; d < c1; d += VF_LANES) {
        for (int i = 0; i < PV_ROWS; i++)
            od[i] = o[i] + d;
        pv_tail(jn, p, pp, v + (d - c0), ldv, od, alpha, valid, c1 - d < VF_LANES ? c1 - d : VF_LANES);
    }
}

/* O = diag(alpha) O + P V[j0 .. j0 + jn) over the pass's rows. A row group
 * runs from the first to the last key any of its rows sees (P is 0 outside),
 * and a group that sees none of the tile keeps O (alpha is 1 or O is 0). V is
 * read in place when vdirect; else STAGE_D columns at a time are staged for the
 * keys any row group reads, then every group runs over them (the same tiles,
 * column for column, as in place). */
static void pv(pass *ps, int32_t j0, int32_t jn, int careful)
{
    const int32_t dh = ps->blk->dv;
    const int32_t group = ps->dot ? 4 : PV_ROWS;
    const int32_t cstep = ps->vdirect || ps->dot || careful ? dh : STAGE_D;
    for (int32_t c0 = 0; c0 < dh; c0 += cstep) {
        const int32_t c1 = dh - c0 < cstep ? dh : c0 + cstep;
        if (!ps->vdirect && !ps->dot && !careful)
            stage(ps->blk->kv_type, ps->vst, ps->vr, keys_from(ps->all, j0),
                  keys_to(ps->all, j0, jn), c0, c1 - c0);
        for (int32_t rg = 0; rg < ps->nr; rg += group) {
            const int valid = ps->nr - rg < group ? ps->nr - rg : group;
            const span sp = ps->pv[rg / group];
            const int32_t js = keys_from(sp, j0), jv = keys_to(sp, j0, jn);
            if (jv <= js)
                continue;
            if (careful) {
                for (int32_t r = rg; r < rg + valid; r++)
                    pv_row_careful(ps, r, js, jv);
                continue;
            }
            if (ps->dot) {
                pv_dot(ps, rg, valid, js, jv);
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
            if (ps->vdirect)
                pv_cols(jv - js, p, pp, (const float *)ps->vr[js] + c0, ps->ldv, o, alpha, valid,
                        c0, c1);
            else
                pv_cols(jv - js, p, pp, ps->vst + (int64_t)js * STAGE_D, STAGE_D, o, alpha, valid,
                        c0, c1);
        }
    }
}

/* The score groups of a pass of nr rows: wide ones, then narrow ones (when `narrow`),
 * padding the fewest rows, then with the most wide ones; returns the rows they
 * cover, the pitch of qt and st. */
static int32_t plan_groups(pass *ps, int32_t nr, int narrow)
{
    int32_t wide = (nr + QK_ROWS - 1) / QK_ROWS, slim = 0;
    for (int32_t a = wide - 1; narrow && a >= 0; a--) {
        const int32_t b = (nr - a * QK_ROWS + QK_NARROW_ROWS - 1) / QK_NARROW_ROWS;
        if (a * QK_ROWS + b * QK_NARROW_ROWS < wide * QK_ROWS + slim * QK_NARROW_ROWS)
            wide = a, slim = b;
    }
    ps->nqk = wide + slim;
    int32_t r0 = 0;
    for (int32_t g = 0; g < ps->nqk; g++) {
        ps->qk[g].r0 = r0;
        ps->qk[g].rows = g < wide ? QK_ROWS : QK_NARROW_ROWS;
        r0 += ps->qk[g].rows;
    }
    return r0;
}

/* The pitch of st for a dot pass of nr rows: the power of two at or above nr while
 * below VF_LANES, else a multiple of VF_LANES. */
static int32_t dot_pitch(int32_t nr)
{
    int32_t p = 1;
    while (p < nr && p < VF_LANES)
        p *= 2;
    return (nr + p - 1) / p * p;
}

static void attend_pass(const mha_attn_block *blk, int32_t r0, int32_t nr)
{
    pass *ps = blk->scratch;
    const int32_t dk = blk->dk, dv = blk->dv;
    ps->blk = blk;
    ps->nr = nr;
    ps->dot = nr <= DOT_ROWS && (int64_t)nr * dk <= QT_FLOATS;
    ps->qscale = blk->scale * SCORE_LOG2E;
    ps->paired = ps->dot && blk->kv_type == MHA_BF16;
#ifdef QK_BF16DP
    ps->bf16dp = QK_BF16DP_AVAILABLE() && !ps->dot && blk->q_bf16 && blk->kv_type == MHA_BF16
                 && dk % 2 == 0
                 && (int64_t)dk / 2 * ((nr + QK_ROWS - 1) / QK_ROWS * QK_ROWS) <= QT_FLOATS;
#else
    ps->bf16dp = 0;
#endif
#ifdef QK_AMX
    ps->amx = ps->bf16dp && dk % QK_AMX_D == 0 && QK_AMX_AVAILABLE();
    ps->amx_pv = ps->amx && dv % 32 == 0 && dv <= OST_D;
    if (ps->amx)
        qk_amx_begin();
#else
    ps->amx = ps->amx_pv = 0;
#endif
    /* a dot pass's tile holds whole steps: a step past its keys repeats the last one */
    ps->bc = ps->amx ? AMX_BC : ps->dot ? BC / DOT_SCORES * DOT_SCORES : BC;
    ps->rp = ps->dot ? dot_pitch(nr) : plan_groups(ps, nr, !ps->bf16dp);
    ps->kpv = ps->rp < VF_LANES ? VF_LANES / ps->rp : 1;
    for (int32_t i = 0; i < VF_LANES; i++) {
        ps->lane_key[i] = i / ps->rp;
        ps->lane_keyf[i] = (float)ps->lane_key[i];
    }
    ps->bias_shared = blk->bias != NULL;
    /* Row r0 + r is row i of group g: walk (g, i) rather than divide per row. */
    for (int32_t r = 0, g = r0 / blk->group_rows, i = r0 % blk->group_rows; r < nr; r++) {
        ps->q[r] = blk->q + g * blk->q_group_stride + i * blk->q_stride;
        ps->dst[r] = blk->out + g * blk->out_group_stride + i * blk->out_stride;
        ps->out[r] = dv <= OST_D ? ps->ost + (int64_t)r * dv : ps->dst[r];
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
        ps->slope[r] = r < nr && blk->alibi_slope ? blk->alibi_slope[r0 + r] * SCORE_LOG2E : 0.0f;
        ps->pos[r] = r < nr && blk->alibi_slope ? (float)blk->alibi_pos[r0 + r] : 0.0f;
        ps->m[r] = -INFINITY;
        ps->l[r] = 0.0f;
    }
    /* Padding rows see every key, with scores -inf (dot passes: set here, never
       written after; other passes score zero rows of Q): the softmax of a tile
       every real row sees takes its fast path, and their results go nowhere. */
    for (int32_t r = nr; r < ps->rp; r++)
        ps->ke[r] = INT32_MAX;
    for (int32_t r = ps->rp; r < st_lanes(ps); r++) { /* rows again, lane for lane with st */
        const int32_t c = r % ps->rp;
        ps->ke[r] = ps->ke[c], ps->kb[r] = ps->kb[c];
        ps->slope[r] = ps->slope[c], ps->pos[r] = ps->pos[c];
        ps->m[r] = ps->m[c], ps->l[r] = ps->l[c];
    }
    for (int32_t r = 0; r < st_lanes(ps); r++) { /* padding rows' INT32_MAX stays above any key */
        ps->kel[r] = ps->ke[r] - ps->lane_key[r % VF_LANES];
        ps->kbl[r] = ps->kb[r] - ps->lane_key[r % VF_LANES];
    }
    if (ps->dot)
        for (int32_t j = 0; j < BC; j++)
            for (int32_t r = nr; r < ps->rp; r++)
                ps->st[j * ps->rp + r] = -INFINITY;
    ps->all = rows_span(ps, 0, nr);
    for (int32_t g = 0; !ps->dot && g < ps->nqk; g++) {
        const int32_t r0 = ps->qk[g].r0, r1 = r0 + ps->qk[g].rows;
        ps->qk[g].keys = rows_span(ps, r0, r1 < nr ? r1 : nr);
    }
    const int32_t group = ps->dot ? 4 : PV_ROWS;
    for (int32_t rg = 0; rg < nr; rg += group)
        ps->pv[rg / group] = rows_span(ps, rg, rg + group < nr ? rg + group : nr);
    const int32_t jmin = keys_from(ps->all, 0);
    ps->jmax = jmax;
    ps->kbytes = (int32_t)mha_row_bytes(blk->kv_type, dk);
    ps->vbytes = (int32_t)mha_row_bytes(blk->kv_type, dv);
    const int64_t run = blk->k.table ? blk->k.block_size * blk->k.stride : PF_FAR_SPAN;
    ps->far_kbytes = run <= PF_ROWS_SPAN || (blk->kv_far == KV_PAST_L3 && blk->kv_type != MHA_Q8_0)
                         ? ps->kbytes
                     : run < PF_FAR_SPAN ? 1
                                         : 0;
    ps->stream = blk->kv_far >= KV_PAST_L2
                 && (ps->dot || (int64_t)(jmax - jmin) * (ps->kbytes + ps->vbytes) > KV_L2_BYTES);
    ps->kdirect = blk->kv_type == MHA_F32;
    ps->ldv = blk->v.stride / (int64_t)sizeof(float);
    for (int32_t r = nr; ps->amx_pv && r < ps->rp; r++) /* the tile unit's padding rows */
        for (int32_t d = 0; d < dv; d += VF_LANES)
            vf_storeu(ps->ost + (int64_t)r * dv + d, vf_zero());
    for (int32_t r = 0; r < nr; r++) { /* O = 0, in vectors: rows are short */
        int32_t d = 0;
        for (; d + VF_LANES <= dv; d += VF_LANES)
            vf_storeu(ps->out[r] + d, vf_zero());
        if (d < dv)
            vf_storeu_n(ps->out[r] + d, dv - d, vf_zero());
    }
    ps->dc = QT_FLOATS / ps->rp / MHA_Q8_BLOCK * MHA_Q8_BLOCK; /* whole q8_0 blocks */
#ifdef QK_BF16DP
    if (ps->bf16dp) {
        ps->dc = dk; /* one chunk */
        pack_qt_bf16(ps);
    } else
#endif
    if (ps->dot)
        pack_q_rows(ps);
    else if (dk <= ps->dc)
        pack_qt(ps, 0, dk);

    /* Keys outside the pass's visible range are never read: a window costs
       its width, not the sequence. */
    for (int32_t j0 = jmin; j0 < jmax; j0 += ps->bc) {
        const int32_t jn = jmax - j0 < ps->bc ? jmax - j0 : ps->bc;
        if (blk->bias && !tile_visible(ps, j0, jn))
            continue;
        tile_rows(blk, j0, jn, ps->kr, ps->vr);
        ps->tn = jn;
        ps->vdirect = ps->kdirect && (!blk->v.table || even_rows(ps->vr, jn, blk->v.stride));
        ps->nn = ps->stream && j0 + jn < jmax ? (jmax - j0 - jn < ps->bc ? jmax - j0 - jn : ps->bc) : 0;
        tile_rows(blk, j0 + jn, ps->nn, ps->nkr, ps->nvr);
        for (int32_t j = 0; !ps->dot && j < ps->nn; j++)
            prefetch_row(ps->nkr[j], ps->kbytes, 0), prefetch_row(ps->nvr[j], ps->vbytes, 0);
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
        const int careful = hides && !v_finite(ps, jn);
        softmax_tile(ps, j0, jn, careful);
#ifdef QK_AMX
        if (ps->amx_pv && !careful) {
            pv_amx(ps, jn);
            continue;
        }
#endif
        pv(ps, j0, jn, careful);
    }

    /* out = O / l (+ exp(sink - m ln2)), lse = m ln2 + log(l) (m in base 2, in
       double: one rounding); rows that saw no key have l = 0 and O = 0 and get
       zeros, with lse -inf. */
    for (int32_t r = 0; r < nr && ps->paired; r++)
        paired_order(ps->out[r], dv, 0);
    for (int32_t r = 0; r < nr; r++) {
        const float l = ps->l[r];
        if (blk->lse)
            blk->lse[r0 + r] = l == 0.0f ? -INFINITY : (float)(ps->m[r] * SCORE_LN2 + log(l));
        /* one division per row, then products: a vector division takes several
           multiplies' time, and a short sequence has few keys per row to amortize it */
        const vf inv = vf_set1(1.0f / (l == 0.0f ? 1.0f
                                       : blk->sink ? l + (float)exp(blk->sink[r0 + r] - ps->m[r] * SCORE_LN2)
                                                   : l));
        const float *o = ps->out[r];
        float *y = ps->dst[r];
        int32_t d = 0;
        for (; d + VF_LANES <= dv; d += VF_LANES)
            vf_storeu(y + d, vf_mul(vf_loadu(o + d), inv));
        if (d < dv)
            vf_storeu_n(y + d, dv - d, vf_mul(vf_loadu_n(o + d, dv - d), inv));
    }
#ifdef QK_AMX
    if (ps->amx)
        qk_amx_end();
#endif
}

/* The lines of q's rows [r0, r1) into L2. */
static void prefetch_q(const mha_attn_block *blk, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        prefetch_row((const char *)(blk->q + mha_row_offset(blk, r, blk->q_stride, blk->q_group_stride)),
                     blk->dk * (int32_t)sizeof(float), 0);
}

/* Each pass asks for the next one's q rows, and the first for its own, all at once:
   packing Q^T would otherwise wait on the caller's rows one block at a time (Zen 5,
   S=128, B=8 from L3: pack_qt 11% of the call, 3-6% faster with). Staged rows are
   in cache already. */
static void flash_attn_block(const mha_attn_block *blk)
{
    const int32_t pr = pass_rows(blk);
    if (!blk->q_staged)
        prefetch_q(blk, 0, pr < blk->rows ? pr : blk->rows);
    for (int32_t r0 = 0; r0 < blk->rows; r0 += pr) {
        const int32_t next = r0 + 2 * pr < blk->rows ? r0 + 2 * pr : blk->rows;
        if (!blk->q_staged && r0 + pr < next)
            prefetch_q(blk, r0 + pr, next);
        attend_pass(blk, r0, blk->rows - r0 < pr ? blk->rows - r0 : pr);
    }
}

#endif
