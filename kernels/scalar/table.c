#include "internal.h"

enum { MR = 1, NR = 1, ATTN_ROWS = 16 };
MHA_TABLE_LIMITS(MR, NR, ATTN_ROWS);

const mha_kernels mha_kernels_scalar = {
    .isa = MHA_ISA_SCALAR,
    .gemm_mr = MR,
    .gemm_nr = NR,
    .gemm_mc = 96,
    .gemm_kc_max = 1024,
    .gemm_w_bytes = 1 << 18,
    .gemm_tile = mha_gemm_1x1__scalar,
    .attn_block_rows = ATTN_ROWS,
    .attn_serial_flops = 0, /* the reference, 10-30x slower a FLOP, keeps its threads */
    .attn_block = mha_attn_block__scalar,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__scalar,
    .transpose = mha_transpose__scalar,
    .convert = mha_convert__scalar,
};
