/* Every parallel loop of the library goes through mha_parallel_for: OpenMP by
 * default, the caller's pool after mha_set_parallel_for. Work items never
 * depend on which thread runs them, so results are bitwise the same either way.
 * Per-item scratch comes from an mha_scratch allocated before any output is
 * written: one slot per thread that may run items at once. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

static _Atomic(mha_parallel_for_fn) hook_fn;
static _Atomic(void *) hook_pool;

void mha_set_parallel_for(mha_parallel_for_fn pfor, void *pool)
{
    atomic_store_explicit(&hook_pool, pool, memory_order_relaxed);
    atomic_store_explicit(&hook_fn, pfor, memory_order_release);
}

void mha_parallel_for(int64_t n, void (*fn)(void *arg, int64_t i), void *arg)
{
    const mha_parallel_for_fn pfor = atomic_load_explicit(&hook_fn, memory_order_acquire);
    if (n <= 1) {
        if (n == 1)
            fn(arg, 0);
    } else if (pfor) {
        pfor(atomic_load_explicit(&hook_pool, memory_order_relaxed), n, fn, arg);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++)
            fn(arg, i);
    }
}

int64_t mha_parallel_width(void)
{
    if (atomic_load_explicit(&hook_fn, memory_order_acquire)) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        return cpus > 0 ? cpus : 1;
    }
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Slots that may be in use at once for `items` items, at most `cap`. */
static int32_t scratch_slots(int64_t items, int64_t cap)
{
    int64_t slots = mha_parallel_width();
    slots = slots < items ? slots : items;
    slots = slots < cap ? slots : cap;
    slots = slots < MHA_SCRATCH_SLOTS_MAX ? slots : MHA_SCRATCH_SLOTS_MAX;
    return (int32_t)(slots > 0 ? slots : 1);
}

static void scratch_clear(mha_scratch *s)
{
    for (int32_t w = 0; w < MHA_SCRATCH_SLOTS_MAX / 64; w++)
        atomic_init(&s->busy[w], 0);
}

/* One freed scratch block of at most KEEP_BYTES is kept for the next call, so that
 * a small call does not allocate and free its scratch every time. A block starts
 * with its usable size, then HEAD bytes later its slots. */
enum { KEEP_BYTES = 4 << 20, HEAD = 64 };
static _Atomic(char *) kept;

static size_t block_size(const char *block)
{
    size_t n;
    memcpy(&n, block, sizeof n);
    return n;
}

/* Frees the block, or keeps it (freeing the one kept before) when small enough. */
static void block_release(char *block)
{
    if (block && block_size(block) <= KEEP_BYTES)
        block = atomic_exchange_explicit(&kept, block, memory_order_acq_rel);
    free(block);
}

mha_status mha_scratch_init(mha_scratch *s, size_t bytes, int64_t items)
{
    s->per = (bytes + 63) / 64 * 64;
    s->slots = scratch_slots(items, MHA_SCRATCH_SLOTS_MAX);
    s->owned = 1;
    scratch_clear(s);
    s->base = NULL;
    if (s->per == 0)
        return MHA_OK;
    const size_t need = s->per * (size_t)s->slots;
    char *block = atomic_exchange_explicit(&kept, NULL, memory_order_acq_rel);
    if (block && block_size(block) < need) {
        free(block);
        block = NULL;
    }
    if (!block) {
        block = aligned_alloc(64, HEAD + need);
        if (!block)
            return MHA_ERR_NOMEM;
        memcpy(block, &need, sizeof need);
    }
    s->base = block + HEAD;
    return MHA_OK;
}

void mha_scratch_place(mha_scratch *s, size_t bytes, int64_t items, void *mem, size_t mem_bytes)
{
    s->per = (bytes + 63) / 64 * 64;
    s->slots = scratch_slots(items, s->per ? (int64_t)(mem_bytes / s->per) : MHA_SCRATCH_SLOTS_MAX);
    s->owned = 0;
    scratch_clear(s);
    s->base = s->per ? mem : NULL;
}

void *mha_scratch_take(mha_scratch *s)
{
    if (!s->base)
        return NULL;
    for (;;) {
        for (int32_t w = 0; w * 64 < s->slots; w++) {
            const int32_t n = s->slots - w * 64 < 64 ? s->slots - w * 64 : 64;
            uint64_t busy = atomic_load_explicit(&s->busy[w], memory_order_relaxed);
            for (int32_t i = 0; i < n; i++) {
                const uint64_t bit = UINT64_C(1) << i;
                if (busy & bit)
                    continue;
                if (atomic_compare_exchange_weak_explicit(&s->busy[w], &busy, busy | bit,
                                                          memory_order_acquire, memory_order_relaxed))
                    return s->base + s->per * (size_t)(w * 64 + i);
                i = -1; /* busy was reloaded: scan the word again */
            }
        }
        sched_yield(); /* more workers than slots: one finishes soon */
    }
}

void mha_scratch_give(mha_scratch *s, void *slot)
{
    if (!slot)
        return;
    const size_t i = (size_t)((char *)slot - s->base) / s->per;
    atomic_fetch_and_explicit(&s->busy[i / 64], ~(UINT64_C(1) << i % 64), memory_order_release);
}

void mha_scratch_free(mha_scratch *s)
{
    if (s->owned && s->base)
        block_release(s->base - HEAD);
    s->base = NULL;
}
