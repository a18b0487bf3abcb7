/* The fake driver's few types and its test-only functions (fake_cuda.c). */
#ifndef TIDEPOOL_TESTS_FAKE_CUDA_H
#define TIDEPOOL_TESTS_FAKE_CUDA_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NOT_FOUND = 500
};

typedef struct {
  char bytes[16];
} fake_uuid;

/* The layout of CUmemAllocationProp. */
typedef struct {
  int type;
  int requested_handle_types;
  struct {
    int type; /* 1: CU_MEM_LOCATION_TYPE_DEVICE */
    int id;
  } location;
  void* win32_handle_metadata;
  unsigned char alloc_flags[8];
} fake_allocation_prop;

/* Calls that reached the driver. */
struct fake_cuda_counts {
  long mem_alloc, mem_free, mem_get_info, mem_alloc_async, mem_free_async;
  long mem_create, mem_release, get_proc_address, per_thread_stream_calls, device_total_mem;
  long address_reserve, mem_map, mem_unmap, ctx_synchronize;
};

int cuInit(unsigned int flags);
int cuMemAlloc_v2(unsigned long long* dptr, size_t bytes);
int cuMemFree_v2(unsigned long long dptr);
int cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes);
int cuDeviceTotalMem_v2(size_t* bytes, int device);
int cuMemAllocAsync(unsigned long long* dptr, size_t bytes, void* stream);
int cuMemFreeAsync(unsigned long long dptr, void* stream);
int cuMemCreate(unsigned long long* handle, size_t bytes, const void* prop, unsigned long long flags);
int cuMemRelease(unsigned long long handle);
int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags);
int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status);
int cuCtxSynchronize(void);

void fake_cuda_get_counts(struct fake_cuda_counts* out);
/* Prints the counts as the one "driver_calls ..." line the tests parse. */
static inline void fake_cuda_print_counts(void) {
  struct fake_cuda_counts counts;
  fake_cuda_get_counts(&counts);
  printf("driver_calls mem_alloc=%ld mem_free=%ld mem_alloc_async=%ld mem_free_async=%ld mem_create=%ld "
         "mem_release=%ld per_thread=%ld\n",
         counts.mem_alloc, counts.mem_free, counts.mem_alloc_async, counts.mem_free_async, counts.mem_create,
         counts.mem_release, counts.per_thread_stream_calls);
  printf("vmm_calls address_reserve=%ld mem_map=%ld mem_unmap=%ld ctx_synchronize=%ld\n", counts.address_reserve,
         counts.mem_map, counts.mem_unmap, counts.ctx_synchronize);
}
size_t fake_cuda_used_bytes(void);
/* cuMemAlloc past any interposer: memory of "another allocator". */
int fake_cuda_mem_alloc_direct(unsigned long long* dptr, size_t bytes);
/* Makes `device`'s context current; -1: none. */
void fake_cuda_set_current(int device);

#endif
