#define _DEFAULT_SOURCE
#include "guard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t page(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* Layout: guard page, data pages, guard page; the buffer sits at one end of the data. */
static size_t data_bytes(size_t bytes)
{
    return (bytes + page() - 1) / page() * page();
}

void *guard_alloc_bytes(size_t n, guard_side side)
{
    const size_t pg = page(), data = data_bytes(n ? n : 1);
    char *base = mmap(NULL, data + 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED) {
        perror("guard_alloc");
        exit(1);
    }
    if (mprotect(base, pg, PROT_NONE) || mprotect(base + pg + data, pg, PROT_NONE)) {
        perror("guard_alloc");
        exit(1);
    }
    char *start = base + pg;
    return side == GUARD_BEFORE ? start : start + data - n;
}

void guard_free_bytes(void *p, size_t n, guard_side side)
{
    const size_t pg = page(), data = data_bytes(n ? n : 1);
    char *start = side == GUARD_BEFORE ? (char *)p : (char *)p + n - data;
    munmap(start - pg, data + 2 * pg);
}

float *guard_alloc(size_t n, guard_side side)
{
    return guard_alloc_bytes(n * sizeof(float), side);
}

void guard_free(float *p, size_t n, guard_side side)
{
    guard_free_bytes(p, n * sizeof(float), side);
}
