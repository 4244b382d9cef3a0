/* libmha: CPU kernels for the forward pass of multi-head attention.
 *
 * Computes what torch.nn.MultiheadAttention, BERT's SelfAttention and d2l's
 * MultiHeadAttention compute in eval mode, per batch b and head h:
 *
 *   Q = Xq Wq^T + bq,  K = Xk Wk^T + bk,  V = Xv Wv^T + bv
 *   O[b,h] = softmax(scale * Q[b,h] K[b,h]^T + mask) V[b,h]
 *   Y = merge_heads(O) Wo^T + bo
 *
 * Conventions: sizes are int32_t element counts, tensors are dense row-major
 * float unless a call takes strides (mha_strides, the cache's strides) or an
 * element type (mha_dtype), pointers are the caller's and are not kept after a
 * call returns (except by mha_layer, which owns a packed copy of its weights).
 * Outputs must not overlap inputs unless a function says it works in place.
 *
 * Errors: every entry point checks all of its arguments before writing
 * anything; on error it returns a status and leaves every output untouched.
 * The library never aborts, prints or exits.
 *
 * Masking: a query row with no visible key (every key masked by key lengths,
 * per-query lengths, causality, a sliding window or a -INFINITY bias) yields a
 * row of zeros.
 * PyTorch yields NaN there and d2l a uniform average over all keys; libmha
 * chooses zeros so that padded rows stay finite. Keys hidden by key_lens are
 * never read.
 *
 * Non-finite inputs, the same on every ISA: a key is hidden from a row when a
 * mask hides it or its score is -inf (a -INFINITY bias, whatever q and k hold,
 * or -inf from the data); nothing of a hidden key (its k, its v, its bias)
 * affects the row, whatever neighbouring rows see. A NaN or Inf that a row
 * reads (its query, a visible key's k or v, its visible bias) makes that row's
 * output NaN or Inf as IEEE arithmetic says. Masking alone never creates NaN.
 * The SIMD kernels hold scores times log2(e) (their softmax is a power of 2): a
 * finite score, scale q.k + bias, beyond FLT_MAX / log2(e) ~ 2.4e38 in magnitude
 * overflows to Inf there, where the scalar reference still holds it.
 *
 * Accuracy: with inputs and weights of the scale PyTorch initializes (U(-1,1)
 * inputs, weights ~ 1/sqrt(in)), every SIMD ISA matches the scalar reference
 * within |a - r| <= 1e-5 + 1e-5 |r| element-wise, and the scalar reference
 * matches a float64 evaluation of the PyTorch modules within 2e-5 + 2e-5 |r|.
 * Over a 16-bit or q8_0 cache, with f32 q and out, the same tolerances hold
 * against a float64 evaluation over the values the cache holds; with 16-bit
 * activations, each result is within one unit in the last place of its type,
 * plus those tolerances, of a float64 evaluation over the same inputs.
 *
 * Threads: parallel loops use OpenMP and honour omp_set_num_threads and
 * OMP_NUM_THREADS, or the caller's thread pool (mha_set_parallel_for). Results
 * are bitwise identical for any thread count: a call is cut into work items by
 * its shapes alone, up to about 256 items where the shapes have the work (an
 * attention of one sequence over a long cache is cut into key chunks: 128 items
 * for 8 kv heads over 16384 keys), so that many threads at most work on one
 * attention; per-thread scratch serves up to 1024 threads. An attention of less than
 * about 2 us of one core's work (2^18 FLOP on AVX-512, 2^16 on NEON, 2^15 on AVX2: a
 * decode step over a few keys) runs its items on the calling thread: waking the
 * others would cost more. Calls from several
 * threads at once are safe. No call uses more than 16 KiB of stack on any thread: per-thread
 * scratch comes from the heap (or the workspace). The library keeps the last freed
 * scratch block of up to 4 MiB for the next call (small calls then allocate
 * nothing); it is held until the process ends.
 */
#ifndef MHA_H
#define MHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(MHA_SHARED_BUILD)
#define MHA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define MHA_API __attribute__((visibility("default")))
#else
#define MHA_API
#endif

typedef enum mha_status {
    MHA_OK = 0,
    MHA_ERR_ARG,         /* NULL where a pointer is required, or a value out of range */
    MHA_ERR_SHAPE,       /* a dimension <= 0, heads not dividing, or a size that overflows */
    MHA_ERR_MASK,        /* a key length < 0 or > seq_kv, or inconsistent mask fields */
    MHA_ERR_UNSUPPORTED, /* an ISA that this build or this CPU does not have */
    MHA_ERR_NOMEM,
} mha_status;

/* A static English description of s ("invalid argument", ...); never NULL. */
MHA_API const char *mha_status_str(mha_status s);
/* "MAJOR.MINOR.PATCH" */
MHA_API const char *mha_version(void);

/* New values are only ever appended. */
typedef enum mha_isa {
    MHA_ISA_SCALAR = 0,
    MHA_ISA_AVX2 = 1,
    MHA_ISA_NEON = 2,
    MHA_ISA_AVX512 = 3,
} mha_isa;

/* The ISA that calls use now. */
MHA_API mha_isa mha_isa_active(void);
/* Nonzero when isa is built into this library and supported by this CPU. */
MHA_API int mha_isa_available(mha_isa isa);
/* Process-wide choice of ISA, for validation and benchmarks. Safe to call while
   other threads compute: a call already running finishes on the ISA it started
   with, later calls use the new one. MHA_ERR_UNSUPPORTED when unavailable. */
MHA_API mha_status mha_isa_force(mha_isa isa);
/* The lower-case name of an ISA of the enum ("avx2"); "unknown" for any other value. */
MHA_API const char *mha_isa_name(mha_isa isa);
/* The number of mha_isa values this library knows: they are 0 .. count - 1. */
MHA_API int mha_isa_count(void);
/* Environment: MHA_ISA=<name> forces the ISA at first use; an unknown or unavailable
   name is ignored (the default stays) and reported by tools, never aborts. avx2 needs
   AVX2, FMA and F16C with an OS that saves YMM state (XCR0 bits 1, 2); avx512 needs
   AVX-512 F, BW, DQ and VL plus FMA and F16C, with an OS that saves the opmask and ZMM
   state (XCR0 bits 1, 2, 5, 6, 7). The CPU's features are read once, at the first call that needs them. The
   default is the fastest ISA the CPU has. On Linux, where the CPU has AMX-BF16, that
   first call also asks the kernel for the process's AMX tile state
   (arch_prctl(ARCH_REQ_XCOMP_PERM)), which makes every signal frame of the process
   about 8 KiB larger; MHA_AMX=0 keeps libmha off AMX and does not ask. */

/* Element types of caches and activations; new values are only ever appended. */
typedef enum mha_dtype {
    MHA_F32 = 0,
    MHA_F16 = 1,  /* IEEE 754 binary16 */
    MHA_BF16 = 2, /* bfloat16: the upper 16 bits of a binary32 */
    MHA_Q8_0 = 3, /* caches only: blocks of 32 values, each struct { uint16_t d; int8_t
                     qs[32]; } (34 bytes, ggml's block_q8_0, d a binary16 scale); value i
                     of a block is d * qs[i] */
} mha_dtype;
/* "f32", "f16", "bf16", "q8_0"; "unknown" for any other value. */
MHA_API const char *mha_dtype_name(mha_dtype t);
/* Conversions, bit for bit the same on every ISA. To f16 and bf16: round to nearest,
   ties to even; NaN stays a quiet NaN (sign and the leading payload bits kept); f16
   overflow gives +-Inf; subnormals are kept. To q8_0, per block x[0..31] (ggml's
   reference quantizer, so that a cache written by libmha and one written by ggml hold
   the same bytes): amax = max |x_i|, d = amax / 127, id = d != 0 ? 1/d : 0, qs_i =
   roundf(x_i * id) (halves away from zero), stored d is d rounded to f16; a block
   holding a NaN or Inf stores a NaN scale and zeros, so that all its values read
   back as NaN. From f16, bf16 and q8_0 to f32 is exact. Attention reads a cache's
   values exactly, computes scores, softmax and P.V in f32, and rounds its output once
   to the output's type. Where q and K are both bf16 and the CPU has AVX512-BF16, the
   avx512 kernels take q.k by bf16 dot products: each product is exact in f32 and each
   sum rounded once, as with FMAs (in another order, subnormal inputs read as zero),
   then multiply by scale: within the same tolerance, not bit for bit the FMA path.
   With AMX-BF16 (and head_dim a multiple of 32) the tile unit takes the same products
   16 keys at a time, summed in f32 in its own order, subnormal inputs read as zero; and
   P.V too (v_head_dim a multiple of 32, at most 128), each weight p split into two
   bf16 pieces, hi = p rounded and lo = p - hi rounded, |hi + lo - p| <= 2^-17 p
   (pieces below 2^-126 read as zero): the out row errs by at most 2^-17 max |V| more
   than f32 FMAs would (7.6e-6 for |V| <= 1: inside the f32 tolerance), before its
   rounding to bf16. */

/* Runs fn(arg, i) for every i in [0, n), in any order and on any threads, and
   returns when all have finished. */
typedef void (*mha_parallel_for_fn)(void *pool, int64_t n, void (*fn)(void *arg, int64_t i),
                                    void *arg);
/* Process-wide: route every parallel loop of the library through the caller's
   thread pool instead of OpenMP; NULL restores OpenMP. Results stay bitwise
   identical. The library never calls pfor from inside fn (no nesting), and may call
   it from several threads at once. Set it while no call of the library runs. */
MHA_API void mha_set_parallel_for(mha_parallel_for_fn pfor, void *pool);

typedef struct mha_mask {
    const int32_t *key_lens;       /* NULL or [B]: keys j >= key_lens[b] are masked (d2l valid_lens (B,)) */
    const int32_t *query_key_lens; /* NULL or [B][Sq]: per query row (d2l valid_lens (B, Sq)) */
    const float *bias;             /* NULL or additive, element (b,h,i,j) at            */
    int64_t bias_stride_b;         /*   bias[b*stride_b + h*stride_h + i*stride_q + j]; */
    int64_t bias_stride_h;         /*   a stride of 0 broadcasts (BERT [B,1,1,S]:       */
    int64_t bias_stride_q;         /*   stride_b = S, stride_h = 0, stride_q = 0)       */
    int32_t causal;                /* nonzero: key j masked when j > p(i) */
    /* Score modifiers of current LLMs; zero / NULL turns each off. p(i) is row i's
       position: i + (seq_kv - seq_q) in mha_attention, lens[b] - seq_q + i in
       mha_attention_cached. */
    int32_t window;                /* > 0: key j masked when j <= p(i) - window (sliding window) */
    float softcap;                 /* > 0: score s becomes softcap * tanh(s / softcap), before bias */
    const float *alibi_slopes;     /* NULL or [H]: adds slopes[h] * (j - p(i)) to the score */
    const float *sinks;            /* NULL or [H]: a virtual key per head with score sinks[h]
                                      and a zero value, in every row's softmax denominator */
    const int32_t *key_starts;     /* NULL or [B]: keys j < key_starts[b] are masked (left
                                      padding); values in [0, seq_kv] (cache: [0, capacity]) */
    const int32_t *q_offsets;      /* NULL or [B]: row i of sequence b sits at position
                                      p(i) = q_offsets[b] + i, for causal, window and ALiBi,
                                      instead of the default bottom-right p(i); 0 gives
                                      PyTorch's top-left is_causal. Any int32 value */
} mha_mask;
/* The score of row i and key j: s = scale * q_i . k_j, then softcap, then + bias +
   ALiBi; masked keys (lengths, causal, window, -INFINITY bias) get weight exactly 0.
   A sink is not a key: a row whose every key is masked gets zeros, sink or not.
   Every field may be combined with the others. Lengths and starts must lie in
   [0, seq_kv], strides must be >= 0, window >= 0 and softcap finite and >= 0, else
   MHA_ERR_MASK. A NULL mha_mask pointer means no mask. */

typedef enum mha_layout { MHA_LAYOUT_BHSD = 0, MHA_LAYOUT_BSHD = 1 } mha_layout;

/* Kernel 2: in-place head transpose. x is [B][S][H][dh] -> [B][H][S][dh] (split)
   or back (merge). Scratch, taken before anything moves, is never a copy of the
   tensor: per batch, two bitmaps of S*H bits, the saved starts of long cycles (at
   most 2/256 of the batch) and a queue of work units, shared by the threads, plus
   one 256 KiB tile or one element per thread; MHA_ERR_NOMEM if that cannot be
   had, with x untouched. */
MHA_API mha_status mha_heads_split(float *x, int32_t batch, int32_t seq, int32_t heads, int32_t head_dim);
MHA_API mha_status mha_heads_merge(float *x, int32_t batch, int32_t seq, int32_t heads, int32_t head_dim);

/* Kernel 3: fused scale-mask-softmax-matmul for every (b, h).
   q: [B][H][Sq][dh], k: [B][Hkv][Skv][dh], v: [B][Hkv][Skv][dv], H % Hkv == 0 (Hkv < H
   is grouped-query attention: query head h reads kv head h / (H / Hkv)). scale is
   usually 1/sqrt(dh). out: [B][H][Sq][dv] (MHA_LAYOUT_BHSD) or heads merged
   [B][Sq][H*dv] (MHA_LAYOUT_BSHD). dv = v_head_dim, or dh when it is 0. mask may be
   NULL. Extra memory is a few tiles per thread, plus, when few (b, kv head) pairs
   meet many keys, partial results of at most 256 key chunks per query row: never
   anything that grows with Skv. */
typedef struct mha_attn_dims {
    int32_t batch, heads, kv_heads, seq_q, seq_kv, head_dim;
    int32_t v_head_dim; /* 0 means head_dim; else v is [B][Hkv][Skv][v_head_dim] and out has
                           v_head_dim per head (MLA-style models: qk 192 / v 128) */
    mha_dtype dtype;    /* type of q, k, v and out: 0 (MHA_F32), MHA_F16 or MHA_BF16; any
                           other value is MHA_ERR_ARG. For 16-bit types the float pointers
                           of mha_attention point at 16-bit elements (cast them) */
} mha_attn_dims;
MHA_API mha_status mha_attention(const mha_attn_dims *dims, const float *q, const float *k,
                                 const float *v, float scale, const mha_mask *mask, float *out,
                                 mha_layout out_layout);

/* Strides, in elements, of a [B][H][S][d] tensor whose last dimension is contiguous:
   element (b, h, s, i) is at base + b*b + h*h + s*s + i. Strides are >= 0 (else
   MHA_ERR_ARG); a [B][S][H][d] tensor viewed as [B][H][S][d] is {S*H*d, d, H*d}.
   Rows that start on 64-byte cache lines read fastest: when rows lie apart (a view
   like the one above), each row that starts off a line spans one line more. */
typedef struct mha_strides {
    int64_t b, h, s;
} mha_strides;

/* mha_attention over strided tensors of dims->dtype, with lse (NULL, or [B][H][Sq] as
   in mha_attention_cached). NULL strides mean dense [B][H][S][d]. out must not
   overlap q, k or v. mha_attention is this call with dense q, k, v and out in
   out_layout. */
MHA_API mha_status mha_attention_strided(const mha_attn_dims *dims,
                                         const void *q, const mha_strides *q_strides,
                                         const void *k, const mha_strides *k_strides,
                                         const void *v, const mha_strides *v_strides,
                                         float scale, const mha_mask *mask,
                                         void *out, const mha_strides *out_strides, float *lse);

/* A KV cache the caller owns. For sequence b < batch, kv head g and row j < capacity,
   the K row (head_dim contiguous elements of dtype) is at k + b*stride_b + g*stride_h +
   j*stride_s, and the V row (v_head_dim elements) at v + b*v_stride_b + g*v_stride_h +
   j*v_stride_s. Strides count elements of dtype (32-value blocks for MHA_Q8_0) and are
   >= 0 (else MHA_ERR_ARG). v_head_dim 0 means head_dim; V strides all 0 mean K's
   strides. [B][Hkv][cap][dh] and [B][cap][Hkv][dh] are both such layouts, and so is an
   MLA latent cache where V is the first v_head_dim elements of each K row (v == k, same
   strides). The library reads the cache in place, never copies it; rows that start on
   64-byte cache lines read fastest (Zen 5: f16 decode 9% slower 16 bytes off a line).
   Paged: with a block_table, row j of sequence b lives in pool block blk =
   block_table[b * max_blocks + j / block_size], at row j % block_size: its K row at k +
   blk*stride_b + g*stride_h + (j % block_size)*stride_s (V alike with its strides);
   stride_b is then the pool's block stride. Blocks of a few KiB read in a shuffled
   order cost a page walk each on 4 KiB pages: keep a pool on huge pages (Linux:
   madvise(MADV_HUGEPAGE) on a 2 MiB-aligned pool; Xeon, decode with blocks of 16 rows:
   0.86-0.95x of the same cache contiguous on 4 KiB pages, 0.94-1.01x on huge ones). */
typedef struct mha_kv_cache {
    void *k, *v; /* the cache's own type (dtype) */
    int32_t batch, kv_heads, head_dim, capacity;
    int64_t stride_b, stride_h, stride_s;
    int32_t v_head_dim;
    int64_t v_stride_b, v_stride_h, v_stride_s;
    mha_dtype dtype;    /* type of the cached rows: 0 (MHA_F32), MHA_F16, MHA_BF16, MHA_Q8_0
                           (head_dim and v_head_dim multiples of 32, else MHA_ERR_SHAPE);
                           any other value is MHA_ERR_ARG */
    mha_dtype io_dtype; /* type of q, out, k_new and v_new in calls on this cache: 0
                           (MHA_F32), MHA_F16 or MHA_BF16 (else MHA_ERR_ARG; the float
                           pointers of those calls then point at 16-bit elements).
                           mha_layer_step needs MHA_F32 here (its x and out are the
                           layer's f32) and writes its new K, V rows converted to dtype */
    const int32_t *block_table; /* NULL: each sequence's rows are contiguous as above. Else
                                   [batch][max_blocks] pool block indices (see above) */
    int32_t block_size;         /* rows per block, >= 1 */
    int32_t max_blocks;         /* entries per sequence in block_table; capacity must equal
                                   max_blocks * block_size (else MHA_ERR_SHAPE) */
    int32_t num_blocks;         /* blocks in the pool: an entry a call needs that lies
                                   outside [0, num_blocks) is MHA_ERR_ARG, nothing written
                                   (lens out of range are MHA_ERR_SHAPE first); entries
                                   past a sequence's rows are never read */
} mha_kv_cache;

/* Writes seq_new new rows per sequence: k_new [B][Hkv][seq_new][dh] and v_new
   [B][Hkv][seq_new][v_head_dim], of the cache's io_dtype, go converted to its dtype
   to rows lens[b] .. lens[b] + seq_new - 1 of sequence b (K rows first, then V rows:
   where V rows alias K rows, v_new wins). lens is read, not changed. lens[b] < 0 or
   lens[b] + seq_new > capacity is MHA_ERR_SHAPE, with nothing written. */
MHA_API mha_status mha_kv_append(const mha_kv_cache *cache, const int32_t *lens,
                                 const float *k_new, const float *v_new, int32_t seq_new);

/* Attention of seq_q query rows per sequence against rows j < lens[b] of the cache
   (0 <= lens[b] <= capacity, else MHA_ERR_SHAPE). q: [B][heads][seq_q][dh] and out of
   the cache's io_dtype,
   heads % kv_heads == 0 (GQA: the heads that share a kv head read each K and V row
   once, together). Row i of sequence b sits at position p(i) = lens[b] - seq_q + i:
   with mask->causal it sees keys j <= p(i) (a row with p(i) < 0 sees none and gets
   zeros), so chunked prefill and decode steps line up with each sequence's length.
   mask->key_lens must be NULL (lens takes its place, else MHA_ERR_MASK); the other
   mask fields work as in mha_attention, with j < capacity (bias element (b,h,i,j);
   query_key_lens in [0, capacity]). out as mha_attention (BHSD or BSHD), v_head_dim
   wide per head. lse: NULL, or [B][heads][seq_q] receives the natural log of each
   row's softmax denominator, the sum over visible keys j of exp(s_ij) (sinks not
   included), for merging results over disjoint key ranges; -INFINITY for a row with
   no visible key. Results are bitwise identical for any thread count: when few
   (b, kv head) pairs meet long caches, keys are cut into chunks whose bounds depend
   only on the shapes and lens, and the chunks' partial results merge in a fixed order. */
MHA_API mha_status mha_attention_cached(const mha_kv_cache *cache, const int32_t *lens,
                                        const float *q, int32_t heads, int32_t seq_q, float scale,
                                        const mha_mask *mask, float *out, mha_layout out_layout,
                                        float *lse);
/* mha_attention_cached with strided q and out of the cache's io_dtype (NULL: dense
   [B][heads][seq_q][d]). */
MHA_API mha_status mha_attention_cached_strided(const mha_kv_cache *cache, const int32_t *lens,
                                                const void *q, const mha_strides *q_strides,
                                                int32_t heads, int32_t seq_q, float scale,
                                                const mha_mask *mask, void *out,
                                                const mha_strides *out_strides, float *lse);

/* A layer owns pre-packed weights; weights use nn.Linear's [out][in] layout. */
typedef struct mha_layer_desc {
    int32_t heads, kv_heads, head_dim; /* kv_heads 0 means heads */
    int32_t q_in, k_in, v_in;          /* input widths; k_in 0 means q_in, v_in 0 means k_in */
    int32_t out_dim;                   /* 0: no output projection (result is merged heads) */
    const float *w_q, *w_k, *w_v;      /* [heads*dh][q_in], [kv_heads*dh][k_in], [kv_heads*dv][v_in] */
    const float *b_q, *b_k, *b_v;      /* NULL: no bias */
    const float *w_o, *b_o;            /* [out_dim][heads*dv], [out_dim]; ignored when out_dim is 0 */
    int32_t v_head_dim;                /* dv; 0 means head_dim */
} mha_layer_desc;
typedef struct mha_layer mha_layer;

/* Packs the weights once, for the ISA active now, and copies the biases: desc and
   its arrays may be freed afterwards. *out is written only on MHA_OK. A layer holds
   one packed copy of its weights; a call on an ISA whose kernels need another
   packing (after mha_isa_force) first repacks that copy, once per packing and
   thread-safely, and keeps it until mha_layer_destroy (MHA_ERR_NOMEM, with every
   output untouched, if that copy cannot be allocated). */
MHA_API mha_status mha_layer_create(const mha_layer_desc *desc, mha_layer **out);
MHA_API void mha_layer_destroy(mha_layer *layer); /* NULL is fine */

/* Kernel 1: fused QKV projection into head-major q [B][H][Sq][dh], k [B][Hkv][Skv][dh],
   v [B][Hkv][Skv][dv].
   When key == query and value == query (self-attention) it is one GEMM over the packed
   [Wq;Wk;Wv]; when value == key it fuses K and V. query is [B][Sq][q_in], key
   [B][Skv][k_in], value [B][Skv][v_in]. */
MHA_API mha_status mha_qkv_project(const mha_layer *layer, const float *query, const float *key,
                                   const float *value, int32_t batch, int32_t seq_q, int32_t seq_kv,
                                   float *q, float *k, float *v);

/* The whole layer: out is [B][Sq][out_dim] (or [B][Sq][heads*dv] when out_dim is 0),
   with scale 1/sqrt(head_dim). key and value may equal query (self-attention).
   workspace may be NULL (the library allocates); otherwise it must hold at least
   mha_layer_workspace_size(...) bytes (less is MHA_ERR_ARG) and the call allocates
   nothing: the workspace also holds the attention's tiles, one set per thread of the
   thread count (OpenMP's, or the online CPUs with a caller's pool), so the size depends
   on that count: ask again after raising it (a workspace sized for fewer threads is too
   small, MHA_ERR_ARG). It returns 0 for a NULL layer or invalid sizes. */
MHA_API size_t mha_layer_workspace_size(const mha_layer *layer, int32_t batch, int32_t seq_q,
                                        int32_t seq_kv);
MHA_API mha_status mha_layer_forward(const mha_layer *layer, const float *query, const float *key,
                                     const float *value, int32_t batch, int32_t seq_q,
                                     int32_t seq_kv, const mha_mask *mask, float *out,
                                     void *workspace, size_t workspace_size);

/* One decoder step (self-attention with a KV cache; batch = cache->batch; a layer
   whose q_in, k_in, v_in differ is MHA_ERR_SHAPE): projects x [B][seq_q][q_in] into
   Q and seq_q new K, V rows per sequence, appends those at rows lens[b].. of the
   cache, attends as mha_attention_cached (causal when mask->causal) with scale
   1/sqrt(head_dim), applies the output projection, and on MHA_OK adds seq_q to every
   lens[b]. The cache's kv_heads, head_dim and v_head_dim must be the layer's, and
   lens[b] + seq_q <= capacity (else MHA_ERR_SHAPE). On any error the cache, lens and
   out are untouched. out is [B][seq_q][out_dim] (or [B][seq_q][heads*dv]). Workspace
   as in mha_layer_forward; mha_layer_step_workspace_size returns 0 for a NULL layer
   or invalid sizes. */
MHA_API size_t mha_layer_step_workspace_size(const mha_layer *layer, int32_t batch,
                                             int32_t seq_q);
MHA_API mha_status mha_layer_step(const mha_layer *layer, const float *x, int32_t seq_q,
                                  const mha_kv_cache *cache, int32_t *lens, const mha_mask *mask,
                                  float *out, void *workspace, size_t workspace_size);

#ifdef __cplusplus
}
#endif
#endif
