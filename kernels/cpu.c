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
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
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

/* The text of cache index i's file `name` of CPU 0 in sysfs, "" when absent. */
static void cache_text(int i, const char *name, char *text, size_t size)
{
    char path[80];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, name);
    const int fd = open(path, O_RDONLY);
    const ssize_t got = fd < 0 ? 0 : read(fd, text, size - 1);
    if (fd >= 0)
        close(fd);
    text[got > 0 ? got : 0] = 0;
}

/* Bytes of the L3 that CPU 0 shares, from sysfs; 0 when sysfs does not say (a
 * virtual machine's sysconf may give the whole socket's: 64 MiB on an EPYC whose
 * 2 vCPUs share 8). */
static int64_t sysfs_l3(void)
{
    for (int i = 0; i < 8; i++) {
        char text[32], level[8];
        cache_text(i, "size", text, sizeof text);
        if (!text[0])
            break;
        char *unit;
        const long n = strtol(text, &unit, 10); /* "32768K" */
        cache_text(i, "level", level, sizeof level);
        if (n > 0 && level[0] == '3')
            return (int64_t)n << (*unit == 'K' ? 10 : *unit == 'M' ? 20 : 0);
    }
    return 0;
}

/* The L3 that CPU 0 shares: from sysfs, else sysconf, else 8 MiB. Read once; racing
 * first calls read the same size. */
int64_t mha_cpu_l3_bytes(void)
{
    static _Atomic int64_t l3_bytes;
    int64_t n = atomic_load_explicit(&l3_bytes, memory_order_relaxed);
    if (n)
        return n;
    n = sysfs_l3();
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (n <= 0)
        n = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    if (n <= 0)
        n = (int64_t)8 << 20;
    atomic_store_explicit(&l3_bytes, n, memory_order_relaxed);
    return n;
}
