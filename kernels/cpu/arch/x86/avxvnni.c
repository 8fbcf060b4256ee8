/* x86-64 build with AVX2 + FMA + F16C + AVX-VNNI: Intel client CPUs from Alder Lake on (and AMD
 * Zen 5) that have VNNI's u8 x s8 dot instruction in its VEX-encoded, 256-bit form but no
 * AVX-512. The AVX2 kernels, with vpdpbusd / vpdpwssd where they would multiply then add pairs;
 * no 512-bit vector and no EVEX encoding anywhere (tests/kernels/test_cpu_probe.py disassembles it). */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma,f16c,bmi2,avxvnni")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2,avxvnni"))), apply_to = function)
#endif
#if defined(__GNUC__) || defined(__clang__) /* MSVC: not selected at run time (generic) */
#define TQ_TARGET_AVX2 1
#define TQ_TARGET_AVXVNNI 1
#endif
#define TQ_TARGET_FEATURES "avx2,fma,f16c,bmi2,avxvnni" /* = the pragma's list (tests/kernels/test_cpu_probe.py) */
#define TQ_SUFFIX avxvnni
#define TQ_VARIANT_NAME "avxvnni"
#define TQ_VEC_FLOATS 8 /* the element-wise ops' vector width (vec.inc) */
#include "kernels.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
