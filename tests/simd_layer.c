/* The array wrappers of simd_layer.h over one ISA's layer, named by MHA_SIMD_ISA
 * and included from MHA_SIMD_H; built with that ISA's flags (tests/meson.build). */
#include MHA_SIMD_H
#include "simd/convert.h"
#include "simd/math.h"

#include "simd_layer.h"

#define TABLE_NAME_(isa) simd_layer_##isa
#define TABLE_NAME(isa) TABLE_NAME_(isa)

static inline vf binop(simd_binop op, vf a, vf b)
{
    switch (op) {
    case OP_ADD: return vf_add(a, b);
    case OP_SUB: return vf_sub(a, b);
    case OP_MUL: return vf_mul(a, b);
    case OP_DIV: return vf_div(a, b);
    case OP_MAX: return vf_max(a, b);
    case OP_COPYSIGN: return vf_copysign(vf_abs(a), b);
    case OP_SELECT_LT: return vf_select(vf_lt(a, b), a, b);
    case OP_SELECT_EQ: return vf_select(vf_eq(a, b), a, b);
    default: return vf_zero();
    }
}

static void binary(simd_binop op, const float *a, const float *b, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_storeu(y + i, binop(op, vf_loadu(a + i), vf_loadu(b + i)));
    if (i < n) {
        const int32_t t = (int32_t)(n - i);
        vf_storeu_n(y + i, t, binop(op, vf_loadu_n(a + i, t), vf_loadu_n(b + i, t)));
    }
}

static inline vf unop(simd_unop op, vf x)
{
    switch (op) {
    case OP_ABS: return vf_abs(x);
    case OP_ROUND: return vf_round(x);
    case OP_POW2I: return vf_pow2i(x);
    case OP_EXP: return vf_exp(x);
    case OP_EXP2: return vf_exp2(x);
    case OP_TANH: return vf_tanh(x);
    default: return vf_zero();
    }
}

static void unary(simd_unop op, const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_storeu(y + i, unop(op, vf_loadu(x + i)));
    if (i < n)
        vf_storeu_n(y + i, (int32_t)(n - i), unop(op, vf_loadu_n(x + i, (int32_t)(n - i))));
}

static void fmadd(const float *a, const float *b, const float *c, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_storeu(y + i, vf_fmadd(vf_loadu(a + i), vf_loadu(b + i), vf_loadu(c + i)));
    if (i < n) {
        const int32_t t = (int32_t)(n - i);
        vf_storeu_n(y + i, t, vf_fmadd(vf_loadu_n(a + i, t), vf_loadu_n(b + i, t), vf_loadu_n(c + i, t)));
    }
}

static void load_store_n(const float *p, int32_t n, float *y, float *dst)
{
    const vf x = vf_loadu_n(p, n);
    vf_storeu(y, x);
    vf_storeu_n(dst, n, x);
}

static void transpose(float *m)
{
    vf a[VF_LANES];
    for (int i = 0; i < VF_LANES; i++)
        a[i] = vf_loadu(m + i * VF_LANES);
    vf_transpose(a);
    for (int i = 0; i < VF_LANES; i++)
        vf_storeu(m + i * VF_LANES, a[i]);
}

static void reduce_lanes(const float *a, float *y)
{
    vf v[VF_LANES];
    for (int i = 0; i < VF_LANES; i++)
        v[i] = vf_loadu(a + i * VF_LANES);
    vf_storeu(y, vf_reduce_lanes(v));
}

static void swap_lanes(const float *x, int s, float *y)
{
    vf_storeu(y, vf_swap_lanes(vf_loadu(x), s));
}

static uint32_t mask(int op, const int32_t *k, int32_t b, int32_t b2)
{
    const vi x = vi_load(k);
    const vm m = op == 0   ? vi_gt(x, b)
                 : op == 1 ? vm_or(vi_gt(x, b), vi_gt(x, b2))
                 : op == 2 ? vm_andnot(vi_gt(x, b), vi_gt(x, b2))
                           : vm_none();
    float lanes[VF_LANES];
    vf_storeu(lanes, vf_select(m, vf_set1(1.0f), vf_zero()));
    uint32_t bits = 0;
    for (int i = 0; i < VF_LANES; i++)
        bits |= (lanes[i] == 1.0f ? 1u : 0u) << i;
    return bits | (uint32_t)vm_all(m) << 30 | (uint32_t)vm_empty(m) << 31;
}

static void load16(int t, const uint16_t *p, float *y, int64_t n)
{
    if (t == MHA_F16)
        simd_load_row(MHA_F16, y, p, n);
    else
        simd_load_row(MHA_BF16, y, p, n);
}

static void store16(int t, const float *x, uint16_t *p, int64_t n)
{
    if (t == MHA_F16)
        simd_store_row(MHA_F16, p, x, n);
    else
        simd_store_row(MHA_BF16, p, x, n);
}

static void load_q8(const int8_t *p, float d, float *y)
{
    vf_storeu(y, vf_load_q8(p, vf_set1(d)));
}

static void set1_f16(uint16_t h, float *y)
{
    vf_storeu(y, vf_set1_f16(h));
}

static void load_bf16_pair(const uint16_t *p, float *even, float *odd)
{
    vf e, o;
    vf_load_bf16_pair(p, &e, &o);
    vf_storeu(even, e);
    vf_storeu(odd, o);
}

static void prefetch(const void *p)
{
    prefetch_l2(p);
    prefetch_l1(p);
}

const simd_layer_ops TABLE_NAME(MHA_SIMD_ISA) = {
    .lanes = VF_LANES,
    .exp_ulp = SIMD_EXP_ULP,
    .exp2_ulp = SIMD_EXP2_ULP,
    .tanh_ulp = SIMD_TANH_ULP,
    .binary = binary,
    .unary = unary,
    .fmadd = fmadd,
    .load_store_n = load_store_n,
    .transpose = transpose,
    .reduce_lanes = reduce_lanes,
    .swap_lanes = swap_lanes,
    .mask = mask,
    .load16 = load16,
    .store16 = store16,
    .load_q8 = load_q8,
    .set1_f16 = set1_f16,
    .load_bf16_pair = load_bf16_pair,
    .prefetch = prefetch,
};
