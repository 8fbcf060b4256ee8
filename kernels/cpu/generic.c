/* Portable C build of the kernels (any CPU; NEON on aarch64 where the compiler enables it). */
#define TQ_SUFFIX generic
#define TQ_VARIANT_NAME "generic"
#include "kernels.inc"
