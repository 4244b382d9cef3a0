/* mha-ab: A/B of two builds of libmha in one process, calls interleaved.
 *
 *   mha-ab LIB_A LIB_B [--rounds N] attention B S H HKV DH TYPE [strided]
 *   mha-ab LIB_A LIB_B [--rounds N] decode B S TYPE [flush] [paged BS]
 *   mha-ab LIB_A LIB_B [--rounds N] layer B S
 *
 * LIB_A and LIB_B are shared libraries (libmha.so.0 of two build directories, or two
 * copies of one). Each round times one call of each, in alternating order, on the
 * same inputs, so that both sides see the same machine: on a shared host whose speed
 * drifts by more than the change under test, two processes run one after the other
 * cannot tell a few percent apart. Prints each side's fastest and median call and
 * B/A, the ratio of times (below 1: B is faster).
 *
 * attention: mha_attention_strided, self-attention of S rows, dense [B][H][S][DH], or
 * with `strided` q, k, v and out as [B][S][H][DH] storage. decode: mha_attention_cached,
 * one row per sequence at the end of an S-row cache, H 32, Hkv 8, dh 128 (the cache
 * written by LIB_A's mha_kv_append); `flush` reads 64 MiB between calls, so that K and
 * V come from memory; `paged BS`: the cache in blocks of BS rows ([Hkv][BS][dh] each),
 * shuffled in the pool, as serving engines hand them over. layer: mha_layer_forward
 * of BERT-base (768 wide, 12 heads), self-attention. TYPE: f32, f16, bf16 (decode
 * also q8_0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "mha.h"

typedef struct side {
    mha_status (*attention)(const mha_attn_dims *, const void *, const mha_strides *,
                            const void *, const mha_strides *, const void *,
                            const mha_strides *, float, const mha_mask *, void *,
                            const mha_strides *, float *);
    mha_status (*cached)(const mha_kv_cache *, const int32_t *, const float *, int32_t, int32_t,
                         float, const mha_mask *, float *, mha_layout, float *);
    mha_status (*append)(mha_kv_cache *, const int32_t *, const void *, const void *, int32_t);
    mha_status (*layer_create)(const mha_layer_desc *, mha_layer **);
    mha_status (*forward)(const mha_layer *, const float *, const float *, const float *,
                          int32_t, int32_t, int32_t, const mha_mask *, float *, void *, size_t);
    void (*layer_destroy)(mha_layer *);
    mha_layer *layer;
} side;

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "mha-ab: %s\n", dlerror());
        exit(2);
    }
    return p;
}

static void open_side(const char *path, side *s)
{
    /* RTLD_LOCAL: neither library's symbols enter the global scope, so each one's
       calls bind to its own functions */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "mha-ab: %s\n", dlerror());
        exit(2);
    }
    *(void **)&s->attention = sym(lib, "mha_attention_strided");
    *(void **)&s->cached = sym(lib, "mha_attention_cached");
    *(void **)&s->append = sym(lib, "mha_kv_append");
    *(void **)&s->layer_create = sym(lib, "mha_layer_create");
    *(void **)&s->forward = sym(lib, "mha_layer_forward");
    *(void **)&s->layer_destroy = sym(lib, "mha_layer_destroy");
    s->layer = NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static mha_dtype parse_type(const char *s)
{
    const char *names[] = {"f32", "f16", "bf16", "q8_0"};
    const mha_dtype types[] = {MHA_F32, MHA_F16, MHA_BF16, MHA_Q8_0};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i]))
            return types[i];
    fprintf(stderr, "mha-ab: unknown type %s\n", s);
    exit(2);
}

/* bytes on 64-byte lines, as PyTorch's tensors (malloc puts a large block 16 bytes off
   a line, which a strided view pays on every row) */
static void *line_alloc(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

/* n uniform values in [-0.5, 0.5) of type t (f32, f16 or bf16) */
static void *random_values(size_t n, mha_dtype t)
{
    unsigned char *p = line_alloc(n * (size_t)mha_row_bytes(t, 1));
    if (!p)
        exit(3);
    for (size_t i = 0; i < n; i++) {
        const float x = (float)rand() / (float)RAND_MAX - 0.5f;
        if (t == MHA_F32) {
            memcpy(p + 4 * i, &x, 4);
        } else {
            const uint16_t h = t == MHA_BF16 ? mha_f32_to_bf16(x) : mha_f32_to_f16(x);
            memcpy(p + 2 * i, &h, 2);
        }
    }
    return p;
}

typedef struct job {
    enum { ATTENTION, DECODE, LAYER } kind;
    mha_attn_dims dims;
    mha_strides st;
    int strided, flush;
    void *q, *k, *v, *out;
    mha_kv_cache cache;
    int32_t *lens;
    char *evict;
    size_t evict_bytes;
} job;

static void run(const job *j, side *s)
{
    mha_status st = MHA_OK;
    const mha_strides *l = j->strided ? &j->st : NULL;
    switch (j->kind) {
    case ATTENTION:
        st = s->attention(&j->dims, j->q, l, j->k, l, j->v, l, 0.125f, NULL, j->out, l, NULL);
        break;
    case DECODE:
        st = s->cached(&j->cache, j->lens, j->q, 32, 1, 0.088f, NULL, j->out, MHA_LAYOUT_BHSD, NULL);
        break;
    case LAYER:
        st = s->forward(s->layer, j->q, j->q, j->q, j->dims.batch, j->dims.seq_q, j->dims.seq_q,
                        NULL, j->out, NULL, 0);
        break;
    }
    if (st != MHA_OK) {
        fprintf(stderr, "mha-ab: call failed (status %d)\n", (int)st);
        exit(1);
    }
}

static void usage(void)
{
    fputs("usage: mha-ab LIB_A LIB_B [--rounds N] attention B S H HKV DH TYPE [strided]\n"
          "       mha-ab LIB_A LIB_B [--rounds N] decode B S TYPE [flush] [paged BS]\n"
          "       mha-ab LIB_A LIB_B [--rounds N] layer B S\n",
          stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        usage();
    side sides[2];
    open_side(argv[1], &sides[0]);
    open_side(argv[2], &sides[1]);
    int a = 3, rounds = 50;
    if (!strcmp(argv[a], "--rounds") && a + 2 < argc)
        rounds = atoi(argv[a + 1]), a += 2;
    if (rounds < 1)
        usage();
    const int n = argc - a - 1;
    const char *kind = argv[a], **arg = (const char **)argv + a + 1;
    job j = {0};
    if (!strcmp(kind, "attention") && (n == 6 || n == 7)) {
        const int32_t B = atoi(arg[0]), S = atoi(arg[1]), H = atoi(arg[2]), Hkv = atoi(arg[3]);
        const int32_t D = atoi(arg[4]);
        j.kind = ATTENTION;
        j.dims = (mha_attn_dims){B, H, Hkv, S, S, D, 0, parse_type(arg[5])};
        j.strided = n == 7 && !strcmp(arg[6], "strided");
        /* [B][S][H][D] storage: every tensor is given with H's strides (k, v read Hkv) */
        j.st = (mha_strides){(int64_t)S * H * D, D, (int64_t)H * D};
        const size_t all = (size_t)B * S * H * D;
        j.q = random_values(all, j.dims.dtype);
        j.k = random_values(all, j.dims.dtype);
        j.v = random_values(all, j.dims.dtype);
        j.out = random_values(all, j.dims.dtype);
    } else if (!strcmp(kind, "decode") && n >= 3 && n <= 6) {
        const int32_t B = atoi(arg[0]), S = atoi(arg[1]), H = 32, Hkv = 8, D = 128;
        const mha_dtype t = parse_type(arg[2]);
        j.kind = DECODE;
        int32_t bs = 0;
        for (int i = 3; i < n; i++)
            if (!strcmp(arg[i], "flush"))
                j.flush = 1;
            else if (!strcmp(arg[i], "paged") && i + 1 < n && atoi(arg[i + 1]) > 0)
                bs = atoi(arg[++i]);
            else
                usage();
        const int64_t row = D / mha_dtype_block_values(t); /* elements (q8_0: blocks) per row */
        const int32_t per = bs ? (S + bs - 1) / bs : 1, rows = bs ? bs : S;
        const size_t bytes = (size_t)B * per * Hkv * rows * (size_t)mha_row_bytes(t, D);
        j.cache = (mha_kv_cache){.k = line_alloc(bytes), .v = line_alloc(bytes), .batch = B,
                                 .kv_heads = Hkv, .head_dim = D, .capacity = per * rows,
                                 .stride_b = (int64_t)Hkv * rows * row, .stride_h = (int64_t)rows * row,
                                 .stride_s = row, .dtype = t, .io_dtype = MHA_F32};
        if (bs) { /* the pool's blocks in a random order */
            int32_t *table = malloc((size_t)B * per * sizeof *table);
            if (!table)
                exit(3);
            for (int32_t i = 0; i < B * per; i++)
                table[i] = i;
            for (int32_t i = B * per - 1; i > 0; i--) {
                const int32_t r = rand() % (i + 1), x = table[i];
                table[i] = table[r], table[r] = x;
            }
            j.cache.block_table = table;
            j.cache.block_size = bs, j.cache.max_blocks = per, j.cache.num_blocks = B * per;
        }
        float *kn = random_values((size_t)B * Hkv * S * D, MHA_F32);
        float *vn = random_values((size_t)B * Hkv * S * D, MHA_F32);
        j.lens = calloc((size_t)B, sizeof *j.lens);
        if (!j.cache.k || !j.cache.v || !j.lens
            || sides[0].append(&j.cache, j.lens, kn, vn, S) != MHA_OK) {
            fputs("mha-ab: cannot build the cache\n", stderr);
            return 1;
        }
        free(kn);
        free(vn);
        for (int32_t b = 0; b < B; b++)
            j.lens[b] = S;
        j.q = random_values((size_t)B * H * D, MHA_F32);
        j.out = random_values((size_t)B * H * D, MHA_F32);
        j.evict_bytes = (size_t)64 << 20;
        j.evict = calloc(j.evict_bytes, 1);
    } else if (!strcmp(kind, "layer") && n == 2) {
        const int32_t B = atoi(arg[0]), S = atoi(arg[1]), d = 768;
        j.kind = LAYER;
        j.dims.batch = B, j.dims.seq_q = S;
        float *w = random_values((size_t)4 * d * d, MHA_F32);
        for (size_t i = 0; i < (size_t)4 * d * d; i++)
            w[i] *= 0.07f; /* ~ 1/sqrt(768), as nn.Linear initializes */
        const mha_layer_desc desc = {12, 12, 64, d, d, d, d, w, w + d * d, w + 2 * d * d,
                                     NULL, NULL, NULL, w + 3 * d * d, NULL, 0};
        for (int i = 0; i < 2; i++)
            if (sides[i].layer_create(&desc, &sides[i].layer) != MHA_OK) {
                fputs("mha-ab: cannot create the layer\n", stderr);
                return 1;
            }
        free(w);
        j.q = random_values((size_t)B * S * d, MHA_F32);
        j.out = random_values((size_t)B * S * d, MHA_F32);
    } else {
        usage();
    }

    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 2; i++)
            run(&j, &sides[i]);
    volatile char sink = 0;
    for (int r = 0; r < rounds; r++)
        for (int ii = 0; ii < 2; ii++) {
            const int i = r % 2 ? 1 - ii : ii;
            for (size_t c = 0; j.flush && c < j.evict_bytes; c += 64)
                sink += j.evict[c];
            const double t0 = now();
            run(&j, &sides[i]);
            t[i][r] = now() - t0;
        }
    for (int i = 0; i < 2; i++) {
        qsort(t[i], (size_t)rounds, sizeof(double), by_value);
        printf("%c: fastest %.1f us, median %.1f us (%s)\n", 'A' + i, 1e6 * t[i][0],
               1e6 * t[i][rounds / 2], argv[1 + i]);
    }
    printf("B/A time: fastest %.3f, median %.3f\n", t[1][0] / t[0][0],
           t[1][rounds / 2] / t[0][rounds / 2]);
    for (int i = 0; i < 2; i++) {
        sides[i].layer_destroy(sides[i].layer);
        free(t[i]);
    }
    free(j.q), free(j.k), free(j.v), free(j.out), free(j.lens), free(j.evict);
    free(j.cache.k), free(j.cache.v);
    return 0;
}
