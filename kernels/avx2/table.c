#include "internal.h"

const mha_kernels mha_kernels_avx2 = {
    .isa = MHA_ISA_AVX2,
    .gemm_mr = 6,
    .gemm_nr = 16,
    .gemm_tile = mha_gemm_6x16__avx2,
    .attn_block_rows = 96,
    .attn_block = mha_attn_block__avx2,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__avx2,
    .transpose = mha_transpose__avx2,
};
