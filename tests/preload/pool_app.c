/* A program linked against the fake driver that allocates through
 * cuMemAlloc_v2/cuMemFree_v2 as a framework with its caching off does, for
 * `tidepool run --pool` (interposer_check's Pool tests). It writes a pattern
 * into every block and reads them all back, frees half, allocates more, and
 * checks again; frees one block twice and a pointer inside a block; frees a
 * block the driver gave it past the interposer (fake_cuda_mem_alloc_direct).
 * It prints "name value..." lines; with --wait it prints "ready" while still
 * holding its blocks and waits for a line on stdin.
 *   pool_app hold-cached N   allocates N blocks of 1 GiB (never touched),
 *                            frees them (the pool keeps them cached), prints
 *                            "cached" and waits for a line on stdin.
 *   pool_app take N          one cuMemAlloc_v2 of N GiB, and its result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda.h"

enum { kBlocks = 12 };
static const size_t KiB = (size_t)1 << 10;
static const size_t MiB = (size_t)1 << 20;

static size_t size_of_block(int i) { return (size_t)(i % 4 + 1) * MiB + (size_t)i * 100 * KiB; }

/* Fills block i with its own byte pattern. */
static void fill(unsigned long long block, int i) { memset((void*)(uintptr_t)block, 0x40 + i, size_of_block(i)); }

/* Whether block i still holds its pattern, every byte. */
static int intact(unsigned long long block, int i) {
  const unsigned char* bytes = (const unsigned char*)(uintptr_t)block;
  for (size_t k = 0; k < size_of_block(i); ++k)
    if (bytes[k] != (unsigned char)(0x40 + i)) return 0;
  return 1;
}

static int all_intact(const unsigned long long* blocks) {
  int ok = 1;
  for (int i = 0; i < kBlocks; ++i) ok &= intact(blocks[i], i);
  return ok;
}

static int hold_cached(int gibibytes) {
  unsigned long long blocks[64] = {0};
  int rc = 0;
  for (int i = 0; i < gibibytes && i < 64; ++i) rc |= cuMemAlloc_v2(&blocks[i], (size_t)1 << 30);
  for (int i = 0; i < gibibytes && i < 64; ++i) rc |= cuMemFree_v2(blocks[i]);
  printf("cached %d\n", rc);
  char line[16];
  if (fgets(line, sizeof line, stdin) == NULL) return 1;
  fake_cuda_print_counts();
  return 0;
}

static int take(int gibibytes) {
  unsigned long long block = 0;
  printf("take %d\n", cuMemAlloc_v2(&block, (size_t)gibibytes << 30));
  return 0;
}

int main(int argc, char** argv) {
  const int wait = argc > 1 && strcmp(argv[1], "--wait") == 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("pid %d\n", (int)getpid());
  printf("init %d\n", cuInit(0));
  if (argc > 2 && strcmp(argv[1], "hold-cached") == 0) return hold_cached(atoi(argv[2]));
  if (argc > 2 && strcmp(argv[1], "take") == 0) return take(atoi(argv[2]));

  unsigned long long blocks[kBlocks] = {0};
  size_t live = 0;
  int rc = 0;
  for (int i = 0; i < kBlocks; ++i) {
    rc |= cuMemAlloc_v2(&blocks[i], size_of_block(i));
    if (rc == CUDA_SUCCESS) fill(blocks[i], i);
    live += size_of_block(i);
  }
  printf("alloc %d\n", rc);
  printf("intact %d\n", rc == CUDA_SUCCESS && all_intact(blocks));

  /* Free every other block and allocate it again: the pool reuses memory. */
  rc = 0;
  for (int i = 0; i < kBlocks; i += 2) rc |= cuMemFree_v2(blocks[i]);
  for (int i = 0; i < kBlocks; i += 2) {
    rc |= cuMemAlloc_v2(&blocks[i], size_of_block(i));
    if (rc == CUDA_SUCCESS) fill(blocks[i], i);
  }
  printf("realloc %d\n", rc);
  printf("intact_after %d\n", rc == CUDA_SUCCESS && all_intact(blocks));

  /* (The calls in sequence: C leaves the order of a call's arguments open.) */
  unsigned long long spare = 0;
  rc = cuMemAlloc_v2(&spare, MiB);
  const int first_free = cuMemFree_v2(spare);
  printf("double_free %d %d %d\n", rc, first_free, cuMemFree_v2(spare));
  printf("inside_free %d\n", cuMemFree_v2(blocks[1] + 4096));

  unsigned long long foreign = 0;
  rc = fake_cuda_mem_alloc_direct(&foreign, 3 * MiB);
  printf("foreign %d %d\n", rc, cuMemFree_v2(foreign));

  size_t free_bytes = 0, total = 0;
  rc = cuMemGetInfo_v2(&free_bytes, &total);
  printf("info %d %zu %zu\n", rc, free_bytes, total);
  printf("live %zu\n", live);
  printf("physical %zu\n", fake_cuda_used_bytes());

  unsigned long long huge = 0;
  printf("beyond %d\n", cuMemAlloc_v2(&huge, total + MiB));

  if (wait) {
    printf("ready\n");
    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL) return 1;
  }
  rc = 0;
  for (int i = 0; i < kBlocks; ++i) rc |= cuMemFree_v2(blocks[i]);
  printf("free %d\n", rc);
  fake_cuda_print_counts();
  return 0;
}
