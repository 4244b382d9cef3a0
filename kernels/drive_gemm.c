/* GEMM driver: C = A W^T + bias over packed W, tiled for the kernel table's
 * microkernel, with an epilogue that adds the bias and scatters each tile to its
 * segment's destination (row-major or head-major). Every element is computed by
 * one thread in a k order fixed by the shapes alone, so the result is bitwise
 * the same for any thread count. */
#include "internal.h"

void mha_pack_weights(const float *w, int32_t n, int32_t k, int32_t nr, float *packed)
{
    const int32_t panels = (n + nr - 1) / nr;
    for (int32_t p = 0; p < panels; p++) {
        float *dst = packed + (size_t)p * (size_t)k * (size_t)nr;
        for (int32_t kk = 0; kk < k; kk++)
            for (int32_t j = 0; j < nr; j++) {
                int32_t c = p * nr + j;
                dst[(size_t)kk * nr + j] = c < n ? w[(size_t)c * k + kk] : 0.0f;
            }
    }
}

/* Writes a tile to its segment's destination: the first k block stores bias + tile,
 * later blocks add their tile. Offsets step through rows and columns, so a tile costs
 * two divisions; columns that stay inside one block (a head) are contiguous. */
static void gemm_epilogue(const mha_gemm_seg *s, int64_t m0, int32_t mr, int32_t c0, int32_t nc,
                          int32_t nr, const float *tile, int first)
{
    const float *bias = first && s->bias ? s->bias + c0 : NULL;
    int64_t coff[MHA_GEMM_TILE_MAX];
    int32_t blk = c0 / s->cols, cin = c0 % s->cols;
    const int contiguous = cin + nc <= s->cols;
    for (int32_t j = 0; j < nc; j++) {
        coff[j] = (int64_t)blk * s->block_stride + cin;
        if (++cin == s->cols)
            cin = 0, blk++;
    }
    int64_t b = m0 / s->rows;
    int32_t r = (int32_t)(m0 % s->rows);
    for (int32_t i = 0; i < mr; i++) {
        float *row = s->dst + b * s->batch_stride + (int64_t)r * s->row_stride;
        const float *t = tile + (size_t)i * nr;
        if (contiguous) {
            float *d = row + coff[0];
            if (bias)
                for (int32_t j = 0; j < nc; j++)
                    d[j] = bias[j] + t[j];
            else if (first)
                for (int32_t j = 0; j < nc; j++)
                    d[j] = t[j];
            else
                for (int32_t j = 0; j < nc; j++)
                    d[j] += t[j];
        } else {
            if (bias)
                for (int32_t j = 0; j < nc; j++)
                    row[coff[j]] = bias[j] + t[j];
            else if (first)
                for (int32_t j = 0; j < nc; j++)
                    row[coff[j]] = t[j];
            else
                for (int32_t j = 0; j < nc; j++)
                    row[coff[j]] += t[j];
        }
        if (++r == s->rows)
            r = 0, b++;
    }
}

void mha_gemm_run(const mha_kernels *kt, int64_t m, int32_t k, const float *a, int64_t lda,
                  const mha_gemm_seg *segs, int nsegs)
{
    if (m <= 0)
        return;
    const int32_t mr = kt->gemm_mr, nr = kt->gemm_nr;
    /* Row blocks of about gemm_mc rows, all of nearly equal size so that threads
       share the work evenly, rounded up to whole tiles. */
    const int64_t mparts = (m + kt->gemm_mc - 1) / kt->gemm_mc;
    const int64_t mc = ((m + mparts - 1) / mparts + mr - 1) / mr * mr;
    const int32_t kblocks = (k + kt->gemm_kc_max - 1) / kt->gemm_kc_max;
    const int32_t kc = (k + kblocks - 1) / kblocks;

    /* Panels of all segments in one index space: panel_start[s] is the first of segment s. */
    int64_t panel_start[4] = {0};
    for (int s = 0; s < nsegs; s++)
        panel_start[s + 1] = panel_start[s] + (segs[s].n + nr - 1) / nr;
    const int64_t panels = panel_start[nsegs];
    const int64_t panel_bytes = (int64_t)k * nr * (int64_t)sizeof(float);
    const int64_t group = panel_bytes >= kt->gemm_w_bytes ? 1 : kt->gemm_w_bytes / panel_bytes;
    const int64_t groups = (panels + group - 1) / group;
    const int64_t mblocks = (m + mc - 1) / mc;
    const int64_t items = mblocks * groups;

#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < items; item++) {
        float tile[MHA_GEMM_TILE_MAX];
        const int64_t m_begin = item / groups * mc;
        const int64_t m_end = m_begin + mc < m ? m_begin + mc : m;
        const int64_t p_begin = item % groups * group;
        const int64_t p_end = p_begin + group < panels ? p_begin + group : panels;
        for (int32_t k0 = 0; k0 < k; k0 += kc) {
            const int32_t kcur = k - k0 < kc ? k - k0 : kc;
            /* Each row tile of A (mr x kc) stays in L1 while the item's W panels
               (gemm_w_bytes, in L2) stream past it. */
            for (int64_t m0 = m_begin; m0 < m_end; m0 += mr) {
                const int32_t mcur = (int32_t)(m_end - m0 < mr ? m_end - m0 : mr);
                int s = 0;
                for (int64_t p = p_begin; p < p_end; p++) {
                    while (p >= panel_start[s + 1])
                        s++;
                    const mha_gemm_seg *seg = &segs[s];
                    const int32_t c0 = (int32_t)(p - panel_start[s]) * nr;
                    const int32_t nc = seg->n - c0 < nr ? seg->n - c0 : nr;
                    const float *w = seg->w
                                     + (size_t)(c0 / nr) * (size_t)panel_bytes / sizeof(float)
                                     + (size_t)k0 * nr;
                    kt->gemm_tile(mcur, kcur, a + m0 * lda + k0, lda, w, tile);
                    gemm_epilogue(seg, m0, mcur, c0, nc, nr, tile, k0 == 0);
                }
            }
        }
    }
}
