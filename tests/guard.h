/* Buffers placed flush against a PROT_NONE page, so that a kernel reading or
 * writing one float past either end of its buffer crashes the test. */
#ifndef MHA_TESTS_GUARD_H
#define MHA_TESTS_GUARD_H

#include <stddef.h>

typedef enum guard_side { GUARD_AFTER, GUARD_BEFORE } guard_side;

/* n floats whose last (GUARD_AFTER) or first (GUARD_BEFORE) byte touches a guard
   page; never NULL (exits on failure). Free with guard_free. */
float *guard_alloc(size_t n, guard_side side);
void guard_free(float *p, size_t n, guard_side side);
/* The same in bytes: reading one byte past the end (or before the start) crashes. */
void *guard_alloc_bytes(size_t n, guard_side side);
void guard_free_bytes(void *p, size_t n, guard_side side);

#endif
