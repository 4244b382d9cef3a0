/* Head transpose driver: per batch, an in-place transpose of rows x cols elements
 * of elem floats. Position p of an r x c transpose receives the element from
 *   src(p) = (p % r)*c + p / r,
 * a permutation whose cycles are moved in one pass, in parallel over cycles: the
 * first worker to start (the producer) walks every cycle once (integer work on a
 * bitmap) and queues units of about `seg` positions as it goes, which the other
 * workers run meanwhile (and the producer too once it is done):
 *   - short cycles (<= seg positions): a task moves those whose smallest position
 *     (leader, a bit in a second bitmap) lies in a range of positions;
 *   - a long cycle p_0, p_1, ... is cut into segments at every seg-th position,
 *     each first saved aside; the segment from p_a to p_b-1 moves x[p_j] <- x[p_j+1]
 *     and closes with the saved copy of x[p_b], so segments never wait for each
 *     other.
 * Each element is read and written once; a walker runs ahead of each mover to
 * prefetch the scattered elements. Any order of moves gives the same permutation,
 * so the result is bit-identical for every thread count.
 *
 * A matrix of one kernel tile goes to the kernel instead. Elements too small for
 * scattered moves (under CYCLE_MIN_BYTES) are first grouped: with rows = r1 * b,
 * the kernel transposes each tile [b][cols] -> [cols][b] in cache, then [r1][cols]
 * super-elements of b*elem floats are moved as above (cols = c1 * b runs the same
 * passes in the other order). All scratch is allocated up front, so a failure
 * writes nothing: two bitmaps of r*c bits, the saved segment starts (at most
 * 2/seg of the tensor), the queue of units, and one tile or element per worker. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum {
    SUPER_MIN_BYTES = 1 << 12, /* smallest super-element worth the tile pass */
    CYCLE_MIN_BYTES = 128,     /* smallest element moved by cycles without the tile pass */
    UNIT_MIN = 256,            /* positions per unit: at least this, */
    UNIT_MAX = 4096,           /*   at most this, */
    UNITS_PER_THREAD = 16,     /*   and about this many units per thread */
    PF_AHEAD = 32,             /* positions in flight between walker and mover (power of 2) */
    PF_MAX_LINES = 16,         /* prefetch at most this many 64-byte lines of an element */
};

/* Largest b dividing d (1 < b < d) with a tile of b * other elements in a kernel
 * tile and a super-element of b elements of at least SUPER_MIN_BYTES; 0 if none. */
static int32_t split_factor(int32_t d, int32_t other, int32_t elem)
{
    const int64_t elem_bytes = (int64_t)elem * (int64_t)sizeof(float);
    int64_t b = MHA_TRANSPOSE_TILE_BYTES / (elem_bytes * other);
    if (b > d / 2)
        b = d / 2;
    for (; b > 1 && b * elem_bytes >= SUPER_MIN_BYTES; b--)
        if (d % b == 0)
            return (int32_t)b;
    return 0;
}

/* A unit of moves: the short cycles whose leaders lie in [lo, hi) (tail < 0),
 * or the len positions of a long cycle from lo, closed by saved slot tail. */
typedef struct unit {
    int64_t lo, hi_or_len, tail;
} unit;

/* The cycles of an r x c transpose of elements of sup floats, batch matrices of
 * `matrix` floats apart; shared by the producer and the workers. */
typedef struct cycles {
    float *x;
    int32_t batch;
    int64_t matrix, sup, r, c, n, seg;
    uint64_t *done;    /* n bits: walked (the producer's alone) */
    uint64_t *leaders; /* n bits: smallest position of a cycle of <= seg positions */
    float *saved;      /* slot k of batch b at (k * batch + b) * sup */
    unit *units;       /* the queue: units[0, produced) are ready, [0, next) taken */
    _Atomic int64_t produced, next;
    _Atomic int producing, finished;
    mha_scratch held; /* one element per worker */
} cycles;

/* 32-bit division when the positions fit: the walks are chains of divisions. */
static inline int64_t src_of(const cycles *cy, int64_t p)
{
    if (cy->n <= UINT32_MAX) {
        const uint32_t q = (uint32_t)p / (uint32_t)cy->r;
        return (int64_t)(((uint32_t)p - q * (uint32_t)cy->r) * (uint32_t)cy->c + q);
    }
    return (p % cy->r) * cy->c + p / cy->r;
}

/* Saved slots: a long cycle of L > seg positions takes ceil(L / seg) <= 2 floor(L / seg)
 * of them (one per seg-th position). */
static int64_t max_slots(int64_t n, int64_t seg)
{
    return 2 * (n / seg);
}

/* Units: as many segments as slots, and leader units of at least seg positions
 * each but the last. */
static int64_t max_units(int64_t n, int64_t seg)
{
    return max_slots(n, seg) + n / seg + 1;
}

/* Hands out the positions of one unit in moving order; a cycle's or segment's
 * first position p comes as -(p + 2), and -1 ends the unit. */
typedef struct walker {
    const cycles *cy;
    int64_t first;    /* a segment's first position, -1 once handed out or for leaders */
    int64_t scan, hi; /* leaders left to start: [scan, hi) */
    int64_t start;    /* first position of the current cycle, -1 between cycles */
    int64_t p;        /* last position handed out */
    int64_t left;     /* positions left in a segment; -1 in a whole cycle */
} walker;

static int64_t walk_next(walker *w)
{
    if (w->start >= 0) {
        if (w->left != 0) {
            const int64_t s = src_of(w->cy, w->p);
            if (s != w->start) {
                if (w->left > 0)
                    w->left--;
                return w->p = s;
            }
        }
        w->start = -1;
    }
    if (w->first >= 0) {
        w->start = w->p = w->first;
        w->first = -1;
        return -(w->start + 2);
    }
    const uint64_t *bits = w->cy->leaders;
    while (w->scan < w->hi) {
        const uint64_t set = bits[w->scan / 64] & (~UINT64_C(0) << (w->scan % 64));
        if (!set) {
            w->scan = (w->scan / 64 + 1) * 64;
            continue;
        }
        const int64_t s = w->scan / 64 * 64 + __builtin_ctzll(set);
        if (s >= w->hi)
            break;
        w->scan = s + 1;
        w->start = w->p = s;
        return -(s + 2);
    }
    w->scan = w->hi;
    return -1;
}

static inline void prefetch_elem(const float *e, size_t bytes)
{
    const char *end = (const char *)e + (bytes < PF_MAX_LINES * 64 ? bytes : PF_MAX_LINES * 64);
    for (const char *l = (const char *)((uintptr_t)e & ~(uintptr_t)63); l < end; l += 64)
        __builtin_prefetch(l, 1, 3);
}

/* Moves one unit of the matrix x: each position receives the element of the next
 * one, the last of a cycle or segment the element `tail`; when held is not NULL,
 * tail is held and each cycle's first element is copied there before it moves. */
static void move_unit(float *x, int64_t sup, walker *w, const float *tail, float *held)
{
    const size_t bytes = (size_t)sup * sizeof(float);
    int64_t ring[PF_AHEAD];
    int32_t head = 0, count = 0;
    for (; count < PF_AHEAD; count++) {
        const int64_t q = walk_next(w);
        if (q == -1)
            break;
        ring[count] = q;
        prefetch_elem(x + (q < 0 ? -q - 2 : q) * sup, bytes);
    }
    int64_t last = -1;
    while (count > 0) {
        const int64_t q = ring[head];
        const int64_t next = walk_next(w);
        if (next == -1) {
            count--;
        } else {
            ring[head] = next;
            prefetch_elem(x + (next < 0 ? -next - 2 : next) * sup, bytes);
        }
        head = (head + 1) % PF_AHEAD;
        if (q < 0) {
            if (last >= 0)
                memcpy(x + last * sup, tail, bytes);
            last = -q - 2;
            if (held)
                memcpy(held, x + last * sup, bytes);
        } else {
            memcpy(x + last * sup, x + q * sup, bytes);
            last = q;
        }
    }
    if (last >= 0)
        memcpy(x + last * sup, tail, bytes);
}

/* Moves, in every batch, the cycles of one unit. */
static void run_unit(const cycles *cy, const unit *u, float *held)
{
    for (int32_t b = 0; b < cy->batch; b++) {
        float *x = cy->x + b * cy->matrix;
        if (u->tail < 0) {
            walker w = {.cy = cy, .first = -1, .scan = u->lo, .hi = u->hi_or_len, .start = -1,
                        .left = -1};
            move_unit(x, cy->sup, &w, held, held);
        } else {
            walker w = {.cy = cy, .first = u->lo, .start = -1, .left = u->hi_or_len - 1};
            move_unit(x, cy->sup, &w, cy->saved + (u->tail * cy->batch + b) * cy->sup, NULL);
        }
    }
}

/* Queues a unit: its slots are saved and its leader bits written before. */
static void push_unit(cycles *cy, int64_t lo, int64_t hi_or_len, int64_t tail)
{
    const int64_t i = atomic_load_explicit(&cy->produced, memory_order_relaxed);
    cy->units[i] = (unit){lo, hi_or_len, tail};
    atomic_store_explicit(&cy->produced, i + 1, memory_order_release);
}

static void save_slot(const cycles *cy, int64_t slot, int64_t p)
{
    for (int32_t b = 0; b < cy->batch; b++)
        memcpy(cy->saved + (slot * cy->batch + b) * cy->sup, cy->x + b * cy->matrix + p * cy->sup,
               (size_t)cy->sup * sizeof(float));
}

/* The producer: walks every cycle once and queues its work as soon as it is
 * known. Short-cycle units end on bitmap words, so no worker reads a word the
 * producer still writes. The i-th seg-th position of a long cycle is saved
 * before segment i-1, the first to write near it, is queued; segment i starts
 * there and is queued once position (i+1)*seg is saved. */
static void produce(cycles *cy)
{
    const int64_t n = cy->n, seg = cy->seg;
    memset(cy->done, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));
    memset(cy->leaders, 0, (size_t)(n + 63) / 64 * sizeof(uint64_t));
    int64_t lo = 0, acc = 0, slots = 0;
    for (int64_t s = 0; s < n; s++) {
        if (s % 64 == 0 && acc >= seg) {
            push_unit(cy, lo, s, -1);
            lo = s;
            acc = 0;
        }
        if (cy->done[s / 64] >> (s % 64) & 1)
            continue;
        const int64_t first = slots;
        int64_t len = 0, p = s, prev = s, mark = seg;
        do {
            cy->done[p / 64] |= UINT64_C(1) << (p % 64);
            if (len == mark) {
                if (mark == seg)
                    save_slot(cy, slots++, s);
                save_slot(cy, slots++, p);
                push_unit(cy, prev, seg, slots - 1);
                prev = p;
                mark += seg;
            }
            len++;
            p = src_of(cy, p);
        } while (p != s);
        if (len > seg) {
            push_unit(cy, prev, len - (mark - seg), first);
        } else if (len > 1) {
            cy->leaders[s / 64] |= UINT64_C(1) << (s % 64);
            acc += len;
        }
    }
    if (acc > 0)
        push_unit(cy, lo, n, -1);
}

/* A worker: the first to start produces, then every worker runs queued units
 * until the producer has finished and the queue is empty. Only a worker that
 * finds the producer running ever waits, so any pool (even one thread running
 * the items in turn) completes. */
static void cycles_item(void *arg, int64_t item)
{
    (void)item;
    cycles *cy = arg;
    float *held = mha_scratch_take(&cy->held);
    int idle = 0;
    if (atomic_compare_exchange_strong(&cy->producing, &idle, 1)) {
        produce(cy);
        atomic_store_explicit(&cy->finished, 1, memory_order_release);
    }
    for (;;) {
        const int finished = atomic_load_explicit(&cy->finished, memory_order_acquire);
        int64_t i = atomic_load_explicit(&cy->next, memory_order_relaxed);
        if (i < atomic_load_explicit(&cy->produced, memory_order_acquire)) {
            if (atomic_compare_exchange_weak_explicit(&cy->next, &i, i + 1, memory_order_relaxed,
                                                      memory_order_relaxed))
                run_unit(cy, &cy->units[i], held);
        } else if (finished) {
            break;
        } else {
            sched_yield();
        }
    }
    mha_scratch_give(&cy->held, held);
}

/* Kernel transposes of `count` tiles of rows x cols elements, tile_floats apart. */
typedef struct tiles {
    const mha_kernels *kt;
    float *x;
    int64_t tile_floats;
    int32_t rows, cols, elem;
    mha_scratch scratch;
} tiles;

static void tile_item(void *arg, int64_t t)
{
    tiles *ts = arg;
    void *scratch = mha_scratch_take(&ts->scratch);
    ts->kt->transpose(ts->x + t * ts->tile_floats, ts->rows, ts->cols, ts->elem, scratch);
    mha_scratch_give(&ts->scratch, scratch);
}

mha_status mha_transpose_run(const mha_kernels *kt, float *x, int32_t batch, int32_t rows,
                             int32_t cols, int32_t elem)
{
    const int64_t matrix = (int64_t)rows * cols * elem;
    const size_t elem_bytes = (size_t)elem * sizeof(float);
    const int big = matrix * (int64_t)sizeof(float) > MHA_TRANSPOSE_TILE_BYTES;
    const int group = big && elem_bytes < CYCLE_MIN_BYTES;
    const int32_t br = group && rows >= cols ? split_factor(rows, cols, elem) : 0;
    const int32_t bc = group && !br ? split_factor(cols, rows, elem) : 0;

    /* The cycles move an r x c matrix of super-elements of sup floats. */
    const int64_t r = br ? rows / br : rows, c = bc ? cols / bc : cols, n = r * c;
    const int64_t sup = (int64_t)(br ? br : bc ? bc : 1) * elem;
    const int64_t workers = mha_parallel_width();
    int64_t seg = n / (workers * UNITS_PER_THREAD);
    seg = seg < UNIT_MIN ? UNIT_MIN : seg > UNIT_MAX ? UNIT_MAX : seg;

    /* The kernel's tiles: the whole matrix, or the [br][cols] / [rows][bc] tiles. */
    tiles ts = {.kt = kt, .x = x, .elem = elem, .rows = !big ? rows : br ? br : rows,
                .cols = !big ? cols : bc ? bc : cols};
    ts.tile_floats = (int64_t)ts.rows * ts.cols * elem;
    const int64_t count = !big ? batch : br ? (int64_t)batch * r : (int64_t)batch * c;
    if ((!big || br || bc)
        && mha_scratch_init(&ts.scratch,
                            kt->transpose_scratch_bytes(ts.rows, ts.cols, elem), count) != MHA_OK)
        return MHA_ERR_NOMEM;
    if (!big) {
        mha_parallel_for(count, tile_item, &ts);
        mha_scratch_free(&ts.scratch);
        return MHA_OK;
    }

    const size_t words = (size_t)(n + 63) / 64;
    const size_t saved = ((size_t)batch * (size_t)max_slots(n, seg) * (size_t)sup * sizeof(float)
                          + 63) / 64 * 64;
    char *buf = malloc(2 * words * sizeof(uint64_t) + saved
                       + (size_t)max_units(n, seg) * sizeof(unit));
    cycles cy = {.x = x, .batch = batch, .matrix = matrix, .sup = sup, .r = r, .c = c, .n = n,
                 .seg = seg};
    if (!buf || mha_scratch_init(&cy.held, (size_t)sup * sizeof(float), workers) != MHA_OK) {
        free(buf);
        mha_scratch_free(&ts.scratch);
        return MHA_ERR_NOMEM;
    }
    cy.done = (uint64_t *)buf;
    cy.leaders = cy.done + words;
    cy.saved = (float *)(cy.leaders + words);
    cy.units = (unit *)((char *)cy.saved + saved);
    atomic_init(&cy.produced, 0);
    atomic_init(&cy.next, 0);
    atomic_init(&cy.producing, 0);
    atomic_init(&cy.finished, 0);

    if (br)
        mha_parallel_for(count, tile_item, &ts);
    mha_parallel_for(cy.held.slots, cycles_item, &cy);
    if (bc)
        mha_parallel_for(count, tile_item, &ts);
    mha_scratch_free(&cy.held);
    mha_scratch_free(&ts.scratch);
    free(buf);
    return MHA_OK;
}
