/* tidepool's C ABI: an allocator built from a config string or the
 * environment, allocation with a stream, statistics, and the last error.
 *
 * Link with -ltidepool_c (libtidepool_c.so). Every symbol carries the version
 * it came in (TIDEPOOL_1.0; TIDEPOOL_1.1: tags, sleep and wake); a later
 * version only adds symbols, and the stats structs only grow at their end
 * (the get functions take the caller's sizeof).
 *
 * Every function that can fail returns a tidepool_status: TIDEPOOL_OK (0) or
 * a non-zero code, and then tidepool_last_error() says what was wrong. Bad
 * input (a bad config string, a pointer this allocator never handed out, a
 * double free, NULL arguments) is an error code, never a crash.
 * Allocators are thread-safe; the last error is per thread.
 */
#ifndef TIDEPOOL_TIDEPOOL_H
#define TIDEPOOL_TIDEPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TIDEPOOL_API __attribute__((visibility("default")))
#else
#define TIDEPOOL_API
#endif

/* The codes of tidepool::Errc, plus internal for an unexpected exception. */
typedef enum tidepool_status {
  TIDEPOOL_OK = 0,
  TIDEPOOL_ERROR_OUT_OF_MEMORY = 1,    /* the device or the pool cannot serve the request */
  TIDEPOOL_ERROR_INVALID_ARGUMENT = 2, /* a bad config string, setting or argument */
  TIDEPOOL_ERROR_INVALID_POINTER = 3,  /* a pointer this allocator never handed out */
  TIDEPOOL_ERROR_DOUBLE_FREE = 4,      /* a pointer handed out, then freed already */
  TIDEPOOL_ERROR_UNSUPPORTED = 5,      /* the mode or device is not available here */
  TIDEPOOL_ERROR_DEVICE = 6,           /* the driver or the OS refused */
  TIDEPOOL_ERROR_LIMIT_REACHED = 7,    /* an OS or driver limit */
  TIDEPOOL_ERROR_CORRUPT_DATA = 8,     /* a ledger segment or file that cannot be trusted */
  TIDEPOOL_ERROR_IO = 9,               /* a file or segment could not be read or written */
  TIDEPOOL_ERROR_INTERNAL = 10         /* an unexpected failure inside tidepool */
} tidepool_status;

/* An opaque stream handle: a cudaStream_t on CUDA; 0 is the default stream. */
typedef uintptr_t tidepool_stream;

typedef struct tidepool_allocator tidepool_allocator;

/* The allocator's statistics. The first group has JAX's memory_stats() names
 * and meanings; see tidepool::Stats in tidepool/allocator.hpp. */
typedef struct tidepool_stats {
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  int64_t num_allocs;
  int64_t largest_alloc_size;
  int64_t bytes_limit;
  int64_t bytes_reserved;
  int64_t peak_bytes_reserved;
  int64_t largest_free_block_bytes;
  int64_t pool_bytes;
  int64_t peak_pool_bytes;
  /* tidepool's own */
  int64_t num_device_allocs;
  int64_t num_device_frees;
  int64_t num_ooms;
  int64_t bytes_mapped;
  int64_t granules_free;
  int64_t num_maps;
  int64_t num_unmaps;
  int64_t num_stitches;
  int64_t num_releases;
  int64_t bytes_asleep; /* since 1.1: physical bytes given back by sleeping tags */
} tidepool_stats;

/* What a sleeping tag keeps (tidepool_sleep). */
typedef enum tidepool_keep {
  TIDEPOOL_KEEP_CONTENTS = 0, /* its blocks' bytes, copied to host memory and back at wake */
  TIDEPOOL_KEEP_NOTHING = 1   /* nothing: the memory comes back with undefined contents */
} tidepool_keep;

/* One tag of an allocator (tidepool_get_tag_stats). */
typedef struct tidepool_tag_stats {
  int64_t asleep;       /* 1 while asleep */
  int64_t bytes_in_use; /* its live blocks, asleep or not */
  int64_t bytes_asleep; /* physical bytes its sleep gave back; 0 while awake */
  int64_t host_bytes;   /* host copy held (asleep with contents, or kept for the next sleep) */
  int64_t sleeps;
  int64_t wakes;
} tidepool_tag_stats;

/* "0.1.0": the library's version. */
TIDEPOOL_API const char* tidepool_version(void);

/* "ok", "out_of_memory", "invalid_argument", ...; "unknown" for other values. */
TIDEPOOL_API const char* tidepool_status_name(int status);

/* The message of the last error on this thread ("" when none). Valid until
 * the next tidepool call on this thread. */
TIDEPOOL_API const char* tidepool_last_error(void);

/* Builds an allocator from a config string "key=value,key=value", e.g.
 * "mode=growth,device=host,capacity=16GiB". Keys (each the TIDEPOOL_*
 * variable of the same meaning, docs/configuration.md): mode, device,
 * capacity, mem_fraction, preallocate, release_threshold, idle_release,
 * aliases, wake_wait, quota, ledger, ledger_mode.
 * Keys not given take their defaults; the environment is not read. NULL or ""
 * is all defaults. out != NULL; *out is set only on success. */
TIDEPOOL_API int tidepool_create(const char* config, tidepool_allocator** out);

/* As tidepool_create, configured by the environment (XLA_PYTHON_CLIENT_* and
 * TIDEPOOL_*) as the tidepool command is. */
TIDEPOOL_API int tidepool_create_from_env(tidepool_allocator** out);

/* Destroys an allocator and gives its memory back to the device. Blocks
 * still allocated become invalid. NULL is a no-op. */
TIDEPOOL_API void tidepool_destroy(tidepool_allocator* allocator);

/* *out = a block of at least `bytes`, aligned to 256 bytes, usable on
 * `stream`; bytes == 0 gives NULL and TIDEPOOL_OK. out != NULL. */
TIDEPOOL_API int tidepool_allocate(tidepool_allocator* allocator, size_t bytes,
                                   tidepool_stream stream, void** out);

/* Frees a block from tidepool_allocate on this allocator; NULL is a no-op.
 * A pointer never handed out is TIDEPOOL_ERROR_INVALID_POINTER, one freed
 * already TIDEPOOL_ERROR_DOUBLE_FREE; neither changes the allocator. */
TIDEPOOL_API int tidepool_free(tidepool_allocator* allocator, void* ptr, tidepool_stream stream);

/* Copies the statistics into *out. out_size is sizeof(tidepool_stats) as the
 * caller was compiled; fields beyond it are not written, fields the library
 * lacks are zeroed. */
TIDEPOOL_API int tidepool_get_stats(const tidepool_allocator* allocator, tidepool_stats* out,
                                    size_t out_size);

/* Returns every cached, fully free piece of memory to the device; *released
 * (if not NULL) is the bytes given back. */
TIDEPOOL_API int tidepool_trim(tidepool_allocator* allocator, size_t* released);

/* The pool's name ("bfc", "growth", "platform", ...); NULL for NULL. Valid
 * while the allocator lives. */
TIDEPOOL_API const char* tidepool_allocator_name(const tidepool_allocator* allocator);

/* --- TIDEPOOL_1.1: tags, sleep and wake (docs/sleep.md); mode=expandable only,
 * TIDEPOOL_ERROR_UNSUPPORTED elsewhere. --- */

/* Allocations of the calling thread on `allocator` carry `tag` (1 to 64
 * bytes) until tidepool_tag_end; scopes nest, the innermost wins. A tag's
 * blocks live in memory of their own, so the tag can sleep alone. */
TIDEPOOL_API int tidepool_tag_begin(tidepool_allocator* allocator, const char* tag);

/* Closes the calling thread's innermost tag scope on `allocator`;
 * TIDEPOOL_ERROR_INVALID_ARGUMENT when none is open. */
TIDEPOOL_API int tidepool_tag_end(tidepool_allocator* allocator);

/* Gives the physical memory under `tag`'s blocks back to the device (and to
 * other processes, through the ledger): with TIDEPOOL_KEEP_CONTENTS their
 * bytes are copied to host memory first. Addresses stay reserved; the blocks
 * may be freed while asleep but not read or written. Errors: a tag that does
 * not exist or is asleep already (TIDEPOOL_ERROR_INVALID_ARGUMENT). */
TIDEPOOL_API int tidepool_sleep(tidepool_allocator* allocator, const char* tag, tidepool_keep keep);

/* Takes memory for `tag` again (waiting, bounded, for other processes to
 * free or trim), maps it at the same addresses and restores the contents
 * kept. TIDEPOOL_ERROR_OUT_OF_MEMORY (the message names who holds the
 * device) leaves the tag asleep; a tag that does not exist or is awake is
 * TIDEPOOL_ERROR_INVALID_ARGUMENT. */
TIDEPOOL_API int tidepool_wake(tidepool_allocator* allocator, const char* tag);

/* Copies the statistics of `tag` into *out (out_size as for
 * tidepool_get_stats); TIDEPOOL_ERROR_INVALID_ARGUMENT for an unknown tag. */
TIDEPOOL_API int tidepool_get_tag_stats(const tidepool_allocator* allocator, const char* tag,
                                        tidepool_tag_stats* out, size_t out_size);

#ifdef __cplusplus
}
#endif

#endif /* TIDEPOOL_TIDEPOOL_H */
