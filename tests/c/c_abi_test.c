/* The C ABI (tidepool.h) from C: create from a config string and from the
 * environment, allocate and free on streams, stats, the errors a caller can
 * make (bad config strings, double free, foreign pointers, NULLs), the
 * per-thread last error, tags with sleep and wake (every byte and pointer
 * kept), and the library's versioned, minimal symbol table.
 * argv[1]: the path of libtidepool_c.so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tidepool/tidepool.h"

static int failures = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

/* The call returned `code` and the last error contains `needle`. */
#define CHECK_ERROR(call, code, needle)                                            \
  do {                                                                             \
    int status_ = (call);                                                          \
    if (status_ != (code) || strstr(tidepool_last_error(), (needle)) == NULL) {    \
      fprintf(stderr, "%s:%d: %s returned %d (%s), message '%s'; wanted %d with '%s'\n", \
              __FILE__, __LINE__, #call, status_, tidepool_status_name(status_),    \
              tidepool_last_error(), (int)(code), (needle));                       \
      ++failures;                                                                  \
    }                                                                              \
  } while (0)

static void test_allocate_free_stats(void) {
  tidepool_allocator* allocator = NULL;
  CHECK(tidepool_create("mode=growth, device=host, capacity=1GiB", &allocator) == TIDEPOOL_OK);
  CHECK(allocator != NULL);
  if (allocator == NULL) return;
  CHECK(strcmp(tidepool_last_error(), "") == 0);
  CHECK(tidepool_allocator_name(allocator) != NULL);

  void* a = NULL;
  void* b = NULL;
  CHECK(tidepool_allocate(allocator, 1000, 0, &a) == TIDEPOOL_OK);
  CHECK(tidepool_allocate(allocator, 1 << 20, (tidepool_stream)7, &b) == TIDEPOOL_OK);
  CHECK(a != NULL && b != NULL && a != b);
  CHECK(((uintptr_t)a % 256) == 0 && ((uintptr_t)b % 256) == 0);
  /* Two live blocks do not overlap. */
  CHECK((char*)a + 1000 <= (char*)b || (char*)b + (1 << 20) <= (char*)a);

  tidepool_stats stats;
  memset(&stats, 0xff, sizeof stats);
  CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
  CHECK(stats.num_allocs == 2);
  CHECK(stats.bytes_in_use >= 1000 + (1 << 20));
  CHECK(stats.peak_bytes_in_use >= stats.bytes_in_use);
  CHECK(stats.largest_alloc_size >= (1 << 20));
  CHECK(stats.bytes_limit == (int64_t)(0.75 * (double)(1u << 30))); /* JAX's default fraction */
  CHECK(stats.bytes_reserved >= stats.bytes_in_use);

  void* zero = (void*)&stats;
  CHECK(tidepool_allocate(allocator, 0, 0, &zero) == TIDEPOOL_OK);
  CHECK(zero == NULL);

  CHECK(tidepool_free(allocator, a, 0) == TIDEPOOL_OK);
  CHECK(tidepool_free(allocator, b, (tidepool_stream)7) == TIDEPOOL_OK);
  CHECK(tidepool_free(allocator, NULL, 0) == TIDEPOOL_OK);
  CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
  CHECK(stats.bytes_in_use == 0);
  CHECK(stats.num_allocs == 2);

  /* An older, smaller struct gets only its fields. */
  int64_t two[3] = {-1, -1, 12345};
  CHECK(tidepool_get_stats(allocator, (tidepool_stats*)two, 2 * sizeof(int64_t)) == TIDEPOOL_OK);
  CHECK(two[0] == 0 && two[1] == stats.peak_bytes_in_use && two[2] == 12345);

  size_t released = 0;
  CHECK(tidepool_trim(allocator, &released) == TIDEPOOL_OK);
  CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
  CHECK(stats.bytes_reserved == 0);
  CHECK(released > 0);
  tidepool_destroy(allocator);
}

static void test_pointer_errors(void) {
  tidepool_allocator* allocator = NULL;
  CHECK(tidepool_create("mode=growth,device=host,capacity=256MiB", &allocator) == TIDEPOOL_OK);
  if (allocator == NULL) return;
  void* block = NULL;
  CHECK(tidepool_allocate(allocator, 4096, 0, &block) == TIDEPOOL_OK);
  CHECK(tidepool_free(allocator, block, 0) == TIDEPOOL_OK);
  CHECK_ERROR(tidepool_free(allocator, block, 0), TIDEPOOL_ERROR_DOUBLE_FREE, "");
  CHECK(strlen(tidepool_last_error()) > 0);

  int on_stack = 0;
  CHECK_ERROR(tidepool_free(allocator, &on_stack, 0), TIDEPOOL_ERROR_INVALID_POINTER, "");
  CHECK(strlen(tidepool_last_error()) > 0);

  /* A block of another allocator is foreign here. */
  tidepool_allocator* other = NULL;
  CHECK(tidepool_create("mode=platform,device=host,capacity=64MiB", &other) == TIDEPOOL_OK);
  void* theirs = NULL;
  if (other != NULL) {
    CHECK(tidepool_allocate(other, 512, 0, &theirs) == TIDEPOOL_OK);
    CHECK_ERROR(tidepool_free(allocator, theirs, 0), TIDEPOOL_ERROR_INVALID_POINTER, "");
    CHECK(tidepool_free(other, theirs, 0) == TIDEPOOL_OK);
    tidepool_destroy(other);
  }

  /* Beyond the pool's limit: out of memory, and the allocator still works. */
  void* huge = (void*)&on_stack;
  /* Its hint names the key this caller used, not an environment variable. */
  CHECK_ERROR(tidepool_allocate(allocator, (size_t)1 << 30, 0, &huge), TIDEPOOL_ERROR_OUT_OF_MEMORY,
              "raise mem_fraction");
  CHECK(strstr(tidepool_last_error(), "TIDEPOOL_") == NULL);
  CHECK(huge == (void*)&on_stack); /* untouched on failure */
  CHECK(tidepool_allocate(allocator, 4096, 0, &block) == TIDEPOOL_OK);
  CHECK(tidepool_free(allocator, block, 0) == TIDEPOOL_OK);

  CHECK_ERROR(tidepool_allocate(NULL, 16, 0, &block), TIDEPOOL_ERROR_INVALID_ARGUMENT, "allocator is NULL");
  CHECK_ERROR(tidepool_allocate(allocator, 16, 0, NULL), TIDEPOOL_ERROR_INVALID_ARGUMENT, "out is NULL");
  CHECK_ERROR(tidepool_free(NULL, block, 0), TIDEPOOL_ERROR_INVALID_ARGUMENT, "allocator is NULL");
  CHECK_ERROR(tidepool_get_stats(allocator, NULL, 8), TIDEPOOL_ERROR_INVALID_ARGUMENT, "out is NULL");
  CHECK(tidepool_allocator_name(NULL) == NULL);
  tidepool_destroy(allocator);
  tidepool_destroy(NULL);
}

static void test_bad_config_strings(void) {
  tidepool_allocator* allocator = (tidepool_allocator*)&failures; /* must stay untouched */
  tidepool_allocator* const untouched = allocator;
  CHECK_ERROR(tidepool_create("mode=sideways", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "mode='sideways' is invalid");
  CHECK(strstr(tidepool_last_error(), "growth") != NULL); /* lists what is allowed */
  CHECK_ERROR(tidepool_create("colour=blue", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "unknown key 'colour'");
  CHECK_ERROR(tidepool_create("mode", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT, "no '='");
  CHECK_ERROR(tidepool_create("mode=growth,mode=platform", &allocator),
              TIDEPOOL_ERROR_INVALID_ARGUMENT, "a second time");
  CHECK_ERROR(tidepool_create("device=host,capacity=lots", &allocator),
              TIDEPOOL_ERROR_INVALID_ARGUMENT, "capacity='lots'");
  CHECK_ERROR(tidepool_create("mem_fraction=1.5", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "mem_fraction='1.5'");
  CHECK_ERROR(tidepool_create("mode=growth,preallocate=true", &allocator),
              TIDEPOOL_ERROR_INVALID_ARGUMENT, "contradicts preallocate='true'");
  CHECK_ERROR(tidepool_create("=3", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT, "no key");
  CHECK_ERROR(tidepool_create("mode=growth", NULL), TIDEPOOL_ERROR_INVALID_ARGUMENT, "out is NULL");
  /* A value the config layer accepts but the device refuses: named by its key too. */
  CHECK_ERROR(tidepool_create("device=host,capacity=1MiB", &allocator),
              TIDEPOOL_ERROR_INVALID_ARGUMENT, "capacity='1MiB' cannot make a host device");
  CHECK(allocator == untouched);
  CHECK(strcmp(tidepool_status_name(TIDEPOOL_ERROR_DOUBLE_FREE), "double_free") == 0);
  CHECK(strcmp(tidepool_status_name(TIDEPOOL_ERROR_INTERNAL), "internal") == 0);
  CHECK(strcmp(tidepool_status_name(99), "unknown") == 0);
}

static void test_from_env(void) {
  setenv("TIDEPOOL_DEVICE", "host", 1);
  setenv("TIDEPOOL_HOST_CAPACITY", "2GiB", 1);
  setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false", 1);
  setenv("XLA_CLIENT_MEM_FRACTION", "0.5", 1);
  tidepool_allocator* allocator = NULL;
  CHECK(tidepool_create_from_env(&allocator) == TIDEPOOL_OK);
  if (allocator != NULL) {
    tidepool_stats stats;
    CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
    CHECK(stats.bytes_limit == (int64_t)1 << 30);
    CHECK(stats.bytes_reserved == 0); /* growth: nothing taken up front */
    tidepool_destroy(allocator);
  }
  /* A config string does not read the environment. */
  setenv("TIDEPOOL_ALLOCATOR", "nonsense", 1);
  CHECK(tidepool_create("device=host,capacity=64MiB,mode=platform", &allocator) == TIDEPOOL_OK);
  tidepool_destroy(allocator);
  CHECK_ERROR(tidepool_create_from_env(&allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "TIDEPOOL_ALLOCATOR='nonsense'");
  unsetenv("TIDEPOOL_ALLOCATOR");
}

static void* fail_on_thread(void* unused) {
  (void)unused;
  tidepool_allocator* allocator = NULL;
  int status = tidepool_create("bogus=1", &allocator);
  return (void*)(intptr_t)(status != TIDEPOOL_OK && strstr(tidepool_last_error(), "bogus") != NULL);
}

static void test_last_error_is_per_thread(void) {
  tidepool_allocator* allocator = NULL;
  CHECK_ERROR(tidepool_create("mode=nowhere", &allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT, "nowhere");
  pthread_t thread;
  void* thread_saw_its_error = NULL;
  CHECK(pthread_create(&thread, NULL, fail_on_thread, NULL) == 0);
  CHECK(pthread_join(thread, &thread_saw_its_error) == 0);
  CHECK(thread_saw_its_error == (void*)1);
  CHECK(strstr(tidepool_last_error(), "nowhere") != NULL); /* this thread's error is unchanged */
  /* A call that succeeds clears it. */
  CHECK(tidepool_create("device=host,capacity=64MiB", &allocator) == TIDEPOOL_OK);
  CHECK(strcmp(tidepool_last_error(), "") == 0);
  tidepool_destroy(allocator);
}

static void test_sleep_and_wake(void) {
  tidepool_allocator* allocator = NULL;
  CHECK(tidepool_create("mode=expandable, device=host, capacity=1GiB", &allocator) == TIDEPOOL_OK);
  if (allocator == NULL) return;
  enum { kBlocks = 8 };
  unsigned char* blocks[kBlocks];
  size_t sizes[kBlocks];
  CHECK(tidepool_tag_begin(allocator, "weights") == TIDEPOOL_OK);
  for (int b = 0; b < kBlocks; ++b) {
    sizes[b] = (size_t)(b + 1) * 700 * 1024;
    blocks[b] = NULL;
    CHECK(tidepool_allocate(allocator, sizes[b], 0, (void**)&blocks[b]) == TIDEPOOL_OK);
    if (blocks[b] == NULL) return;
    for (size_t i = 0; i < sizes[b]; ++i) blocks[b][i] = (unsigned char)(i * 31 + (size_t)b);
  }
  CHECK(tidepool_tag_end(allocator) == TIDEPOOL_OK);
  void* plain = NULL;
  CHECK(tidepool_allocate(allocator, 4096, 0, &plain) == TIDEPOOL_OK);  /* untagged */

  CHECK(tidepool_sleep(allocator, "weights", TIDEPOOL_KEEP_CONTENTS) == TIDEPOOL_OK);
  tidepool_stats stats;
  CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
  CHECK(stats.bytes_asleep > 0);
  tidepool_tag_stats tag;
  CHECK(tidepool_get_tag_stats(allocator, "weights", &tag, sizeof tag) == TIDEPOOL_OK);
  CHECK(tag.asleep == 1 && tag.bytes_asleep == stats.bytes_asleep && tag.sleeps == 1);
  memset(plain, 7, 4096); /* untagged memory stays usable */

  CHECK_ERROR(tidepool_sleep(allocator, "weights", TIDEPOOL_KEEP_NOTHING), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "the tag is asleep");
  CHECK_ERROR(tidepool_wake(allocator, "never"), TIDEPOOL_ERROR_INVALID_ARGUMENT, "no tag of that name");
  CHECK_ERROR(tidepool_sleep(allocator, "weights", (tidepool_keep)5), TIDEPOOL_ERROR_INVALID_ARGUMENT, "keep 5");
  CHECK_ERROR(tidepool_sleep(allocator, NULL, TIDEPOOL_KEEP_CONTENTS), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "tag is NULL");
  CHECK_ERROR(tidepool_tag_end(allocator), TIDEPOOL_ERROR_INVALID_ARGUMENT, "no tag scope is open");
  CHECK_ERROR(tidepool_get_tag_stats(allocator, "never", &tag, sizeof tag), TIDEPOOL_ERROR_INVALID_ARGUMENT,
              "no tag 'never'");

  CHECK(tidepool_wake(allocator, "weights") == TIDEPOOL_OK);
  CHECK_ERROR(tidepool_wake(allocator, "weights"), TIDEPOOL_ERROR_INVALID_ARGUMENT, "the tag is awake");
  int intact = 1;
  for (int b = 0; b < kBlocks; ++b) {
    for (size_t i = 0; i < sizes[b]; ++i) intact &= blocks[b][i] == (unsigned char)(i * 31 + (size_t)b);
  }
  CHECK(intact);
  CHECK(tidepool_get_stats(allocator, &stats, sizeof stats) == TIDEPOOL_OK);
  CHECK(stats.bytes_asleep == 0);
  for (int b = 0; b < kBlocks; ++b) CHECK(tidepool_free(allocator, blocks[b], 0) == TIDEPOOL_OK);
  CHECK(tidepool_free(allocator, plain, 0) == TIDEPOOL_OK);
  tidepool_destroy(allocator);

  /* Another mode: a clear refusal. */
  CHECK(tidepool_create("mode=growth, device=host, capacity=1GiB", &allocator) == TIDEPOOL_OK);
  if (allocator == NULL) return;
  CHECK_ERROR(tidepool_tag_begin(allocator, "weights"), TIDEPOOL_ERROR_UNSUPPORTED, "need mode=expandable");
  tidepool_destroy(allocator);
}

static void test_symbols(const char* library) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  CHECK(handle != NULL);
  if (handle == NULL) {
    fprintf(stderr, "dlopen(%s): %s\n", library, dlerror());
    return;
  }
  CHECK(dlvsym(handle, "tidepool_create", "TIDEPOOL_1.0") != NULL);
  CHECK(dlvsym(handle, "tidepool_get_stats", "TIDEPOOL_1.0") != NULL);
  CHECK(dlvsym(handle, "tidepool_create", "TIDEPOOL_9.9") == NULL);
  CHECK(dlvsym(handle, "tidepool_sleep", "TIDEPOOL_1.1") != NULL);
  CHECK(dlvsym(handle, "tidepool_wake", "TIDEPOOL_1.1") != NULL);
  CHECK(dlvsym(handle, "tidepool_tag_begin", "TIDEPOOL_1.1") != NULL);
  CHECK(dlvsym(handle, "tidepool_sleep", "TIDEPOOL_1.0") == NULL);
  /* The C++ inside is not exported. */
  CHECK(dlsym(handle, "_ZN8tidepool8bindings10make_stackERKNS_6ConfigE") == NULL);
  CHECK(dlsym(handle, "_ZN8tidepool9errc_nameENS_4ErrcE") == NULL);
  /* Never unloaded (-z nodelete): the thread that places step plans lives as
   * long as the process, whatever dlclose is called. */
  struct link_map* map = NULL;
  CHECK(dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL);
  int nodelete = 0;
  for (const ElfW(Dyn)* entry = map != NULL ? map->l_ld : NULL; entry != NULL && entry->d_tag != DT_NULL; ++entry) {
    if (entry->d_tag == DT_FLAGS_1 && (entry->d_un.d_val & DF_1_NODELETE) != 0) nodelete = 1;
  }
  CHECK(nodelete);
  dlclose(handle);
}

int main(int argc, char** argv) {
  test_allocate_free_stats();
  test_pointer_errors();
  test_bad_config_strings();
  test_from_env();
  test_last_error_is_per_thread();
  test_sleep_and_wake();
  if (argc > 1) test_symbols(argv[1]);
  else CHECK(!"usage: c_abi_test PATH_OF_libtidepool_c.so");
  printf("c_abi_test: tidepool %s, %d failure(s)\n", tidepool_version(), failures);
  return failures == 0 ? 0 : 1;
}
