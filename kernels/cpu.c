/* CPU feature detection. x86: AVX2 needs AVX2 and FMA with YMM state saved by
 * the OS (OSXSAVE, XCR0 bits 1 and 2); AVX-512 needs F, BW, DQ and VL plus FMA,
 * with opmask and ZMM state saved too (XCR0 bits 5, 6 and 7). AArch64: NEON is
 * architectural. */
#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* CPUID.7.0:EBX bits of AVX2 and of AVX-512 F, DQ, BW, VL. */
#define LEAF7_AVX2 (1u << 5)
#define LEAF7_AVX512 (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31)

/* Nonzero when FMA and AVX are there, the OS saves the states of xcr0_bits,
 * and leaf 7's EBX has every bit of leaf7_ebx. */
static int x86_has(unsigned xcr0_bits, unsigned leaf7_ebx)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    const int fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1;
    if (!(fma && osxsave && avx))
        return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & xcr0_bits) != xcr0_bits)
        return 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ebx & leaf7_ebx) == leaf7_ebx;
}
#endif

int mha_cpu_supports(mha_isa isa)
{
    switch (isa) {
    case MHA_ISA_SCALAR:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case MHA_ISA_AVX2:
        return x86_has(0x6, LEAF7_AVX2);
    case MHA_ISA_AVX512:
        return x86_has(0xe6, LEAF7_AVX512);
#endif
#if defined(__aarch64__)
    case MHA_ISA_NEON:
        return 1;
#endif
    default:
        return 0;
    }
}
