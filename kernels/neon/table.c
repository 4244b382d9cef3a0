#include "internal.h"

const mha_kernels mha_kernels_neon = {
    .isa = MHA_ISA_NEON,
    .gemm_mr = 8,
    .gemm_nr = 12,
    .gemm_tile = mha_gemm_8x12__neon,
    .attn_block_rows = 32,
    .attn_block = mha_attn_block__neon,
    /* The transpose tiles move whole head_dim elements, and AArch64's memcpy
       already uses NEON for them: the reference kernel serves; large matrices
       are moved by the driver's parallel cycle following. */
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__scalar,
    .transpose = mha_transpose__scalar,
};
