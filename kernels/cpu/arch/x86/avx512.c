/* x86-64 build with AVX2 + FMA + F16C + AVX-512 (F, BW, VL) + VNNI: the same kernels, with
 * VNNI's u8 x s8 dot instruction where a tile sums int8 products straight into int32. */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), apply_to = function)
#endif
#if defined(__GNUC__) || defined(__clang__) /* MSVC: not selected at run time (generic) */
#define TQ_TARGET_AVX2 1
#define TQ_TARGET_VNNI 1
#endif
#define TQ_TARGET_FEATURES "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni" /* = the pragma's */
#define TQ_SUFFIX avx512
#define TQ_VARIANT_NAME "avx512vnni"
#define TQ_VEC_FLOATS 16 /* the element-wise ops' vector width (vec.inc) */
#include "kernels.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
