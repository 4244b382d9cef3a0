#include "internal.h"

enum { MR = 8, NR = 12, ATTN_ROWS = 32 };
MHA_TABLE_LIMITS(MR, NR, ATTN_ROWS);

const mha_kernels mha_kernels_neon = {
    .isa = MHA_ISA_NEON,
    .gemm_mr = MR,
    .gemm_nr = NR,
    .gemm_mc = 96,
    .gemm_kc_max = 1024,
    .gemm_w_bytes = 1 << 18,
    .gemm_tile = mha_gemm_8x12__neon,
    .attn_block_rows = ATTN_ROWS,
    .attn_block = mha_attn_block__neon,
    /* The transpose tiles move whole head_dim elements, and AArch64's memcpy
       already uses NEON for them: the reference kernel serves; large matrices
       are moved by the driver's parallel cycle following. */
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__scalar,
    .transpose = mha_transpose__scalar,
    .exp_array = mha_exp_array__neon,
    .exp_ulp = 1,
    .tanh_array = mha_tanh_array__neon,
    .tanh_ulp = 2,
};
