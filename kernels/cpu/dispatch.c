/* Which kernel variant runs: the one place that decides (x86: the cpuid probe against each
 * variant's compile target; aarch64: the OS's hwcaps), at import or when asked. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#ifdef TQ_HAVE_NEON_VARIANTS
#include "arch/arm/features.h"
#endif
#include "arch/x86/features.h"

const tq_kernels *K = &tq_kernels_generic;

/* ------------------------------------------------------------------------------ variants */
int variant_supported(const tq_kernels *k) {
    if (k == &tq_kernels_generic) return 1;
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    /* the one x86 probe: every feature the variant is compiled for, and the OS's state for it */
    if (k->target) return tq_x86_has_all(k->target);
#endif
#ifdef TQ_HAVE_NEON_VARIANTS
    if (k == &tq_kernels_neon) return 1; /* Advanced SIMD is part of every aarch64 CPU */
    if (k == &tq_kernels_neondot) return tq_arm_has_dotprod();
#endif
    return 0;
}

const tq_kernels *all_variants[] = {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    &tq_kernels_avx512, &tq_kernels_avxvnni, &tq_kernels_avx2,
#endif
#ifdef TQ_HAVE_NEON_VARIANTS
    &tq_kernels_neondot, &tq_kernels_neon,
#endif
    &tq_kernels_generic, NULL};

int select_variant(const char *name) {
    for (int i = 0; all_variants[i]; ++i) {
        if (strcmp(all_variants[i]->name, name) == 0 && variant_supported(all_variants[i])) {
            K = all_variants[i];
            return 0;
        }
    }
    return -1;
}

/* the best variant this CPU runs (kernels/cpu_native.py then applies TRAMONTANE_CPU_VARIANT) */
void select_startup_variant(void) {
    for (int i = 0; all_variants[i]; ++i) {
        if (variant_supported(all_variants[i])) {
            K = all_variants[i];
            break;
        }
    }
}

/* the probe's answer for one feature name (x86: cpuid + the OS's saved state; elsewhere 0) */
int cpu_has(const char *name, size_t len) {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    return tq_x86_has(name, len);
#else
    (void)name;
    (void)len;
    return 0;
#endif
}
