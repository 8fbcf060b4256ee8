/* What an x86-64 CPU and its OS let us execute, asked once with cpuid and xgetbv: the one probe
 * that decides between kernel variants. A variant's table carries its compile target (`target`,
 * the same feature list as the `#pragma GCC target` of its source file; a test holds the two
 * equal), and the variant runs only when every feature in that list is answered yes here, so a
 * CPU without, say, BMI2 or AVX512DQ never reaches an instruction it lacks (SIGILL). */
#ifndef TQ_X86_FEATURES_H
#define TQ_X86_FEATURES_H

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdint.h>
#include <string.h>

/* XCR0: the register state the OS saves on a context switch (AVX: XMM+YMM; AVX-512: + opmask,
 * ZMM_Hi256, Hi16_ZMM). Without it the instructions fault even where cpuid lists them. */
#define TQ_XCR0_YMM 0x06u
#define TQ_XCR0_ZMM 0xE6u

static inline uint64_t tq_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static inline uint64_t tq_x86_xgetbv_cached(void) {
    static uint64_t xcr0 = UINT64_MAX;
    if (xcr0 == UINT64_MAX) xcr0 = tq_xgetbv0(); /* read once; only called after OSXSAVE is seen */
    return xcr0;
}

typedef struct {
    const char *name; /* as GCC's target() spells it */
    unsigned leaf, subleaf;
    int reg; /* 0 eax, 1 ebx, 2 ecx, 3 edx */
    int bit;
    unsigned xcr0; /* OS state it needs (0: none) */
} tq_x86_feature;

static const tq_x86_feature tq_x86_feature_table[] = {
    {"sse4.2", 1, 0, 2, 20, 0},
    {"popcnt", 1, 0, 2, 23, 0},
    {"fma", 1, 0, 2, 12, TQ_XCR0_YMM},
    {"f16c", 1, 0, 2, 29, TQ_XCR0_YMM},
    {"avx", 1, 0, 2, 28, TQ_XCR0_YMM},
    {"bmi", 7, 0, 1, 3, 0},
    {"avx2", 7, 0, 1, 5, TQ_XCR0_YMM},
    {"bmi2", 7, 0, 1, 8, 0},
    {"avx512f", 7, 0, 1, 16, TQ_XCR0_ZMM},
    {"avx512dq", 7, 0, 1, 17, TQ_XCR0_ZMM},
    {"avx512bw", 7, 0, 1, 30, TQ_XCR0_ZMM},
    {"avx512vl", 7, 0, 1, 31, TQ_XCR0_ZMM},
    {"avx512vnni", 7, 0, 2, 11, TQ_XCR0_ZMM},
    {"avxvnni", 7, 1, 0, 4, TQ_XCR0_YMM},
    {"avx512bf16", 7, 1, 0, 5, TQ_XCR0_ZMM},
    {NULL, 0, 0, 0, 0, 0},
};

/* 1: the CPU has `name` and the OS saves the state it needs; 0: no, or a name not in the table
 * (an unknown feature is refused: running it would be a guess). */
static inline int tq_x86_has(const char *name, size_t len) {
    for (const tq_x86_feature *f = tq_x86_feature_table; f->name; ++f) {
        if (strlen(f->name) != len || strncmp(f->name, name, len) != 0) continue;
        unsigned r[4] = {0, 0, 0, 0};
        if (!__get_cpuid_count(f->leaf, f->subleaf, &r[0], &r[1], &r[2], &r[3])) return 0;
        if (!((r[f->reg] >> f->bit) & 1u)) return 0;
        if (f->xcr0) {
            unsigned a, b, c, d;
            if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return 0; /* OSXSAVE */
            if ((tq_x86_xgetbv_cached() & f->xcr0) != f->xcr0) return 0;
        }
        return 1;
    }
    return 0;
}

/* every feature of a comma-separated target list ("avx2,fma,f16c,bmi2") */
static inline int tq_x86_has_all(const char *list) {
    while (*list) {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        if (!tq_x86_has(list, len)) return 0;
        list += len + (end != NULL);
    }
    return 1;
}
#endif

#endif
