/* A program that does not link the driver and loads a library that does
 * (local_extension.c) with RTLD_LOCAL: `local_app LIBRARY` prints
 * "local rc free_rc" for a 64 MiB allocation made inside that library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*round_trip_fn)(size_t, int*);

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2) {
    fprintf(stderr, "usage: local_app LIBRARY\n");
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "local_app: %s\n", dlerror());
    return 2;
  }
  void* pointer = dlsym(library, "local_extension_round_trip");
  round_trip_fn round_trip = NULL;
  memcpy(&round_trip, &pointer, sizeof round_trip);
  if (round_trip == NULL) return 2;
  int free_rc = -1;
  const int rc = round_trip((size_t)64 << 20, &free_rc);
  printf("local %d %d\n", rc, free_rc);
  return 0;
}
