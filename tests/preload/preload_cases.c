/* The interposer's regression cases, one per run: `preload_cases CASE`
 * (linked against the fake driver, fake_cuda.c) prints one
 * "name value..." line per step for interposer_check to assert on.
 *   default-dlsym  dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") finds the
 *                  interposer's own export before any other call.
 *   ptds-first     cuGetProcAddress for the per-thread-stream
 *                  cuMemAllocAsync before any legacy call.
 *   create         cuMemCreate before cuInit, then on device 1 with no
 *                  current context.
 *   total-mem      cuDeviceTotalMem_v2, exported and by cuGetProcAddress.
 *   future         cuGetProcAddress at a CUDA version newer than known. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "fake_cuda.h"

typedef int (*mem_alloc_fn)(unsigned long long*, size_t);
typedef int (*mem_free_fn)(unsigned long long);
typedef int (*mem_alloc_async_fn)(unsigned long long*, size_t, void*);
typedef int (*mem_free_async_fn)(unsigned long long, void*);
typedef int (*device_total_mem_fn)(size_t*, int);

/* ISO C has no cast between object and function pointers: copy the bits. */
#define AS_FUNCTION(type, pointer, out) memcpy(&(out), &(pointer), sizeof(type))

static const size_t KiB = (size_t)1 << 10;
static const size_t MiB = (size_t)1 << 20;
static const size_t GiB = (size_t)1 << 30;

static int default_dlsym(void) {
  cuInit(0);
  void* pointer = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  mem_alloc_fn alloc = NULL;
  AS_FUNCTION(mem_alloc_fn, pointer, alloc);
  pointer = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  mem_free_fn release = NULL;
  AS_FUNCTION(mem_free_fn, pointer, release);
  unsigned long long small = 0, big = 0;
  const int small_rc = alloc(&small, 4 * KiB);
  const int big_rc = alloc(&big, 64 * MiB);
  printf("default_alloc %d %d\n", small_rc, big_rc);
  size_t free_bytes = 0, total = 0;
  cuMemGetInfo_v2(&free_bytes, &total);
  printf("default_info %zu %zu\n", free_bytes, total);
  printf("default_free %d %d\n", release(small), release(big));
  /* The direct call afterwards reaches the same driver function once. */
  unsigned long long direct = 0;
  const int direct_rc = cuMemAlloc_v2(&direct, MiB);
  printf("direct %d %d\n", direct_rc, cuMemFree_v2(direct));
  fake_cuda_print_counts();
  return 0;
}

static int ptds_first(void) {
  cuInit(0);
  void* pointer = NULL;
  int status = 0;
  mem_alloc_async_fn alloc_ptsz = NULL;
  mem_free_async_fn free_ptsz = NULL;
  int rc = cuGetProcAddress_v2("cuMemAllocAsync", &pointer, 12000, 2, &status);
  AS_FUNCTION(mem_alloc_async_fn, pointer, alloc_ptsz);
  rc |= cuGetProcAddress_v2("cuMemFreeAsync", &pointer, 12000, 2, &status);
  AS_FUNCTION(mem_free_async_fn, pointer, free_ptsz);
  unsigned long long block = 0;
  const int ptsz_alloc = alloc_ptsz(&block, 4 * MiB, NULL);
  printf("ptsz %d %d %d\n", rc, ptsz_alloc, free_ptsz(block, NULL));
  /* A legacy-stream caller of the exported names. */
  const int legacy_alloc = cuMemAllocAsync(&block, 4 * MiB, NULL);
  printf("legacy %d %d\n", legacy_alloc, cuMemFreeAsync(block, NULL));
  fake_cuda_print_counts();
  return 0;
}

static int create(void) {
  fake_allocation_prop prop;
  memset(&prop, 0, sizeof prop);
  prop.type = 1;
  prop.location.type = 1;
  unsigned long long handle = 0;
  printf("create_uninitialized %d\n", cuMemCreate(&handle, MiB, &prop, 0));
  cuInit(0);
  fake_cuda_set_current(-1); /* cuMemCreate needs no context */
  prop.location.id = 1;      /* the 8 GiB device */
  unsigned long long first = 0, beyond = 0;
  const int first_rc = cuMemCreate(&first, 3 * GiB, &prop, 0);
  printf("create_device1 %d %d\n", first_rc, cuMemCreate(&beyond, 2 * GiB, &prop, 0));
  printf("release_device1 %d\n", cuMemRelease(first));
  prop.location.id = 0;
  const int device0_rc = cuMemCreate(&handle, 6 * GiB, &prop, 0);
  printf("create_device0 %d %d\n", device0_rc, cuMemRelease(handle));
  fake_cuda_print_counts();
  return 0;
}

static int total_mem(void) {
  cuInit(0);
  size_t device0 = 0, device1 = 0, by_proc = 0;
  const int rc0 = cuDeviceTotalMem_v2(&device0, 0);
  const int rc1 = cuDeviceTotalMem_v2(&device1, 1);
  printf("total %d %zu %d %zu\n", rc0, device0, rc1, device1);
  void* pointer = NULL;
  int status = 0;
  device_total_mem_fn proc = NULL;
  int rc = cuGetProcAddress_v2("cuDeviceTotalMem", &pointer, 12000, 0, &status);
  AS_FUNCTION(device_total_mem_fn, pointer, proc);
  const int proc_rc = rc == 0 ? proc(&by_proc, 0) : -1;
  printf("proc_total %d %d %zu\n", rc, proc_rc, by_proc);
  printf("bad_device %d\n", cuDeviceTotalMem_v2(&by_proc, 7));
  /* Allocating registers the entry; the size reported stays the quota. */
  unsigned long long block = 0;
  const int alloc_rc = cuMemAlloc_v2(&block, MiB);
  cuDeviceTotalMem_v2(&device0, 0);
  printf("total_after_alloc %d %zu %d\n", alloc_rc, device0, cuMemFree_v2(block));
  return 0;
}

static int future(void) {
  cuInit(0);
  void *known_alloc = NULL, *future_alloc = NULL, *known_free = NULL, *future_free = NULL;
  int status = 0;
  int rc = cuGetProcAddress_v2("cuMemAlloc", &known_alloc, 12000, 0, &status);
  rc |= cuGetProcAddress_v2("cuMemAlloc", &future_alloc, 99000, 0, &status);
  rc |= cuGetProcAddress_v2("cuMemFree", &known_free, 12000, 0, &status);
  rc |= cuGetProcAddress_v2("cuMemFree", &future_free, 99000, 0, &status);
  /* The same function at both versions comes back wrapped, the same. */
  printf("future_lookup %d\n", rc);
  printf("future_same_free %d\n", known_free == future_free);
  printf("future_same_alloc %d\n", known_alloc == future_alloc);
  /* The newer revision is handed out unwrapped: the quota does not hold it. */
  mem_alloc_fn alloc = NULL;
  AS_FUNCTION(mem_alloc_fn, future_alloc, alloc);
  unsigned long long block = 0;
  printf("future_alloc %d\n", alloc(&block, 2 * GiB));
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* name = argc > 1 ? argv[1] : "";
  if (strcmp(name, "default-dlsym") == 0) return default_dlsym();
  if (strcmp(name, "ptds-first") == 0) return ptds_first();
  if (strcmp(name, "create") == 0) return create();
  if (strcmp(name, "total-mem") == 0) return total_mem();
  if (strcmp(name, "future") == 0) return future();
  fprintf(stderr, "preload_cases: unknown case '%s'; allowed: default-dlsym, ptds-first, create, total-mem, "
                  "future\n", name);
  return 2;
}
