/* AVX2+FMA FMA-throughput loop, compiled with -mavx2 -mfma only.
 *
 * 12 independent chains a = fma(a, m, c) of 8 floats: an FMA has a latency of
 * 4 to 5 cycles on 2 ports, so 10 chains in flight saturate them; 12 plus the
 * two constants fit in the 16 YMM registers. Each vfmadd is 8 lanes x 2 FLOP. */
#include <immintrin.h>

#include "peak.h"

extern volatile float mha_peak_sink;

double mha_peak_fma__avx2(int64_t iters)
{
    double flops = 0.0;
    float sink = 0.0f;
#pragma omp parallel reduction(+ : flops, sink)
    {
        const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
        __m256 a0 = _mm256_set1_ps(1.00f), a1 = _mm256_set1_ps(1.01f), a2 = _mm256_set1_ps(1.02f);
        __m256 a3 = _mm256_set1_ps(1.03f), a4 = _mm256_set1_ps(1.04f), a5 = _mm256_set1_ps(1.05f);
        __m256 a6 = _mm256_set1_ps(1.06f), a7 = _mm256_set1_ps(1.07f), a8 = _mm256_set1_ps(1.08f);
        __m256 a9 = _mm256_set1_ps(1.09f), a10 = _mm256_set1_ps(1.10f), a11 = _mm256_set1_ps(1.11f);
        for (int64_t i = 0; i < iters; i++) {
            a0 = _mm256_fmadd_ps(a0, m, c);
            a1 = _mm256_fmadd_ps(a1, m, c);
            a2 = _mm256_fmadd_ps(a2, m, c);
            a3 = _mm256_fmadd_ps(a3, m, c);
            a4 = _mm256_fmadd_ps(a4, m, c);
            a5 = _mm256_fmadd_ps(a5, m, c);
            a6 = _mm256_fmadd_ps(a6, m, c);
            a7 = _mm256_fmadd_ps(a7, m, c);
            a8 = _mm256_fmadd_ps(a8, m, c);
            a9 = _mm256_fmadd_ps(a9, m, c);
            a10 = _mm256_fmadd_ps(a10, m, c);
            a11 = _mm256_fmadd_ps(a11, m, c);
        }
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
        s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
        float lanes[8];
        _mm256_storeu_ps(lanes, s);
        for (int j = 0; j < 8; j++)
            sink += lanes[j];
        flops += 12.0 * 8.0 * 2.0 * (double)iters;
    }
    mha_peak_sink = sink;
    return flops;
}

/* 8 accumulators of 8 floats: one 256-byte block per step, 8 independent adds
 * in flight behind the 2 loads per cycle. */
double mha_peak_read__avx2(const float *k, const float *v, const int64_t *order,
                           int64_t slabs, int64_t slab_floats)
{
    float sink = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sink)
    for (int64_t s = 0; s < slabs; s++)
        for (int t = 0; t < 2; t++) {
            const float *p = (t ? v : k) + (order ? order[s] : s) * slab_floats;
            const float *next = mha_peak_next(t ? v : k, order, s, slabs, slab_floats);
            __m256 a[8];
            for (int j = 0; j < 8; j++)
                a[j] = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i + 64 <= slab_floats; i += 64) {
                mha_peak_ask(next, i, 64);
                for (int j = 0; j < 8; j++)
                    a[j] = _mm256_add_ps(a[j], _mm256_loadu_ps(p + i + 8 * j));
            }
            for (; i < slab_floats; i++)
                sink += p[i];
            for (int j = 1; j < 8; j++)
                a[0] = _mm256_add_ps(a[0], a[j]);
            float lanes[8];
            _mm256_storeu_ps(lanes, a[0]);
            for (int j = 0; j < 8; j++)
                sink += lanes[j];
        }
    mha_peak_sink = sink;
    return 2.0 * (double)slabs * (double)slab_floats * sizeof(float);
}
