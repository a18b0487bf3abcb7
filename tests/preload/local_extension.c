/* A library linked against the driver (the fake, libcuda.so.1) that
 * local_app loads RTLD_LOCAL, as Python loads an extension module: the
 * driver is then in its local scope only, not in the global one. */
#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

/* Allocates and frees `bytes` through the driver; prints nothing. */
EXPORT int local_extension_round_trip(size_t bytes, int* free_result) {
  cuInit(0);
  unsigned long long block = 0;
  const int rc = cuMemAlloc_v2(&block, bytes);
  *free_result = rc == CUDA_SUCCESS ? cuMemFree_v2(block) : -1;
  return rc;
}
