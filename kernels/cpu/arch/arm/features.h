/* What an aarch64 CPU offers beyond baseline NEON, asked of the OS (user code cannot read the
 * ID registers portably): decides between the neondot and neon kernel variants. */
#ifndef TQ_ARM_FEATURES_H
#define TQ_ARM_FEATURES_H

#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20) /* the kernel's bit, for older C libraries' headers */
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* 1 when SDOT / UDOT (ARMv8.2 dotprod) may be executed */
static inline int tq_arm_has_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v;
#else
    return 0; /* unknown OS: the plain NEON variant is always safe */
#endif
}

#endif
