/* The machine's measured peak, per ISA, on the OpenMP threads the benchmarks use.
 *
 * Each mha_peak_fma__<isa>, one per ISA built (MHA_ISA_BUILT of isa_list.h),
 * runs `iters` iterations of a loop of independent multiply-add chains on every
 * OpenMP thread and returns the number of floating-point operations it
 * performed over all threads (a multiply-add counts 2). The caller times the
 * call: FLOP / seconds is the FMA peak of that ISA for the thread count; the
 * best of them (the widest FMA) is the ceiling that "% of peak" divides by.
 *
 * mha_peak_memcpy splits a memcpy of `bytes` bytes from src to dst across the
 * OpenMP threads and returns the bytes moved: 2 * bytes (each byte is read once
 * and written once), the convention the head transpose's bytes/s also uses.
 *
 * Each mha_peak_read__<isa> reads k and v, `slabs` slabs of `slab_floats`
 * floats each, with that ISA's widest loads summed into independent
 * accumulators, one OpenMP `parallel for` over the slabs (static schedule), and
 * returns the bytes read (2 * slabs * slab_floats * 4): the plain read of a KV
 * cache [slabs = B*Hkv][Skv][dh] that the decode benchmarks compare with. Slab s
 * is slab order[s] of k and v (order NULL: slab s): a paged cache is read block
 * by block in the order of its block tables, as the attention reads it. */
#ifndef MHA_BENCH_PEAK_H
#define MHA_BENCH_PEAK_H

#include <stddef.h>
#include <stdint.h>

#include "isa_list.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MHA_PEAK_DECLARE_(name, value)                                                            \
    double mha_peak_fma__##name(int64_t iters);                                                   \
    double mha_peak_read__##name(const float *k, const float *v, const int64_t *order,           \
                                 int64_t slabs, int64_t slab_floats);
MHA_ISA_BUILT(MHA_PEAK_DECLARE_)
#undef MHA_PEAK_DECLARE_
double mha_peak_memcpy(void *dst, const void *src, size_t bytes);

/* With an order, the read of a slab asks for the same lines of the next slab of
 * the order as it goes (into L1, a slab ahead): the hardware's prefetchers do not
 * cross from one block into another, and a read as smart as the attention's
 * prefetch is the fair roofline of a paged cache. */
static inline const float *mha_peak_next(const float *base, const int64_t *order, int64_t s,
                                         int64_t slabs, int64_t slab_floats)
{
    return order && s + 1 < slabs ? base + order[s + 1] * slab_floats : NULL;
}

/* The lines of floats [i, i + w) of next, when there is a next slab. */
static inline void mha_peak_ask(const float *next, int64_t i, int64_t w)
{
    for (int64_t l = 0; next && l < w; l += 16)
        __builtin_prefetch(next + i + l);
}
/* Threads that the OpenMP regions above (and libmha's) use: 1 without OpenMP. */
int mha_peak_threads(void);

#ifdef __cplusplus
}
#endif
#endif
