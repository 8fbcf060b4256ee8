/* Repacking, Q4_K -> TQ_Q4_K_R and Q6_K -> TQ_Q6_K_R (the variant's repack[]: the order its tiles
 * read, see arch/x86/repack.inc), rows on the pool; done once per weight. */
#include "runtime.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif

typedef struct {
    tq_repack_fn fn;
    const uint8_t *src;
    size_t src_stride;
    uint8_t *dst;
    size_t dst_stride;
    int n_rows, nb;
} repack_job;

#define REPACK_ROWS 64
static void unit_repack(void *arg, int u) {
    repack_job *J = (repack_job *)arg;
    const int r1 = (u + 1) * REPACK_ROWS < J->n_rows ? (u + 1) * REPACK_ROWS : J->n_rows;
    const int r0 = u * REPACK_ROWS;
    J->fn(J->src + (size_t)r0 * J->src_stride, J->src_stride, r1 - r0, J->nb, J->dst + (size_t)r0 * J->dst_stride,
          J->dst_stride);
}

/* the caller holds the call lock */
void repack_rows(tq_repack_fn fn, const uint8_t *src, size_t src_stride, int n_rows, int nb, uint8_t *dst,
                 size_t dst_stride) {
    repack_job J = {fn, src, src_stride, dst, dst_stride, n_rows, nb};
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    {
        /* decode streams these rows once a token: 2 MiB pages spare the TLB a miss every 4 KiB
         * (before the first write, so the pages are allocated huge; a hint, failures ignored) */
        const uintptr_t huge = (uintptr_t)2 << 20, a = ((uintptr_t)dst + huge - 1) / huge * huge;
        const uintptr_t b = ((uintptr_t)dst + (uintptr_t)dst_stride * (uintptr_t)n_rows) / huge * huge;
        if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
    }
#endif
    pool_for(unit_repack, &J, (n_rows + REPACK_ROWS - 1) / REPACK_ROWS);
}
