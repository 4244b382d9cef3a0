/* The SIMD layer of one ISA (kernels/<isa>/simd.h and the shared kernels/simd/
 * math), wrapped over arrays so that a harness built without that ISA's flags can
 * test it: tests/simd_layer.c is compiled once per ISA of the list with its flags,
 * into the table simd_layer_<isa>. Every array function runs whole vectors, then
 * one vf_loadu_n / vf_storeu_n tail, so any n exercises the masked lanes. */
#ifndef MHA_TESTS_SIMD_LAYER_H
#define MHA_TESTS_SIMD_LAYER_H

#include <stdint.h>

typedef enum simd_binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_COPYSIGN, OP_SELECT_LT, OP_SELECT_EQ, OP_BINOPS } simd_binop;
typedef enum simd_unop { OP_ABS, OP_ROUND, OP_POW2I, OP_EXP, OP_EXP2, OP_TANH, OP_UNOPS } simd_unop;

typedef struct simd_layer_ops {
    int32_t lanes;
    int32_t exp_ulp, exp2_ulp, tanh_ulp; /* the bounds simd/math.h states */
    /* y = op(a, b) element-wise; OP_SELECT_LT is a < b ? a : b, OP_SELECT_EQ
       a == b ? a : b (through vf_lt / vf_eq and vf_select). */
    void (*binary)(simd_binop op, const float *a, const float *b, float *y, int64_t n);
    void (*unary)(simd_unop op, const float *x, float *y, int64_t n);
    void (*fmadd)(const float *a, const float *b, const float *c, float *y, int64_t n);
    /* y[0..lanes) = vf_loadu_n(p, n) stored whole (masked lanes must read as 0);
       then vf_storeu_n(dst, n, that vector). */
    void (*load_store_n)(const float *p, int32_t n, float *y, float *dst);
    /* m: lanes x lanes, row-major, transposed in place by vf_transpose. */
    void (*transpose)(float *m);
    /* y[i] = vf_reduce_lanes of the lanes vectors a[i*lanes ..]. */
    void (*reduce_lanes)(const float *a, float *y);
    /* y = vf_swap_lanes(x, s) for a power of two s < lanes. */
    void (*swap_lanes)(const float *x, int s, float *y);
    /* The lane mask m of op over ints k[0..lanes): 0 vi_gt(k, b), 1 vm_or(vi_gt(k, b),
       vi_gt(k, b2)), 2 vm_andnot(vi_gt(k, b), vi_gt(k, b2)), 3 vm_none(); returned
       as bit i = lane i (read through vf_select), bit 30 = vm_all(m), bit 31 =
       vm_empty(m). */
    uint32_t (*mask)(int op, const int32_t *k, int32_t b, int32_t b2);
    /* The element types' conversions of the layer (simd/convert.h): n values of type
       t (MHA_F16 or MHA_BF16) at p to floats y, floats x to n values of type t at p,
       and VF_LANES int8 values times d. */
    void (*load16)(int t, const uint16_t *p, float *y, int64_t n);
    void (*store16)(int t, const float *x, uint16_t *p, int64_t n);
    void (*load_q8)(const int8_t *p, float d, float *y);
    /* vf_set1_f16: the binary16 value h in every lane of y[0..lanes). */
    void (*set1_f16)(uint16_t h, float *y);
    /* vf_load_bf16_pair: 2 x lanes bfloat16 values at p, the even ones to even[0..lanes)
       and the odd ones to odd[0..lanes). */
    void (*load_bf16_pair)(const uint16_t *p, float *even, float *odd);
    /* Touches the cache line of p (prefetch_l2, prefetch_l1): must not fault or change memory. */
    void (*prefetch)(const void *p);
} simd_layer_ops;

#endif
