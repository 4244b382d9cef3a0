/* NEON FMA-throughput loop (AArch64, where NEON is baseline: no extra flags).
 *
 * 16 independent chains a = a*m + c of 4 floats (vfmaq_f32): an FMA has a
 * latency of 4 cycles on up to 4 ports on wide cores, so 16 chains keep them
 * busy; 16 plus the two constants fit in the 32 vector registers. Each fmla is
 * 4 lanes x 2 FLOP. */
#include <arm_neon.h>

#include "peak.h"

extern volatile float mha_peak_sink;

#define CHAINS 16

double mha_peak_fma__neon(int64_t iters)
{
    double flops = 0.0;
    float sink = 0.0f;
#pragma omp parallel reduction(+ : flops, sink)
    {
        const float32x4_t m = vdupq_n_f32(0.9999f), c = vdupq_n_f32(1e-4f);
        float32x4_t a[CHAINS];
        for (int j = 0; j < CHAINS; j++)
            a[j] = vdupq_n_f32(1.0f + (float)j * 0.01f);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++)
                a[j] = vfmaq_f32(c, a[j], m);
        float32x4_t s = a[0];
        for (int j = 1; j < CHAINS; j++)
            s = vaddq_f32(s, a[j]);
        sink += vaddvq_f32(s);
        flops += (double)CHAINS * 4.0 * 2.0 * (double)iters;
    }
    mha_peak_sink = sink;
    return flops;
}

/* 8 accumulators of 4 floats: one 128-byte block per step, 8 independent adds
 * in flight. */
double mha_peak_read__neon(const float *k, const float *v, const int64_t *order,
                           int64_t slabs, int64_t slab_floats)
{
    float sink = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sink)
    for (int64_t s = 0; s < slabs; s++)
        for (int t = 0; t < 2; t++) {
            const float *p = (t ? v : k) + (order ? order[s] : s) * slab_floats;
            const float *next = mha_peak_next(t ? v : k, order, s, slabs, slab_floats);
            float32x4_t a[8];
            for (int j = 0; j < 8; j++)
                a[j] = vdupq_n_f32(0.0f);
            int64_t i = 0;
            for (; i + 32 <= slab_floats; i += 32) {
                mha_peak_ask(next, i, 32);
                for (int j = 0; j < 8; j++)
                    a[j] = vaddq_f32(a[j], vld1q_f32(p + i + 4 * j));
            }
            for (; i < slab_floats; i++)
                sink += p[i];
            for (int j = 1; j < 8; j++)
                a[0] = vaddq_f32(a[0], a[j]);
            sink += vaddvq_f32(a[0]);
        }
    mha_peak_sink = sink;
    return 2.0 * (double)slabs * (double)slab_floats * sizeof(float);
}
