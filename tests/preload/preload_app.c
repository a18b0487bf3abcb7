/* A program linked against the fake driver (fake_cuda.c) that allocates the
 * way frameworks do: directly linked calls, cuGetProcAddress (old and _v2
 * names, both stream flavours) and dlopen + dlsym. It prints one
 * "name value..." line per step for interposer_check to assert on.
 * With --wait it prints "ready" while still holding memory and waits for a
 * line on stdin before freeing and exiting (leaving 1 MiB unfreed). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda.h"

typedef int (*mem_alloc_fn)(unsigned long long*, size_t);
typedef int (*mem_free_fn)(unsigned long long);
typedef int (*mem_get_info_fn)(size_t*, size_t*);
typedef int (*mem_alloc_async_fn)(unsigned long long*, size_t, void*);
typedef int (*mem_free_async_fn)(unsigned long long, void*);

/* ISO C has no cast between object and function pointers: copy the bits. */
#define AS_FUNCTION(type, pointer, out) memcpy(&(out), &(pointer), sizeof(type))

static const size_t MiB = (size_t)1 << 20;

/* Counts the loaded objects whose name contains `data` (a string). */
static int count_loaded(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  const char** needle = (const char**)data;
  if (info->dlpi_name != NULL && strstr(info->dlpi_name, needle[0]) != NULL) needle[1] = "1";
  return 0;
}

int main(int argc, char** argv) {
  const int wait = argc > 1 && strcmp(argv[1], "--wait") == 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("pid %d\n", (int)getpid());
  printf("init %d\n", cuInit(0));
  /* The interposer must not bring a CUDA runtime into the program. */
  const char* cudart[2] = {"libcudart", "0"};
  dl_iterate_phdr(count_loaded, cudart);
  printf("cudart_loaded %s\n", cudart[1]);

  size_t free_bytes = 0, total = 0;
  int rc = cuMemGetInfo_v2(&free_bytes, &total);
  printf("info0 %d %zu %zu\n", rc, free_bytes, total);

  /* JAX's default: preallocate 75% of the total. */
  const size_t preallocation = total / 4 * 3;
  unsigned long long big = 0;
  printf("alloc75 %d %zu\n", cuMemAlloc_v2(&big, preallocation), preallocation);
  rc = cuMemGetInfo_v2(&free_bytes, &total);
  printf("info1 %d %zu %zu\n", rc, free_bytes, total);

  unsigned long long beyond = 0;
  printf("beyond %d\n", cuMemAlloc_v2(&beyond, free_bytes + MiB));

  /* The runtime's way: cuGetProcAddress_v2 for cuMemAlloc, the old
   * cuGetProcAddress for cuMemFree. */
  void* pointer = NULL;
  int status = -1;
  mem_alloc_fn proc_alloc = NULL;
  mem_free_fn proc_free = NULL;
  rc = cuGetProcAddress_v2("cuMemAlloc", &pointer, 12000, 0, &status);
  AS_FUNCTION(mem_alloc_fn, pointer, proc_alloc);
  unsigned long long small = 0;
  printf("proc_alloc %d %d\n", rc, rc == 0 ? proc_alloc(&small, MiB) : -1);
  rc = cuGetProcAddress("cuMemFree", &pointer, 11030, 0);
  AS_FUNCTION(mem_free_fn, pointer, proc_free);
  printf("proc_free %d %d\n", rc, rc == 0 ? proc_free(small) : -1);
  printf("proc_beyond %d\n", proc_alloc(&small, free_bytes + MiB));

  /* cuGetProcAddress for itself, then the per-thread-stream async pair. */
  void* self = NULL;
  rc = cuGetProcAddress_v2("cuGetProcAddress", &self, 12000, 0, &status);
  int (*gpa)(const char*, void**, int, uint64_t, int*) = NULL;
  AS_FUNCTION(void*, self, gpa);
  mem_alloc_async_fn alloc_async = NULL;
  mem_free_async_fn free_async = NULL;
  rc |= gpa("cuMemAllocAsync", &pointer, 12000, 2, &status);
  AS_FUNCTION(mem_alloc_async_fn, pointer, alloc_async);
  rc |= gpa("cuMemFreeAsync", &pointer, 12000, 2, &status);
  AS_FUNCTION(mem_free_async_fn, pointer, free_async);
  unsigned long long async_block = 0;
  printf("lookup_async %d\n", rc);
  printf("async_beyond %d\n", alloc_async(&async_block, free_bytes + MiB, NULL));
  int async_alloc = alloc_async(&async_block, 4 * MiB, NULL);
  printf("async %d %d\n", async_alloc, free_async(async_block, NULL));

  /* XLA's way: dlopen the driver and dlsym each function. */
  Dl_info where;
  void* counts_function = NULL;
  void (*get_counts)(struct fake_cuda_counts*) = fake_cuda_get_counts;
  memcpy(&counts_function, &get_counts, sizeof counts_function);
  dladdr(counts_function, &where);
  void* driver = dlopen(where.dli_fname, RTLD_NOW | RTLD_LOCAL);
  mem_get_info_fn dl_info = NULL;
  mem_alloc_fn dl_alloc = NULL;
  mem_free_fn dl_free = NULL;
  pointer = driver ? dlsym(driver, "cuMemGetInfo_v2") : NULL;
  AS_FUNCTION(mem_get_info_fn, pointer, dl_info);
  pointer = driver ? dlsym(driver, "cuMemAlloc_v2") : NULL;
  AS_FUNCTION(mem_alloc_fn, pointer, dl_alloc);
  pointer = driver ? dlsym(driver, "cuMemFree_v2") : NULL;
  AS_FUNCTION(mem_free_fn, pointer, dl_free);
  if (dl_info && dl_alloc && dl_free) {
    size_t dl_free_bytes = 0, dl_total = 0;
    rc = dl_info(&dl_free_bytes, &dl_total);
    printf("dlsym_info %d %zu %zu\n", rc, dl_free_bytes, dl_total);
    printf("dlsym_beyond %d\n", dl_alloc(&small, dl_free_bytes + MiB));
    rc = dl_alloc(&small, 2 * MiB);
    printf("dlsym_alloc %d %d\n", rc, dl_free(small));
  } else {
    printf("dlsym_missing %s\n", dlerror());
  }

  /* Virtual memory: physical memory on device 0. */
  fake_allocation_prop prop;
  memset(&prop, 0, sizeof prop);
  prop.type = 1;
  prop.location.type = 1;
  prop.location.id = 0;
  unsigned long long handle = 0;
  printf("create_beyond %d\n", cuMemCreate(&handle, free_bytes + MiB, &prop, 0));
  rc = cuMemCreate(&handle, 64 * MiB, &prop, 0);
  printf("create %d %d\n", rc, cuMemRelease(handle));

  /* A free the driver refuses is still refused. */
  printf("double_free %d\n", cuMemFree_v2(small));

  unsigned long long leak = 0;
  printf("leak %d\n", cuMemAlloc_v2(&leak, MiB));
  if (wait) {
    printf("ready\n");
    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL) return 3;
  }
  printf("free75 %d\n", cuMemFree_v2(big));
  rc = cuMemGetInfo_v2(&free_bytes, &total);
  printf("info2 %d %zu %zu\n", rc, free_bytes, total);

  fake_cuda_print_counts();
  printf("used %zu\n", fake_cuda_used_bytes());
  return 0;
}
