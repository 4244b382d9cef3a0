/* Scalar FMA-throughput loop, plain read and memcpy bandwidth, compiled plain (no
 * ISA flags, auto-vectorization off) so the scalar peak is that of one float per
 * instruction.
 *
 * 12 independent chains a = a*m + c: on x86-64 without -mfma each step is a
 * mulss and an addss, on AArch64 a fmadd; with latencies of 3 to 5 cycles and
 * 2 ports, 12 chains keep every port busy. m slightly below 1 and a small c
 * keep the values bounded and normal (no overflow, no denormal slowdown). */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "peak.h"

/* Read after the loop so the compiler must compute every chain. */
volatile float mha_peak_sink;

#define CHAINS 12

double mha_peak_fma__scalar(int64_t iters)
{
    double flops = 0.0;
    float sink = 0.0f;
#pragma omp parallel reduction(+ : flops, sink)
    {
        float a[CHAINS];
        for (int j = 0; j < CHAINS; j++)
            a[j] = 1.0f + (float)j * 0.01f;
        const float m = 0.9999f, c = 1e-4f;
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++)
                a[j] = a[j] * m + c;
        for (int j = 0; j < CHAINS; j++)
            sink += a[j];
        flops += 2.0 * CHAINS * (double)iters;
    }
    mha_peak_sink = sink;
    return flops;
}

/* 8 scalar accumulators: one float per load, the read of a CPU without SIMD. */
double mha_peak_read__scalar(const float *k, const float *v, const int64_t *order,
                             int64_t slabs, int64_t slab_floats)
{
    float sink = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sink)
    for (int64_t s = 0; s < slabs; s++)
        for (int t = 0; t < 2; t++) {
            const float *p = (t ? v : k) + (order ? order[s] : s) * slab_floats;
            const float *next = mha_peak_next(t ? v : k, order, s, slabs, slab_floats);
            float a[8] = {0};
            int64_t i = 0;
            for (; i + 8 <= slab_floats; i += 8) {
                mha_peak_ask(next, i, 8);
                for (int j = 0; j < 8; j++)
                    a[j] += p[i + j];
            }
            for (; i < slab_floats; i++)
                a[0] += p[i];
            for (int j = 0; j < 8; j++)
                sink += a[j];
        }
    mha_peak_sink = sink;
    return 2.0 * (double)slabs * (double)slab_floats * sizeof(float);
}

double mha_peak_memcpy(void *dst, const void *src, size_t bytes)
{
#pragma omp parallel
    {
        size_t t = 0, nt = 1;
#ifdef _OPENMP
        t = (size_t)omp_get_thread_num();
        nt = (size_t)omp_get_num_threads();
#endif
        /* Chunks of whole 64-byte lines, the last thread takes the remainder. */
        size_t chunk = bytes / nt / 64 * 64;
        size_t begin = t * chunk, len = t + 1 == nt ? bytes - begin : chunk;
        memcpy((char *)dst + begin, (const char *)src + begin, len);
    }
    return 2.0 * (double)bytes;
}

int mha_peak_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
