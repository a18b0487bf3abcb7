// GranuleTable: the calls the pool makes after a device call, or inside its
// noexcept placement questions, allocate nothing (only grow() and
// add_stream() do), so a host out of memory cannot end the process there;
// the free queue keeps its order across a grow(); a stream the table was
// never told of is tagged "many".
#include "pool/granule_table.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

// TSan's runtime defines the global operator new itself (a second
// definition does not link): there the allocations are not counted.
#if defined(__has_feature)
#define GRANULE_TABLE_TEST_HAS(feature) __has_feature(feature)
#else
#define GRANULE_TABLE_TEST_HAS(feature) 0
#endif
#if defined(__SANITIZE_THREAD__) || GRANULE_TABLE_TEST_HAS(thread_sanitizer)
#define GRANULE_TABLE_TEST_COUNTS 0
#else
#define GRANULE_TABLE_TEST_COUNTS 1
#endif

namespace {

// Allocations made by this thread while counting: the global operator new
// is replaced in this test program, and counts only when asked to.
thread_local bool counting = false;
thread_local std::size_t allocations = 0;

}  // namespace

#if GRANULE_TABLE_TEST_COUNTS
void* operator new(std::size_t bytes) {
  if (counting) ++allocations;
  if (void* ptr = std::malloc(bytes == 0 ? 1 : bytes)) return ptr;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return operator new(bytes); }
void operator delete(void* ptr) noexcept { std::free(ptr); }
void operator delete[](void* ptr) noexcept { std::free(ptr); }
void operator delete(void* ptr, std::size_t) noexcept { std::free(ptr); }
void operator delete[](void* ptr, std::size_t) noexcept { std::free(ptr); }
#endif

namespace tidepool::pool {
namespace {

struct CountAllocations {
  CountAllocations() {
    allocations = 0;
    counting = true;
  }
  ~CountAllocations() { counting = false; }
  std::size_t made() const { return allocations; }
};

TEST(GranuleTable, TheCallsAfterADeviceCallAllocateNothing) {
  if (!GRANULE_TABLE_TEST_COUNTS) GTEST_SKIP() << "under TSan, whose runtime owns operator new";
  GranuleTable table;
  (void)table.grow(1024);
  for (GranuleId id = 0; id < 512; ++id) table.set_mapped(id, id + 1);
  const Stream known = 7, unknown = 9;
  table.add_stream(known);
  CountAllocations count;
  // Blocks over the mapped granules used and freed on both streams, the
  // free queue filled and drained, the table forgotten and rebuilt.
  for (GranuleId first = 0; first + 8 < 512; first += 8) {
    EXPECT_EQ(table.use_range(first, first + 8), 0u);
    table.unuse_range(first, first + 8, first % 16 == 0 ? known : unknown);
  }
  for (GranuleId id = table.oldest_free(); id != kNoGranule && id < 64; id = table.oldest_free()) {
    (void)table.use_range(id, id);
  }
  table.forget();
  table.tag_range(0, 100, unknown);
  table.queue_free();
  (void)table.highest_free();
  EXPECT_EQ(count.made(), 0u);
}

TEST(GranuleTable, AStreamItWasNotToldOfIsTaggedMany) {
  GranuleTable table;
  (void)table.grow(64);
  table.set_mapped(3, 1);
  table.set_mapped(4, 2);
  table.add_stream(5);
  (void)table.use_range(3, 3);
  table.unuse_range(3, 3, 5);
  EXPECT_EQ(table.freed_on(3), Stream{5});
  (void)table.use_range(4, 4);
  table.unuse_range(4, 4, 6);  // never added: waits for every stream
  EXPECT_EQ(table.freed_on(4), kManyStreams);
}

TEST(GranuleTable, TheFreeQueueKeepsItsOrderAcrossAGrow) {
  GranuleTable table;
  (void)table.grow(8);
  for (GranuleId id = 0; id < 8; ++id) table.set_mapped(id, id + 1);
  // Freed in the order 5, 2, 7, after every granule was in use.
  for (GranuleId id = 0; id < 8; ++id) (void)table.use_range(id, id);
  while (table.oldest_free() != kNoGranule) {
  }
  for (GranuleId id : {5u, 2u, 7u}) table.unuse_range(id, id, kNoStream);
  (void)table.grow(100);  // the ring is laid out anew
  table.set_mapped(50, 99);
  EXPECT_EQ(table.oldest_free(), 5u);
  (void)table.use_range(5, 5);
  EXPECT_EQ(table.oldest_free(), 2u);  // 5, used again, was skipped
  (void)table.use_range(2, 2);
  EXPECT_EQ(table.oldest_free(), 7u);
  (void)table.use_range(7, 7);
  EXPECT_EQ(table.oldest_free(), kNoGranule);
}

}  // namespace
}  // namespace tidepool::pool
