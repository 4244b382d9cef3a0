/* CPU feature detection. x86: AVX2 and FMA both required, and the OS must save
 * YMM state (OSXSAVE set and XCR0 bits 1 and 2). AArch64: NEON is architectural. */
#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int x86_has_avx2_fma(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    const int fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1;
    if (!(fma && osxsave && avx))
        return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6) != 6)
        return 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ebx >> 5) & 1;
}
#endif

int mha_cpu_supports(mha_isa isa)
{
    switch (isa) {
    case MHA_ISA_SCALAR:
        return 1;
    case MHA_ISA_AVX2:
#if defined(__x86_64__) || defined(__i386__)
        return x86_has_avx2_fma();
#else
        return 0;
#endif
    case MHA_ISA_NEON:
#if defined(__aarch64__)
        return 1;
#else
        return 0;
#endif
    }
    return 0;
}
