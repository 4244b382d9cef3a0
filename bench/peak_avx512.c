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
