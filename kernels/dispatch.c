/* Chooses the kernel table once: MHA_ISA if it names an available ISA, else the
 * available ISA of the highest rank in the list (kernels/meson.build). The
 * choice lives in one atomic pointer, so mha_isa_force may race with running
 * calls: each call reads the pointer once and keeps it. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Atomic(const mha_kernels *) active_table;

/* The tables built in, in the list's order. */
#define TABLE_ADDRESS_(name, value) &mha_kernels_##name,
static const mha_kernels *const built_tables[] = {MHA_ISA_BUILT(TABLE_ADDRESS_)};

const mha_kernels *mha_kernels_for(mha_isa isa)
{
    if (!mha_cpu_supports(isa))
        return NULL;
    for (size_t i = 0; i < sizeof built_tables / sizeof *built_tables; i++)
        if (built_tables[i]->isa == isa)
            return built_tables[i];
    return NULL;
}

static const int isa_rank[MHA_ISA_COUNT] = MHA_ISA_RANKS;

static const mha_kernels *initial_table(void)
{
    const char *env = getenv("MHA_ISA");
    for (int i = 0; env && i < MHA_ISA_COUNT; i++)
        if (strcmp(env, mha_isa_name((mha_isa)i)) == 0 && mha_kernels_for((mha_isa)i))
            return mha_kernels_for((mha_isa)i);
    /* The available ISA of the highest rank in the list. */
    const mha_kernels *best = &mha_kernels_scalar;
    for (int i = 0; i < MHA_ISA_COUNT; i++)
        if (mha_kernels_for((mha_isa)i) && isa_rank[i] > isa_rank[best->isa])
            best = mha_kernels_for((mha_isa)i);
    return best;
}

const mha_kernels *mha_kernels_active(void)
{
    const mha_kernels *kt = atomic_load_explicit(&active_table, memory_order_acquire);
    if (kt)
        return kt;
    const mha_kernels *expected = NULL;
    kt = initial_table();
    if (atomic_compare_exchange_strong_explicit(&active_table, &expected, kt,
                                                memory_order_acq_rel, memory_order_acquire))
        return kt;
    return expected;
}

mha_isa mha_isa_active(void)
{
    return mha_kernels_active()->isa;
}

int mha_isa_available(mha_isa isa)
{
    return mha_kernels_for(isa) != NULL;
}

mha_status mha_isa_force(mha_isa isa)
{
    const mha_kernels *kt = mha_kernels_for(isa);
    if (!kt)
        return MHA_ERR_UNSUPPORTED;
    atomic_store_explicit(&active_table, kt, memory_order_release);
    return MHA_OK;
}

int mha_isa_count(void)
{
    return MHA_ISA_COUNT;
}

#define NAME_CASE_(name, value) \
    case value:                 \
        return #name;
const char *mha_isa_name(mha_isa isa)
{
    switch (isa) {
        MHA_ISA_LIST(NAME_CASE_)
    }
    return "unknown";
}
