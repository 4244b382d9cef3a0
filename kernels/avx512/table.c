#include "internal.h"

enum { MR = 12, NR = 32, ATTN_ROWS = 96 };
MHA_TABLE_LIMITS(MR, NR, ATTN_ROWS);

const mha_kernels mha_kernels_avx512 = {
    .isa = MHA_ISA_AVX512,
    .gemm_mr = MR,
    .gemm_nr = NR,
    /* A 192-row block (576 KiB at k = 768) and 512 KiB of W share a 2 MiB L2:
       half the re-reads of W of 96 rows and 256 KiB (+2-5%). */
    .gemm_mc = 192,
    .gemm_kc_max = 1024,
    .gemm_w_bytes = 1 << 19,
    .gemm_tile = mha_gemm_12x32__avx512,
    .attn_block_rows = ATTN_ROWS,
    .attn_serial_flops = 1 << 18, /* Zen 5: 131 kFLOP, 1.2 us alone, 1.3-3 us on 2 threads */
    .attn_scratch_bytes = mha_attn_scratch_bytes__avx512,
    .attn_block = mha_attn_block__avx512,
    .transpose_scratch_bytes = mha_transpose_scratch_bytes__avx512,
    .transpose = mha_transpose__avx512,
    .convert = mha_convert__avx512,
};
