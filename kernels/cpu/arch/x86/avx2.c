/* x86-64 build with AVX2 + FMA + F16C (chosen at run time when the CPU has them). */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma,f16c,bmi2")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#endif
#if defined(__GNUC__) || defined(__clang__) /* MSVC: not selected at run time (generic) */
#define TQ_TARGET_AVX2 1
#endif
#define TQ_TARGET_FEATURES "avx2,fma,f16c,bmi2" /* = the pragma's list (tests/kernels/test_cpu_probe.py) */
#define TQ_SUFFIX avx2
#define TQ_VARIANT_NAME "avx2"
#define TQ_VEC_FLOATS 8 /* the element-wise ops' vector width (vec.inc) */
#include "kernels.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
