#include "internal.h"

enum { MR = 6, NR = 16, ATTN_ROWS = 96 };
MHA_TABLE_LIMITS(MR, NR, ATTN_ROWS);

const mha_kernels mha_kernels_avx2 = {
    .isa = MHA_ISA_AVX2,
    .gemm_mr = MR,
    .gemm_nr = NR,
    .gemm_mc = 96,
    .gemm_kc_max = 1024,
    .gemm_w_bytes = 1 << 18,
    .gemm_tile = mha_gemm_6x16__avx2,
    .attn_block_rows = ATTN_ROWS,
    .attn_serial_flops = 1 << 15, /* Zen 1: 33 kFLOP 3.1 us alone, 2.9 on 2 threads */
    .attn_scratch_bytes = mha_attn_scratch_bytes__avx2,
    .attn_block = mha_attn_block__avx2,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__avx2,
    .transpose = mha_transpose__avx2,
    .convert = mha_convert__avx2,
};
