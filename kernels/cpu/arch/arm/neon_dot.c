/* aarch64 build with NEON + the ARMv8.2 dot product (SDOT: four int8 products summed into an
 * int32 lane), chosen at run time where the OS reports it (arch/arm/features.h). */
#include "common.h"
#ifdef TQ_HAVE_NEON_VARIANTS
#if defined(__GNUC__) && !defined(__clang__)
/* GCC 12's arm_neon.h defines vdotq_s32 for arch=armv8.2-a+dotprod and inlines it only into
 * functions of that arch or above (dotprod is an ARMv8.2 feature: a CPU that has it is v8.2+) */
#pragma GCC target("arch=armv8.2-a+dotprod")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#ifndef __ARM_FEATURE_DOTPROD /* clang < 16's arm_neon.h declares vdotq_s32 only under it; the */
#define __ARM_FEATURE_DOTPROD 1 /* pragma above gives its functions the target they need */
#endif
#endif
#define TQ_TARGET_NEON 1
#define TQ_TARGET_DOTPROD 1 /* clang's attribute pragma does not define __ARM_FEATURE_DOTPROD */
#define TQ_SUFFIX neondot
#define TQ_VARIANT_NAME "neondot"
#include "kernels.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
