/* Shared helpers of the cmocka suites: deterministic data, a float64 reference
 * written straight from the math, tolerance checks and the ISA chosen by MHA_ISA. */
#ifndef MHA_TESTS_COMMON_H
#define MHA_TESTS_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "isa_list.h"
#include "mha.h"
#include "ref64.h"

/* Tolerances of mha.h's accuracy contract: optimized ISA vs scalar, scalar vs float64. */
#define TOL_ISA 1e-5
#define TOL_REF 2e-5

typedef struct rng {
    uint64_t s;
} rng;
float rng_uniform(rng *r, float lo, float hi);
float *rand_floats(rng *r, int64_t n, float lo, float hi); /* malloc'd; never NULL */
float *filled_floats(int64_t n, float value);              /* malloc'd; never NULL */

/* Max over i of |a-r| / (atol + rtol*|r|): <= 1 means within tolerance; NaN in
   either operand where the other is not NaN counts as a failure (returns inf). */
double tol_ratio(const float *a, const double *r, int64_t n, double tol);
double tol_ratio_f(const float *a, const float *r, int64_t n, double tol);

/* omp_set_num_threads(n); nothing in a build without OpenMP. */
void set_threads(int n);

/* A caller's thread pool for mha_set_parallel_for: `workers` threads (with
   stacks of stack_bytes) plus the caller; one job at a time (a lock serializes
   callers), items handed out in order. start returns 0, or -1 when a thread
   could not start; jobs counts the parallel loops run. */
typedef struct test_pool {
    pthread_t *threads;
    int workers;
    pthread_mutex_t lock, job_lock;
    pthread_cond_t wake, idle;
    void (*fn)(void *, int64_t);
    void *arg;
    int64_t n, next, done;
    unsigned generation;
    int quit, jobs;
} test_pool;
int test_pool_start(test_pool *p, int workers, size_t stack_bytes);
void test_pool_stop(test_pool *p);
void test_pool_parallel_for(void *pool, int64_t n, void (*fn)(void *, int64_t), void *arg);

/* Reads MHA_ISA: exits 77 (skip) when it names an ISA this CPU lacks, so that
   the suite registered once per ISA skips where that ISA cannot run. */
void require_env_isa(void);

/* A layer's weights kept by the test, for the float64 reference. */
typedef struct test_layer {
    mha_layer_desc desc;
    int32_t kv_heads, k_in, v_in, dv;
    float *w_q, *w_k, *w_v, *b_q, *b_k, *b_v, *w_o, *b_o;
    mha_layer *layer;
} test_layer;
/* Random weights ~ U(-1/sqrt(in), 1/sqrt(in)); biases when with_bias. test_layer_init
   is test_layer_init_v with v_head_dim 0 (dv = head_dim). */
void test_layer_init(test_layer *t, rng *r, int32_t heads, int32_t kv_heads, int32_t head_dim,
                     int32_t q_in, int32_t k_in, int32_t v_in, int32_t out_dim, int with_bias);
void test_layer_init_v(test_layer *t, rng *r, int32_t heads, int32_t kv_heads, int32_t head_dim,
                       int32_t v_head_dim, int32_t q_in, int32_t k_in, int32_t v_in,
                       int32_t out_dim, int with_bias);
void test_layer_free(test_layer *t);

/* KV caches of the tests: [B][Hkv][cap][d] and [B][cap][Hkv][d] with K and V apart;
   the MLA latent cache, V the first dv floats of each K row (v == k, same strides,
   dv <= dk); and [B][Hkv][cap][d] with rows padded to max(dk, dv) + 3 floats and V
   strides 0 (meaning K's). */
typedef enum cache_kind {
    CACHE_BHSD,
    CACHE_BSHD,
    CACHE_LATENT,
    CACHE_PADDED,
    CACHE_KINDS
} cache_kind;
const char *cache_kind_name(cache_kind kind);
typedef struct test_cache {
    mha_kv_cache c;
    float *kbuf, *vbuf; /* the allocations: CACHE_GUARD floats, the cache, CACHE_GUARD
                           floats; vbuf == kbuf for the latent cache */
    size_t kn, vn;      /* floats of each allocation (whatever the cache's type) */
    int32_t *table;     /* a paged cache's block table, else NULL */
} test_cache;
#define CACHE_GUARD 16
#define CACHE_FILL 0xff /* every byte of a fresh cache: NaN in every value of every type */
/* 0 when the kind cannot hold these dims (latent with dv > dk); else the f32 cache,
   every byte CACHE_FILL (rows past the lengths, padding and guards included). */
int test_cache_init(test_cache *t, cache_kind kind, int32_t batch, int32_t kv_heads,
                    int32_t head_dim, int32_t v_head_dim, int32_t capacity);
/* The same of any dtype and io_dtype, paged when block_size > 0: the kind's layout
   within each pool block of block_size rows, blocks in an order shuffled by r, two
   spare blocks that no entry names. 0 also when q8_0 dims are not multiples of 32 or
   block_size does not divide capacity. */
int test_cache_init_as(test_cache *t, cache_kind kind, mha_dtype dtype, mha_dtype io_dtype,
                       int32_t block_size, int32_t batch, int32_t kv_heads, int32_t head_dim,
                       int32_t v_head_dim, int32_t capacity, rng *r);
/* Random U(-1, 1) K and V in rows j < lens[b] (V after K where they alias), stored in
   the cache's type. */
void test_cache_fill(test_cache *t, rng *r, const int32_t *lens);
/* Row j of sequence b, kv head g (through the block table of a paged cache). */
void *cache_k_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j);
void *cache_v_row(const mha_kv_cache *c, int32_t b, int32_t g, int32_t j);
void test_cache_free(test_cache *t);

/* The element types of mha.h, from the library's list: X(name, enum, bytes per
   block, values per block, io). */
#include "dtype.h"
#define TEST_DTYPES(X) MHA_DTYPE_LIST(X)

/* Every element type, in the list's order. */
#define TEST_DTYPE_VALUE_(name, value, bytes, values, io) value,
static const mha_dtype test_types[] = {TEST_DTYPES(TEST_DTYPE_VALUE_)};
#undef TEST_DTYPE_VALUE_
enum { TEST_TYPE_COUNT = sizeof test_types / sizeof *test_types };

/* Rows of d values of type t (MHA_Q8_0: d a multiple of 32) stored from floats x[j*ld
   + e], j < rows: contiguous at `stride` bytes (pad_units units of padding after each
   row, NaN-filled), or paged when block_size > 0: pool blocks of block_size rows at
   block_stride bytes, their order shuffled by a table (plus `spare` unused pool blocks
   whose every byte is NaN-poisoned). The storage ends flush against a guard page. */
typedef struct typed_rows {
    mha_dtype t;
    char *mem;
    size_t bytes;
    int64_t stride, block_stride;
    int32_t *table; /* NULL: contiguous */
    int32_t block_size, nblocks, rows;
} typed_rows;
void typed_rows_init(typed_rows *tr, mha_dtype t, const float *x, int64_t ld, int32_t rows,
                     int32_t d, int32_t pad_units, int32_t block_size, int32_t spare, rng *r);
const char *typed_row(const typed_rows *tr, int32_t j);
void typed_rows_free(typed_rows *tr);
/* dst (one row of type t) = the d floats x, converted as mha.h defines. */
void typed_store(mha_dtype t, void *dst, const float *x, int32_t d);
/* Max over i of |a - r| / (ulp(r) + tol (1 + |r|)) for values of type t (no ulp for
   f32), NaN matching NaN and infinities matching exactly. */
double typed_ratio(mha_dtype t, const double *a, const double *r, int64_t n, double tol);
/* n values of type t decoded to doubles (malloc'd). */
double *typed_decode(mha_dtype t, const void *x, int64_t n);
/* n random U(-1, 1) values stored in type t (malloc'd). */
void *typed_rand(rng *r, mha_dtype t, int64_t n);
/* n zero bytes (at least 1), never NULL. */
void *xcalloc(size_t n);
#endif
