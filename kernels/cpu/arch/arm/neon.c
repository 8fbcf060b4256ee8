/* aarch64 build with NEON (Advanced SIMD, part of every aarch64 CPU): the vector tiles of
 * arch/arm/tiles.inc with widening multiplies; chosen where the CPU lacks dotprod. */
#include "common.h"
#ifdef TQ_HAVE_NEON_VARIANTS
#define TQ_TARGET_NEON 1
#define TQ_SUFFIX neon
#define TQ_VARIANT_NAME "neon"
#include "kernels.inc"
#endif
