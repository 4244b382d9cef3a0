/* mha-attn-memory: the extra memory of one mha_attention call, as the growth of
 * the process's peak RSS over the buffers it was handed (q, k, v, out are all
 * allocated and touched first). The contract: tiles per thread only, so the
 * growth must not depend on the sequence length.
 *
 *   mha-attn-memory [seq] [heads] [head_dim]     (default 32768 12 64, B = 1)
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "mha.h"

static long peak_kib(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

int main(int argc, char **argv)
{
    const int32_t S = argc > 1 ? atoi(argv[1]) : 32768, H = argc > 2 ? atoi(argv[2]) : 12;
    const int32_t dh = argc > 3 ? atoi(argv[3]) : 64;
    if (S <= 0 || H <= 0 || dh <= 0) {
        fprintf(stderr, "usage: %s [seq] [heads] [head_dim]\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t)H * S * dh;
    float *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = malloc(n * sizeof(float));
        if (!buf[i]) {
            fprintf(stderr, "out of memory\n");
            return 2;
        }
        for (size_t j = 0; j < n; j++)
            buf[i][j] = (float)((j * 2654435761u + (unsigned)i) % 2001) / 1000.0f - 1.0f;
    }
    const long before = peak_kib();
    const mha_attn_dims d = {1, H, H, S, S, dh, 0, MHA_F32};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const mha_mask causal = {.causal = 1};
    mha_status st = mha_attention(&d, buf[0], buf[1], buf[2], 0.125f, &causal, buf[3],
                                  MHA_LAYOUT_BHSD);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const long after = peak_kib();
    printf("mha_attention B=1 H=%d S=%d dh=%d causal on %s: %s in %.1f s\n", H, S, dh,
           mha_isa_name(mha_isa_active()), mha_status_str(st),
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    printf("buffers q, k, v, out: %.1f MiB; peak RSS %.1f MiB before the call, %.1f MiB after: "
           "extra %.2f MiB\n", 4.0 * (double)(n * sizeof(float)) / 1048576.0, before / 1024.0,
           after / 1024.0, (after - before) / 1024.0);
    for (int i = 0; i < 4; i++)
        free(buf[i]);
    return st == MHA_OK ? 0 : 1;
}
