/* AVX-512 FMA-throughput loop, compiled with the avx512 flags of kernels/meson.build only.
 *
 * 16 independent chains a = fma(a, m, c) of 16 floats: an FMA has a latency of
 * 4 cycles on the 2 512-bit ports of server cores (one on some client cores),
 * so 8 chains in flight saturate them and 16 leave margin for a latency of up
 * to 8; 16 plus the two constants fit in the 32 ZMM registers. Each vfmadd is
 * 16 lanes x 2 FLOP. */
#include <immintrin.h>

#include "peak.h"

extern volatile float mha_peak_sink;

#define CHAINS 16

double mha_peak_fma__avx512(int64_t iters)
{
    double flops = 0.0;
    float sink = 0.0f;
#pragma omp parallel reduction(+ : flops, sink)
    {
        const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
        __m512 a[CHAINS];
        for (int j = 0; j < CHAINS; j++)
            a[j] = _mm512_set1_ps(1.0f + (float)j * 0.01f);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++)
                a[j] = _mm512_fmadd_ps(a[j], m, c);
        __m512 s = a[0];
        for (int j = 1; j < CHAINS; j++)
            s = _mm512_add_ps(s, a[j]);
        sink += _mm512_reduce_add_ps(s);
        flops += (double)CHAINS * 16.0 * 2.0 * (double)iters;
    }
    mha_peak_sink = sink;
    return flops;
}

/* 8 accumulators of 16 floats: one 512-byte block (a dh=128 row) per step, 8
 * independent adds in flight behind the 2 loads per cycle. */
double mha_peak_read__avx512(const float *k, const float *v, const int64_t *order,
                             int64_t slabs, int64_t slab_floats)
{
    float sink = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sink)
    for (int64_t s = 0; s < slabs; s++)
        for (int t = 0; t < 2; t++) {
            const float *p = (t ? v : k) + (order ? order[s] : s) * slab_floats;
            const float *next = mha_peak_next(t ? v : k, order, s, slabs, slab_floats);
            __m512 a[8];
            for (int j = 0; j < 8; j++)
                a[j] = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 128 <= slab_floats; i += 128) {
                mha_peak_ask(next, i, 128);
                for (int j = 0; j < 8; j++)
                    a[j] = _mm512_add_ps(a[j], _mm512_loadu_ps(p + i + 16 * j));
            }
            for (; i < slab_floats; i++)
                sink += p[i];
            for (int j = 1; j < 8; j++)
                a[0] = _mm512_add_ps(a[0], a[j]);
            sink += _mm512_reduce_add_ps(a[0]);
        }
    mha_peak_sink = sink;
    return 2.0 * (double)slabs * (double)slab_floats * sizeof(float);
}
