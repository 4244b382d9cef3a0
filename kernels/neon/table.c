#include "internal.h"

enum { MR = 8, NR = 12, ATTN_ROWS = 96 };
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
    .attn_serial_flops = 1 << 16,
    .attn_scratch_bytes = mha_attn_scratch_bytes__neon,
    .attn_block = mha_attn_block__neon,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__neon,
    .transpose = mha_transpose__neon,
    .convert = mha_convert__neon,
};
