/* CPU feature detection, run once: the ISAs this CPU and OS support, as one
 * atomic set (bit isa), so that no call after the first executes CPUID (under
 * a hypervisor each one traps, several microseconds). x86: AVX2 needs AVX2,
 * FMA and F16C with YMM state saved by the OS (OSXSAVE, XCR0 bits 1 and 2);
 * AVX-512 needs F, BW, DQ and VL plus FMA and F16C, with opmask and ZMM state
 * saved too (XCR0 bits 5, 6 and 7); AVX512-BF16 (bf16 dot products) is an
 * extension the avx512 kernels use when present, and so is AMX-BF16 (bf16 tile
 * products) once Linux grants the process its tile state (XCR0 bits 17 and 18, and
 * arch_prctl(ARCH_REQ_XCOMP_PERM), asked here once unless MHA_AMX=0). AArch64: NEON
 * is architectural. */
#define _DEFAULT_SOURCE /* syscall */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#endif

/* The set's bits of AVX512-BF16 and AMX-BF16, above the ISAs' bits (never set
   off x86). */
#define AVX512_BF16 (1u << 30)
#define AMX_BF16 (1u << 29)

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* CPUID.7.0:EBX bits of AVX2 and of AVX-512 F, DQ, BW, VL. */
#define LEAF7_AVX2 (1u << 5)
#define LEAF7_AVX512 (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31)
/* CPUID.7.1:EAX bit of AVX512-BF16. */
#define LEAF7_1_AVX512_BF16 (1u << 5)
/* CPUID.7.0:EDX bits of AMX-BF16 and AMX-TILE; XCR0 bits of the tile config and data. */
#define LEAF7_EDX_AMX_BF16 (1u << 22 | 1u << 24)
#define XCR0_AMX (3u << 17)

/* Linux grants AMX's tile data (XFEATURE_XTILEDATA, 18) per process, once asked:
   the signal frames of the process then grow by its 8 KiB. MHA_AMX=0 does not ask. */
static int amx_permitted(void)
{
    const char *env = getenv("MHA_AMX");
    if (env && strcmp(env, "0") == 0)
        return 0;
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    return 0;
#endif
}

static uint32_t detect(void)
{
    uint32_t set = 1u << MHA_ISA_SCALAR;
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return set;
    const int fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1;
    const int f16c = (ecx >> 29) & 1;
    if (!(fma && osxsave && avx && f16c))
        return set;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return set;
    if ((xcr0_lo & 0x6) == 0x6 && (ebx & LEAF7_AVX2) == LEAF7_AVX2)
        set |= 1u << MHA_ISA_AVX2;
    if ((xcr0_lo & 0xe6) == 0xe6 && (ebx & LEAF7_AVX512) == LEAF7_AVX512) {
        set |= 1u << MHA_ISA_AVX512;
        if ((xcr0_lo & XCR0_AMX) == XCR0_AMX
            && (edx & LEAF7_EDX_AMX_BF16) == LEAF7_EDX_AMX_BF16 && amx_permitted())
            set |= AMX_BF16;
        if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & LEAF7_1_AVX512_BF16))
            set |= AVX512_BF16;
    }
    return set;
}
#elif defined(__aarch64__)
static uint32_t detect(void)
{
    /* An ISA beyond NEON (SVE, SME) would read getauxval(AT_HWCAP) here. */
    return 1u << MHA_ISA_SCALAR | 1u << MHA_ISA_NEON;
}
#else
static uint32_t detect(void)
{
    return 1u << MHA_ISA_SCALAR;
}
#endif

/* Bit 31: detected. Racing first calls detect the same set and store it alike. */
#define DETECTED (1u << 31)
_Static_assert(MHA_ISA_COUNT < 29, "the feature set holds one bit per ISA, then extensions");
static _Atomic uint32_t features;

static uint32_t feature_set(void)
{
    uint32_t set = atomic_load_explicit(&features, memory_order_relaxed);
    if (!set) {
        set = detect() | DETECTED;
        atomic_store_explicit(&features, set, memory_order_relaxed);
    }
    return set;
}

int mha_cpu_supports(mha_isa isa)
{
    return (unsigned)isa < MHA_ISA_COUNT && (feature_set() >> isa & 1u);
}

int mha_cpu_avx512_bf16(void)
{
    return (feature_set() & AVX512_BF16) != 0;
}

int mha_cpu_amx_bf16(void)
{
    return (feature_set() & AMX_BF16) != 0;
}

