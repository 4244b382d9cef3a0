/* GEMM driver: C = A W^T + bias over packed W, tiled for the kernel table's
 * microkernel, with an epilogue that adds the bias and scatters each tile to its
 * segment's destination (row-major or head-major). Every element is computed by
 * one thread in a k order fixed by the shapes alone, so the result is bitwise
 * the same for any thread count. */
#include "internal.h"

/* Writes a tile to its segment's destination: the first k block stores bias + tile,
 * later blocks add their tile. Offsets step through rows and columns, so a tile costs
 * two divisions; columns that stay inside one block (a head) are contiguous. A
 * 16-bit destination (one k block) takes each row's bias + tile in runs of
 * contiguous columns through the table's convert. */
static void gemm_epilogue(const mha_kernels *kt, const mha_gemm_seg *s, int64_t m0, int32_t mr,
                          int32_t c0, int32_t nc, int32_t nr, const float *tile, int first)
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
        const int64_t row_at = b * s->batch_stride + (int64_t)r * s->row_stride;
        const float *t = tile + (size_t)i * nr;
        if (s->dst_type != MHA_F32) {
            float vals[MHA_GEMM_TILE_MAX];
            for (int32_t j = 0; j < nc; j++)
                vals[j] = bias ? bias[j] + t[j] : t[j];
            uint16_t *dst = (uint16_t *)s->dst + row_at;
            for (int32_t j = 0, j1; j < nc; j = j1) {
                for (j1 = j + 1; j1 < nc && coff[j1] == coff[j] + (j1 - j); j1++)
                    ;
                kt->convert(s->dst_type, dst + coff[j], MHA_F32, vals + j, j1 - j);
            }
        } else if (contiguous) {
            float *d = (float *)s->dst + row_at + coff[0];
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
            float *row = (float *)s->dst + row_at;
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

/* One GEMM call: what every work item reads. */
typedef struct gemm_call {
    const mha_kernels *kt;
    int64_t m, mc, groups, group, panels, panel_bytes;
    int32_t k, kc;
    const float *a;
    int64_t lda;
    const mha_gemm_seg *segs;
    int64_t panel_start[MHA_GEMM_SEGS_MAX + 1]; /* panel_start[s]: the first panel of segment s */
} gemm_call;

/* Work item: about mc rows of A times `group` panels of W. */
static void gemm_item(void *arg, int64_t item)
{
    const gemm_call *c = arg;
    const int32_t mr = c->kt->gemm_mr, nr = c->kt->gemm_nr, k = c->k;
    float tile[MHA_GEMM_TILE_MAX];
    const int64_t m_begin = item / c->groups * c->mc;
    const int64_t m_end = m_begin + c->mc < c->m ? m_begin + c->mc : c->m;
    const int64_t p_begin = item % c->groups * c->group;
    const int64_t p_end = p_begin + c->group < c->panels ? p_begin + c->group : c->panels;
    for (int32_t k0 = 0; k0 < k; k0 += c->kc) {
        const int32_t kcur = k - k0 < c->kc ? k - k0 : c->kc;
        /* Each row tile of A (mr x kc) stays in L1 while the item's W panels
           (gemm_w_bytes, in L2) stream past it. */
        for (int64_t m0 = m_begin; m0 < m_end; m0 += mr) {
            const int32_t mcur = (int32_t)(m_end - m0 < mr ? m_end - m0 : mr);
            int s = 0;
            for (int64_t p = p_begin; p < p_end; p++) {
                while (p >= c->panel_start[s + 1])
                    s++;
                const mha_gemm_seg *seg = &c->segs[s];
                const int32_t c0 = (int32_t)(p - c->panel_start[s]) * nr;
                const int32_t nc = seg->n - c0 < nr ? seg->n - c0 : nr;
                const float *w = seg->w + (size_t)(c0 / nr) * (size_t)c->panel_bytes / sizeof(float)
                                 + (size_t)k0 * nr;
                c->kt->gemm_tile(mcur, kcur, c->a + m0 * c->lda + k0, c->lda, w, tile);
                gemm_epilogue(c->kt, seg, m0, mcur, c0, nc, nr, tile, k0 == 0);
            }
        }
    }
}

void mha_gemm_run(const mha_kernels *kt, int64_t m, int32_t k, const float *a, int64_t lda,
                  const mha_gemm_seg *segs, int nsegs)
{
    if (m <= 0 || nsegs < 1 || nsegs > MHA_GEMM_SEGS_MAX)
        return;
    const int32_t mr = kt->gemm_mr, nr = kt->gemm_nr;
    gemm_call c = {.kt = kt, .m = m, .k = k, .a = a, .lda = lda, .segs = segs};
    /* Row blocks of about gemm_mc rows, all of nearly equal size so that threads
       share the work evenly, rounded up to whole tiles. */
    const int64_t mparts = (m + kt->gemm_mc - 1) / kt->gemm_mc;
    c.mc = ((m + mparts - 1) / mparts + mr - 1) / mr * mr;
    const int32_t kblocks = (k + kt->gemm_kc_max - 1) / kt->gemm_kc_max;
    c.kc = (k + kblocks - 1) / kblocks;

    for (int s = 0; s < nsegs; s++)
        c.panel_start[s + 1] = c.panel_start[s] + (segs[s].n + nr - 1) / nr;
    c.panels = c.panel_start[nsegs];
    c.panel_bytes = (int64_t)k * nr * (int64_t)sizeof(float);
    c.group = c.panel_bytes >= kt->gemm_w_bytes ? 1 : kt->gemm_w_bytes / c.panel_bytes;
    c.groups = (c.panels + c.group - 1) / c.group;
    mha_parallel_for((m + c.mc - 1) / c.mc * c.groups, gemm_item, &c);
}
