/* A fake CUDA driver for the interposer's test, built as libcuda.so.1 (the
 * interposer looks for that name when the driver is loaded RTLD_LOCAL):
 * exports the driver symbols the interposer wraps (and those it asks:
 * cuCtxGetDevice, cuDeviceGetUuid_v2, cuDeviceTotalMem_v2) with the driver's
 * ABI, counts the calls that reach it, and hands out fake addresses (never
 * dereferenced) from two "devices", 16 GiB and 8 GiB. cuInit makes device 0
 * current; fake_cuda_set_current() changes that (-1: no context). Like the
 * real driver, cuGetProcAddress answers with internal functions, not with
 * the exported symbols (which LD_PRELOAD replaces), and from CUDA 99.0 on it
 * answers "cuMemAlloc" with a newer revision (the same behaviour, another
 * function), as a future driver would. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

enum { kDevices = 2, kMaxLive = 4096 };
static const size_t kTotal[kDevices] = {(size_t)16 << 30, (size_t)8 << 30};
static struct {
  unsigned long long key; /* address or handle; 0: empty */
  size_t bytes;
  int device;
} live[kMaxLive];
static size_t used[kDevices];
static unsigned long long next_address;
static unsigned long long next_handle = 1;
static int initialized;
static int current = -1; /* the current context's device; -1: none */
static struct fake_cuda_counts counts;

static int remember(unsigned long long key, size_t bytes, int device) {
  for (int i = 0; i < kMaxLive; ++i)
    if (live[i].key == 0) {
      live[i].key = key;
      live[i].bytes = bytes;
      live[i].device = device;
      return 1;
    }
  return 0;
}

/* The bytes of `key`, forgotten; 0 when it is not live. */
static size_t forget(unsigned long long key) {
  for (int i = 0; i < kMaxLive; ++i)
    if (key != 0 && live[i].key == key) {
      live[i].key = 0;
      used[live[i].device] -= live[i].bytes;
      return live[i].bytes;
    }
  return 0;
}

/* An address on the current context's device. */
static int take(size_t bytes, unsigned long long* address) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytes == 0 || address == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > kTotal[current] - used[current]) return CUDA_ERROR_OUT_OF_MEMORY;
  if (next_address == 0) next_address = ((unsigned long long)(uintptr_t)malloc(4096) + 511) & ~511ull;
  unsigned long long a = next_address;
  next_address += (bytes + 511) & ~(unsigned long long)511;
  if (!remember(a, bytes, current)) return CUDA_ERROR_OUT_OF_MEMORY;
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
  if (!remember(next_handle, bytes, device)) return CUDA_ERROR_OUT_OF_MEMORY;
  used[device] += bytes;
  *handle = next_handle++;
  return CUDA_SUCCESS;
}
static int impl_mem_release(unsigned long long handle) {
  ++counts.mem_release;
  return forget(handle) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
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

EXPORT void fake_cuda_get_counts(struct fake_cuda_counts* out) { *out = counts; }
EXPORT size_t fake_cuda_used_bytes(void) { return used[0] + used[1]; }
EXPORT void fake_cuda_set_current(int device) { current = device; }
