#include "internal.h"

const mha_kernels mha_kernels_scalar = {
    .isa = MHA_ISA_SCALAR,
    .gemm_mr = 1,
    .gemm_nr = 1,
    .gemm_tile = mha_gemm_1x1__scalar,
    .attn_block_rows = 16,
    .attn_block = mha_attn_block__scalar,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__scalar,
    .transpose = mha_transpose__scalar,
};
