/* A fake CUDA driver for the interposer's test, built as libcuda.so.1 (the
 * interposer looks for that name when the driver is loaded RTLD_LOCAL):
 * exports the driver symbols the interposer wraps (and those it asks:
 * cuCtxGetDevice, cuDeviceGetUuid_v2, cuDeviceTotalMem_v2) with the driver's
 * ABI, counts the calls that reach it, and hands out host memory (mapped
 * MAP_NORESERVE: committed only where written) from two "devices", 16 GiB
 * and 8 GiB. cuInit makes device 0
 * current; fake_cuda_set_current() changes that (-1: no context). Like the
 * real driver, cuGetProcAddress answers with internal functions, not with
 * the exported symbols (which LD_PRELOAD replaces), and from CUDA 99.0 on it
 * answers "cuMemAlloc" with a newer revision (the same behaviour, another
 * function), as a future driver would.
 *
 * Virtual memory, as HostDevice does it on the CPU: cuMemAddressReserve
 * reserves address space (mmap PROT_NONE), cuMemCreate makes a memfd of the
 * size, cuMemMap maps it there (MAP_SHARED|MAP_FIXED, still inaccessible),
 * cuMemSetAccess makes it readable and writable, cuMemUnmap puts the
 * reservation back, so data written through a mapping is real memory. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

enum { kDevices = 2, kMaxLive = 16384 };
static const size_t kTotal[kDevices] = {(size_t)16 << 30, (size_t)8 << 30};
enum { kGranularity = 2 << 20, kMaxReservations = 64 };
static struct {
  unsigned long long key; /* address or handle; 0: empty */
  size_t bytes;
  int device;
  int memfd; /* a handle's memory; -1 for an address */
} live[kMaxLive];
static struct {
  uintptr_t base; /* 0: empty */
  size_t bytes;
} reservations[kMaxReservations];
static size_t used[kDevices];
static unsigned long long next_handle = 1;
static int initialized;
static int current = -1; /* the current context's device; -1: none */
static struct fake_cuda_counts counts;

static int remember(unsigned long long key, size_t bytes, int device, int memfd) {
  for (int i = 0; i < kMaxLive; ++i)
    if (live[i].key == 0) {
      live[i].key = key;
      live[i].bytes = bytes;
      live[i].device = device;
      live[i].memfd = memfd;
      return 1;
    }
  return 0;
}

/* The live entry of `key`; -1 when there is none. */
static int find_live(unsigned long long key) {
  for (int i = 0; i < kMaxLive; ++i)
    if (key != 0 && live[i].key == key) return i;
  return -1;
}

/* The bytes of `key`, forgotten; 0 when it is not live. */
static size_t forget(unsigned long long key) {
  const int i = find_live(key);
  if (i < 0) return 0;
  live[i].key = 0;
  used[live[i].device] -= live[i].bytes;
  if (live[i].memfd >= 0)
    close(live[i].memfd); /* a handle: a mapping keeps its memory */
  else
    munmap((void*)(uintptr_t)live[i].key, live[i].bytes); /* an address */
  return live[i].bytes;
}

/* An address on the current context's device. */
static int take(size_t bytes, unsigned long long* address) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytes == 0 || address == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > kTotal[current] - used[current]) return CUDA_ERROR_OUT_OF_MEMORY;
  /* Real memory, committed only where it is written. */
  void* memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const unsigned long long a = (unsigned long long)(uintptr_t)memory;
  if (!remember(a, bytes, current, -1)) {
    munmap(memory, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used[current] += bytes;
  *address = a;
  return CUDA_SUCCESS;
}

static int impl_init(unsigned int flags) {
  (void)flags;
  initialized = 1;
  current = 0;
  return CUDA_SUCCESS;
}
static int impl_ctx_get_device(int* device) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = current;
  return CUDA_SUCCESS;
}
static int impl_device_get_uuid(fake_uuid* uuid, int device) {
  if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = (char)(0xf0 + i - 0x10 * device);
  return CUDA_SUCCESS;
}
static int impl_device_total_mem(size_t* bytes, int device) {
  ++counts.device_total_mem;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
  *bytes = kTotal[device];
  return CUDA_SUCCESS;
}
static int impl_mem_alloc(unsigned long long* dptr, size_t bytes) {
  ++counts.mem_alloc;
  return take(bytes, dptr);
}
/* A future revision of cuMemAlloc (CUDA 99.0 on): only its address differs. */
static int impl_mem_alloc_next(unsigned long long* dptr, size_t bytes) {
  ++counts.mem_alloc;
  return take(bytes, dptr);
}
static int impl_mem_free(unsigned long long dptr) {
  ++counts.mem_free;
  return forget(dptr) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static int impl_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  ++counts.mem_get_info;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *free_bytes = kTotal[current] - used[current];
  *total_bytes = kTotal[current];
  return CUDA_SUCCESS;
}
static int impl_mem_alloc_async(unsigned long long* dptr, size_t bytes, void* stream) {
  (void)stream;
  ++counts.mem_alloc_async;
  return take(bytes, dptr);
}
static int impl_mem_alloc_async_ptsz(unsigned long long* dptr, size_t bytes, void* stream) {
  ++counts.per_thread_stream_calls;
  return impl_mem_alloc_async(dptr, bytes, stream);
}
static int impl_mem_free_async(unsigned long long dptr, void* stream) {
  (void)stream;
  ++counts.mem_free_async;
  return forget(dptr) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static int impl_mem_free_async_ptsz(unsigned long long dptr, void* stream) {
  ++counts.per_thread_stream_calls;
  return impl_mem_free_async(dptr, stream);
}
/* Needs no current context: the device is prop->location.id. */
static int impl_mem_create(unsigned long long* handle, size_t bytes, const void* prop, unsigned long long flags) {
  (void)flags;
  ++counts.mem_create;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == NULL || prop == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = ((const fake_allocation_prop*)prop)->location.id;
  if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  if (bytes > kTotal[device] - used[device]) return CUDA_ERROR_OUT_OF_MEMORY;
  if (bytes % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  /* Sparse: nothing is touched until it is written through a mapping. */
  const int memfd = memfd_create("fake-cuda-physical", MFD_CLOEXEC);
  if (memfd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(memfd, (off_t)bytes) != 0 || !remember(next_handle, bytes, device, memfd)) {
    close(memfd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used[device] += bytes;
  *handle = next_handle++;
  return CUDA_SUCCESS;
}
static int impl_mem_release(unsigned long long handle) {
  ++counts.mem_release;
  return forget(handle) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}


/* --- virtual memory --------------------------------------------------------- */

/* The reservation holding [address, address + bytes); -1 when none does. */
static int reservation_of(uintptr_t address, size_t bytes) {
  for (int i = 0; i < kMaxReservations; ++i)
    if (reservations[i].base != 0 && address >= reservations[i].base &&
        address + bytes <= reservations[i].base + reservations[i].bytes)
      return i;
  return -1;
}
static int impl_mem_get_allocation_granularity(size_t* granularity, const void* prop, int option) {
  (void)option;
  if (granularity == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}
static int impl_mem_address_reserve(unsigned long long* ptr, size_t bytes, size_t alignment,
                                    unsigned long long wanted, unsigned long long flags) {
  (void)wanted;
  (void)flags;
  ++counts.address_reserve;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ptr == NULL || bytes == 0 || bytes % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment < kGranularity) alignment = kGranularity;
  int slot = -1;
  for (int i = 0; i < kMaxReservations && slot < 0; ++i)
    if (reservations[i].base == 0) slot = i;
  if (slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  /* Over-reserve, then give back what lies outside the aligned range. */
  const size_t span = bytes + alignment;
  void* raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t start = (uintptr_t)raw;
  const uintptr_t base = (start + alignment - 1) & ~(uintptr_t)(alignment - 1);
  if (base > start) munmap(raw, base - start);
  if (start + span > base + bytes) munmap((void*)(base + bytes), start + span - (base + bytes));
  reservations[slot].base = base;
  reservations[slot].bytes = bytes;
  *ptr = base;
  return CUDA_SUCCESS;
}
static int impl_mem_address_free(unsigned long long ptr, size_t bytes) {
  for (int i = 0; i < kMaxReservations; ++i)
    if (ptr != 0 && reservations[i].base == ptr && reservations[i].bytes == bytes) {
      munmap((void*)(uintptr_t)ptr, bytes);
      reservations[i].base = 0;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}
static int impl_mem_map(unsigned long long ptr, size_t bytes, size_t offset, unsigned long long handle,
                        unsigned long long flags) {
  (void)flags;
  ++counts.mem_map;
  const int i = find_live(handle);
  if (i < 0 || live[i].memfd < 0 || offset != 0 || bytes != live[i].bytes) return CUDA_ERROR_INVALID_VALUE;
  if (ptr % kGranularity != 0 || reservation_of((uintptr_t)ptr, bytes) < 0) return CUDA_ERROR_INVALID_VALUE;
  /* Inaccessible until cuMemSetAccess, as on the GPU. */
  void* at = mmap((void*)(uintptr_t)ptr, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, live[i].memfd, 0);
  return at == MAP_FAILED ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
static int impl_mem_set_access(unsigned long long ptr, size_t bytes, const void* desc, size_t count) {
  if (desc == NULL || count == 0 || reservation_of((uintptr_t)ptr, bytes) < 0) return CUDA_ERROR_INVALID_VALUE;
  return mprotect((void*)(uintptr_t)ptr, bytes, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS
                                                                              : CUDA_ERROR_INVALID_VALUE;
}
static int impl_mem_unmap(unsigned long long ptr, size_t bytes) {
  ++counts.mem_unmap;
  if (ptr % kGranularity != 0 || reservation_of((uintptr_t)ptr, bytes) < 0) return CUDA_ERROR_INVALID_VALUE;
  void* at = mmap((void*)(uintptr_t)ptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                  -1, 0);
  return at == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
static int impl_ctx_synchronize(void) {
  ++counts.ctx_synchronize;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return current < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}
/* Contexts are the devices' primary ones: device + 1 as a pointer. */
static int impl_ctx_get_current(void** context) {
  if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
  *context = current < 0 ? NULL : (void*)(uintptr_t)(current + 1);
  return CUDA_SUCCESS;
}
static int impl_ctx_set_current(void* context) {
  const intptr_t device = (intptr_t)(uintptr_t)context - 1;
  if (device < -1 || device >= kDevices) return CUDA_ERROR_INVALID_CONTEXT;
  current = (int)device;
  return CUDA_SUCCESS;
}

static int impl_get_proc_address_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status);

static int impl_get_proc_address_v1(const char* symbol, void** pfn, int version, uint64_t flags) {
  int status = 0;
  return impl_get_proc_address_v2(symbol, pfn, version, flags, &status);
}

/* ISO C has no cast between function and object pointers: copy the bits. */
#define ANSWER(fn)                          \
  do {                                      \
    int (*pointer_)() = (int (*)())(fn);    \
    memcpy(pfn, &pointer_, sizeof pointer_); \
    found = 1;                              \
  } while (0)

static int impl_get_proc_address_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status) {
  ++counts.get_proc_address;
  const int per_thread = (flags & 2) != 0; /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
  int found = 0;
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (strcmp(symbol, "cuInit") == 0) ANSWER(impl_init);
  else if (strcmp(symbol, "cuCtxGetDevice") == 0) ANSWER(impl_ctx_get_device);
  else if (strcmp(symbol, "cuDeviceGetUuid") == 0) ANSWER(impl_device_get_uuid);
  else if (strcmp(symbol, "cuDeviceTotalMem") == 0 && version >= 3020) ANSWER(impl_device_total_mem);
  else if (strcmp(symbol, "cuMemAlloc") == 0 && version >= 99000) ANSWER(impl_mem_alloc_next);
  else if (strcmp(symbol, "cuMemAlloc") == 0 && version >= 3020) ANSWER(impl_mem_alloc);
  else if (strcmp(symbol, "cuMemFree") == 0 && version >= 3020) ANSWER(impl_mem_free);
  else if (strcmp(symbol, "cuMemGetInfo") == 0 && version >= 3020) ANSWER(impl_mem_get_info);
  else if (strcmp(symbol, "cuMemAllocAsync") == 0)
    ANSWER(per_thread ? impl_mem_alloc_async_ptsz : impl_mem_alloc_async);
  else if (strcmp(symbol, "cuMemFreeAsync") == 0)
    ANSWER(per_thread ? impl_mem_free_async_ptsz : impl_mem_free_async);
  else if (strcmp(symbol, "cuMemCreate") == 0) ANSWER(impl_mem_create);
  else if (strcmp(symbol, "cuMemRelease") == 0) ANSWER(impl_mem_release);
  else if (strcmp(symbol, "cuGetProcAddress") == 0)
    ANSWER(version >= 12000 ? (int (*)())impl_get_proc_address_v2 : (int (*)())impl_get_proc_address_v1);
  if (status) *status = found ? 0 : 1;
  if (!found) {
    *pfn = NULL;
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

EXPORT int cuInit(unsigned int flags) { return impl_init(flags); }
EXPORT int cuCtxGetDevice(int* device) { return impl_ctx_get_device(device); }
EXPORT int cuDeviceGetUuid_v2(fake_uuid* uuid, int device) { return impl_device_get_uuid(uuid, device); }
EXPORT int cuDeviceTotalMem_v2(size_t* bytes, int device) { return impl_device_total_mem(bytes, device); }
EXPORT int cuMemAlloc_v2(unsigned long long* dptr, size_t bytes) { return impl_mem_alloc(dptr, bytes); }
EXPORT int cuMemFree_v2(unsigned long long dptr) { return impl_mem_free(dptr); }
EXPORT int cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  return impl_mem_get_info(free_bytes, total_bytes);
}
EXPORT int cuMemAllocAsync(unsigned long long* dptr, size_t bytes, void* stream) {
  return impl_mem_alloc_async(dptr, bytes, stream);
}
EXPORT int cuMemAllocAsync_ptsz(unsigned long long* dptr, size_t bytes, void* stream) {
  return impl_mem_alloc_async_ptsz(dptr, bytes, stream);
}
EXPORT int cuMemFreeAsync(unsigned long long dptr, void* stream) { return impl_mem_free_async(dptr, stream); }
EXPORT int cuMemFreeAsync_ptsz(unsigned long long dptr, void* stream) {
  return impl_mem_free_async_ptsz(dptr, stream);
}
EXPORT int cuMemCreate(unsigned long long* handle, size_t bytes, const void* prop, unsigned long long flags) {
  return impl_mem_create(handle, bytes, prop, flags);
}
EXPORT int cuMemRelease(unsigned long long handle) { return impl_mem_release(handle); }
EXPORT int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags) {
  return impl_get_proc_address_v1(symbol, pfn, version, flags);
}
EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status) {
  return impl_get_proc_address_v2(symbol, pfn, version, flags, status);
}

EXPORT int cuMemGetAllocationGranularity(size_t* granularity, const void* prop, int option) {
  return impl_mem_get_allocation_granularity(granularity, prop, option);
}
EXPORT int cuMemAddressReserve(unsigned long long* ptr, size_t bytes, size_t alignment, unsigned long long wanted,
                               unsigned long long flags) {
  return impl_mem_address_reserve(ptr, bytes, alignment, wanted, flags);
}
EXPORT int cuMemAddressFree(unsigned long long ptr, size_t bytes) { return impl_mem_address_free(ptr, bytes); }
EXPORT int cuMemMap(unsigned long long ptr, size_t bytes, size_t offset, unsigned long long handle,
                    unsigned long long flags) {
  return impl_mem_map(ptr, bytes, offset, handle, flags);
}
EXPORT int cuMemSetAccess(unsigned long long ptr, size_t bytes, const void* desc, size_t count) {
  return impl_mem_set_access(ptr, bytes, desc, count);
}
EXPORT int cuMemUnmap(unsigned long long ptr, size_t bytes) { return impl_mem_unmap(ptr, bytes); }
EXPORT int cuCtxSynchronize(void) { return impl_ctx_synchronize(); }
EXPORT int cuCtxGetCurrent(void** context) { return impl_ctx_get_current(context); }
EXPORT int cuCtxSetCurrent(void* context) { return impl_ctx_set_current(context); }

EXPORT void fake_cuda_get_counts(struct fake_cuda_counts* out) { *out = counts; }
EXPORT size_t fake_cuda_used_bytes(void) { return used[0] + used[1]; }
EXPORT int fake_cuda_mem_alloc_direct(unsigned long long* dptr, size_t bytes) { return impl_mem_alloc(dptr, bytes); }
EXPORT void fake_cuda_set_current(int device) { current = device; }
