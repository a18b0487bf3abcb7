/* A program with a known allocation pattern for `tidepool run --record`
 * (interposer_check's Record tests), linked against the fake driver:
 *   record_app pattern   two streams, async frees, cuMemCreate of 4 MiB,
 *                        6000 small events (past the recorder's buffer), a
 *                        child process (this program, "child") and 1 MiB
 *                        left live; peak live 8 MiB.
 *   record_app child     5 MiB and 6 MiB, both freed: peak live 11 MiB.
 *   record_app sigterm   ten 1 MiB allocations, then SIGTERM to itself.
 * It prints "name rc..." lines (and its pid) for the test. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

static const size_t MiB = (size_t)1 << 20;

static int child(void) {
  unsigned long long a = 0, b = 0;
  int rc = cuMemAlloc_v2(&a, 5 * MiB) | cuMemAlloc_v2(&b, 6 * MiB);
  rc |= cuMemFree_v2(a) | cuMemFree_v2(b);
  printf("child %d\n", rc);
  return rc;
}

/* Runs this program again as "child" (exec: the interposer is preloaded anew). */
static int run_child(const char* self) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    execl(self, self, "child", (char*)NULL);
    _exit(126);
  }
  printf("child_pid %d\n", (int)pid);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int pattern(const char* self) {
  void* stream1 = (void*)0x1000;
  void* stream2 = (void*)0x2000;
  unsigned long long a = 0, b = 0, c = 0, d = 0, kept = 0;
  int rc = cuMemAlloc_v2(&a, 1 * MiB);                  /* live 1 */
  rc |= cuMemAllocAsync(&b, 2 * MiB, stream1);         /* live 3 */
  rc |= cuMemAllocAsync(&c, 4 * MiB, stream2);         /* live 7 */
  rc |= cuMemFreeAsync(b, stream1);                    /* live 5 */
  rc |= cuMemAllocAsync(&d, 3 * MiB, stream2);         /* live 8: the peak */
  rc |= cuMemFree_v2(a) | cuMemFreeAsync(c, stream2) | cuMemFreeAsync(d, stream1);
  printf("streams %d\n", rc);

  fake_allocation_prop prop;
  memset(&prop, 0, sizeof prop);
  prop.location.type = 1;
  unsigned long long handle = 0;
  rc = cuMemCreate(&handle, 4 * MiB, &prop, 0) | cuMemRelease(handle);
  printf("segment %d\n", rc);

  rc = 0;
  for (int i = 0; i < 3000; ++i) {
    unsigned long long small = 0;
    rc |= cuMemAlloc_v2(&small, 4096) | cuMemFree_v2(small);
  }
  printf("small %d\n", rc);
  printf("child_status %d\n", run_child(self));
  printf("kept %d\n", cuMemAlloc_v2(&kept, 1 * MiB));
  return 0;
}

static int sigterm(void) {
  for (int i = 0; i < 10; ++i) {
    unsigned long long ptr = 0;
    if (cuMemAlloc_v2(&ptr, MiB) != CUDA_SUCCESS) return 1;
  }
  printf("terminating\n");
  fflush(stdout);
  raise(SIGTERM);
  printf("survived\n");
  return 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("pid %d\n", (int)getpid());
  if (cuInit(0) != CUDA_SUCCESS) return 2;
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "pattern") == 0) return pattern(argv[0]);
  if (strcmp(mode, "child") == 0) return child();
  if (strcmp(mode, "sigterm") == 0) return sigterm();
  fprintf(stderr, "usage: record_app pattern|child|sigterm\n");
  return 2;
}
