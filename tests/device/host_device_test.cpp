// HostDevice: a real virtual-memory device on the CPU. These tests check the
// properties the pools rely on: stitching keeps data, accounting is exact,
// released memory goes back to the OS, and broken preconditions are errors
// that leave the device usable.
#include "tidepool/host_device.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

std::shared_ptr<HostDevice> make_device(std::size_t capacity = 64 * MiB,
                                        std::size_t granularity = 2 * MiB,
                                        std::size_t max_mappings = 0) {
  HostDeviceOptions options;
  options.capacity = capacity;
  options.granularity = granularity;
  options.name = "test";
  options.max_mappings = max_mappings;
  auto device = HostDevice::create(options);
  if (!device) throw Exception(device.error());
  return std::move(device).value();
}

char* as_bytes(void* p) { return static_cast<char*>(p); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Kernel mappings (lines of /proc/self/maps) that overlap [base, base + bytes).
std::size_t kernel_mappings_in(void* base, std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(base);
  const auto hi = lo + bytes;
  std::ifstream in("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::uintptr_t start = 0, end = 0;
    char dash = 0;
    fields >> std::hex >> start >> dash >> end;
    if (start < hi && end > lo) ++count;
  }
  return count;
}

TEST(HostDevice, IdAndDescription) {
  auto device = make_device();
  EXPECT_EQ(device->id(), "host:test");
  EXPECT_NE(device->description().find("64.0 MiB"), std::string::npos) << device->description();
  EXPECT_TRUE(device->supports_virtual_memory());
  EXPECT_EQ(device->granularity(), 2 * MiB);
  EXPECT_TRUE(device->synchronize(kDefaultStream));
  EXPECT_TRUE(device->synchronize(Stream{42}));
  Expected<bool> idle = device->query(Stream{42});
  ASSERT_TRUE(idle);
  EXPECT_TRUE(*idle);
}

TEST(HostDevice, RemapPreservesDataAtANewAddress) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(8 * g);
  ASSERT_TRUE(va);
  auto handle = device->create(2 * g);
  ASSERT_TRUE(handle);
  char* first = as_bytes(*va);
  ASSERT_TRUE(device->map(first, 2 * g, *handle));
  for (std::size_t i = 0; i < 2 * g; i += 4096) first[i] = static_cast<char>(i / 4096 + 1);
  first[2 * g - 1] = 'z';
  ASSERT_TRUE(device->unmap(first, 2 * g));

  char* second = first + 5 * g;  // a different, non-overlapping address
  ASSERT_TRUE(device->map(second, 2 * g, *handle));
  for (std::size_t i = 0; i < 2 * g; i += 4096) {
    ASSERT_EQ(second[i], static_cast<char>(i / 4096 + 1)) << "offset " << i;
  }
  EXPECT_EQ(second[2 * g - 1], 'z');
  ASSERT_TRUE(device->unmap(second, 2 * g));
  ASSERT_TRUE(device->release(*handle, 2 * g));
  ASSERT_TRUE(device->unreserve(*va, 8 * g));
}

TEST(HostDevice, AHandleMappedAtTwoAddressesIsOneMemory) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  const std::size_t start = device->mapping_count();
  auto va = device->reserve(8 * g);
  ASSERT_TRUE(va);
  auto handle = device->create(g);
  ASSERT_TRUE(handle);
  char* a = as_bytes(*va) + g;
  char* b = as_bytes(*va) + 5 * g;
  ASSERT_TRUE(device->map(a, g, *handle));
  ASSERT_TRUE(device->map(b, g, *handle));  // an alias: the same memory at another address
  EXPECT_EQ(device->mapping_count() - start, kernel_mappings_in(*va, 8 * g));
  a[0] = 'a';
  b[g - 1] = 'b';
  EXPECT_EQ(b[0], 'a');
  EXPECT_EQ(a[g - 1], 'b');
  Status released = device->release(*handle, g);
  ASSERT_FALSE(released);
  EXPECT_EQ(released.error().code(), Errc::invalid_argument);
  EXPECT_TRUE(contains(released.error().message(), "and 1 other addresses")) << released.error().message();

  ASSERT_TRUE(device->unmap(a, g));  // the other address keeps the memory
  EXPECT_EQ(b[0], 'a');
  released = device->release(*handle, g);
  ASSERT_FALSE(released);
  EXPECT_EQ(released.error().code(), Errc::invalid_argument);
  EXPECT_TRUE(contains(released.error().message(), "still mapped at " + format_address(b)))
      << released.error().message();
  EXPECT_FALSE(device->map(b, g, *handle));  // its range is mapped: one map() a range
  ASSERT_TRUE(device->unmap(b, g));
  EXPECT_EQ(device->mapping_count(), start + 1);
  ASSERT_TRUE(device->release(*handle, g));
  ASSERT_TRUE(device->unreserve(*va, 8 * g));
}

TEST(HostDevice, StitchesHandlesSideBySideIntoOneContiguousRange) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(16 * g);
  ASSERT_TRUE(va);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 4; ++i) {
    auto handle = device->create(g);
    ASSERT_TRUE(handle);
    handles.push_back(*handle);
    char* at = as_bytes(*va) + static_cast<std::size_t>(2 * i) * g;  // scattered
    ASSERT_TRUE(device->map(at, g, *handle));
    std::memset(at, 'a' + i, g);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(device->unmap(as_bytes(*va) + static_cast<std::size_t>(2 * i) * g, g));
  }
  char* stitched = as_bytes(*va) + 8 * g;
  for (int i = 3; i >= 0; --i) {  // reverse order: data follows the handle, not the address
    ASSERT_TRUE(device->map(stitched + static_cast<std::size_t>(3 - i) * g, g, handles[static_cast<std::size_t>(i)]));
  }
  for (int i = 0; i < 4; ++i) {
    const char expected = static_cast<char>('a' + (3 - i));
    EXPECT_EQ(stitched[static_cast<std::size_t>(i) * g], expected);
    EXPECT_EQ(stitched[static_cast<std::size_t>(i + 1) * g - 1], expected);
  }
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(device->unmap(stitched + static_cast<std::size_t>(i) * g, g));
  for (PhysicalHandle h : handles) ASSERT_TRUE(device->release(h, g));
  ASSERT_TRUE(device->unreserve(*va, 16 * g));
}

TEST(HostDevice, MapManyMapsHandlesSideBySideEachItsOwnMapping) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(16 * g);
  ASSERT_TRUE(va);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 6; ++i) handles.push_back(*device->create(g));  // adjacent in the memfd
  const std::size_t before = device->mapping_count();
  ASSERT_TRUE(device->map_many(*va, g, handles));
  // One mmap for the six: the reservation around them, and one file mapping.
  EXPECT_EQ(device->mapping_count(), before + 1);
  EXPECT_EQ(kernel_mappings_in(*va, 16 * g), 2u);
  for (std::size_t i = 0; i < handles.size(); ++i) std::memset(as_bytes(*va) + i * g, 'p' + static_cast<int>(i), g);

  // Each handle is still its own map() call: the third comes out alone.
  EXPECT_FALSE(device->unmap(*va, 2 * g));
  ASSERT_TRUE(device->unmap(as_bytes(*va) + 2 * g, g));
  ASSERT_TRUE(device->map(as_bytes(*va) + 10 * g, g, handles[2]));
  EXPECT_EQ(as_bytes(*va)[10 * g], 'r');  // its data went with it
  EXPECT_EQ(as_bytes(*va)[3 * g], 's');

  // A bad handle anywhere in the list maps none of them.
  auto spare = device->create(g);
  ASSERT_TRUE(spare);
  const std::vector<PhysicalHandle> with_released = {*spare, PhysicalHandle{999}};
  EXPECT_FALSE(device->map_many(as_bytes(*va) + 12 * g, g, with_released));
  ASSERT_TRUE(device->map(as_bytes(*va) + 12 * g, g, *spare));  // spare was left unmapped
  const std::vector<PhysicalHandle> twice = {handles[2], handles[2]};
  EXPECT_FALSE(device->map_many(as_bytes(*va) + 14 * g, g, twice));

  for (std::size_t i : {0u, 1u, 3u, 4u, 5u}) ASSERT_TRUE(device->unmap(as_bytes(*va) + i * g, g));
  ASSERT_TRUE(device->unmap(as_bytes(*va) + 10 * g, g));
  ASSERT_TRUE(device->unmap(as_bytes(*va) + 12 * g, g));
  for (PhysicalHandle h : handles) ASSERT_TRUE(device->release(h, g));
  ASSERT_TRUE(device->release(*spare, g));
  ASSERT_TRUE(device->unreserve(*va, 16 * g));
  EXPECT_EQ(device->mapping_count(), before - 1);  // the reservation is gone too
}

TEST(HostDevice, EightyGiBDeviceReservesAndCreatesWithoutTouchingMemory) {
  auto device = make_device(80 * GiB);
  EXPECT_EQ(device->mem_info().total_bytes, 80 * GiB);
  auto va = device->reserve(160 * GiB);
  ASSERT_TRUE(va) << va.error().message();
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 10; ++i) {
    auto handle = device->create(8 * GiB);
    ASSERT_TRUE(handle) << handle.error().message();
    handles.push_back(*handle);
  }
  EXPECT_EQ(device->mem_info().free_bytes, 0u);
  ASSERT_TRUE(device->map(*va, 8 * GiB, handles[0]));
  as_bytes(*va)[0] = 1;                    // touch one page of 80 GiB
  as_bytes(*va)[8 * GiB - 1] = 2;
  EXPECT_LE(device->resident_bytes(), 2 * device->granularity());
  ASSERT_TRUE(device->unmap(*va, 8 * GiB));
  for (PhysicalHandle h : handles) ASSERT_TRUE(device->release(h, 8 * GiB));
  EXPECT_EQ(device->mem_info().free_bytes, 80 * GiB);
  EXPECT_EQ(device->resident_bytes(), 0u);
  ASSERT_TRUE(device->unreserve(*va, 160 * GiB));
}

TEST(HostDevice, ExactAccountingCreateUntilFullThenRelease) {
  const std::size_t g = 2 * MiB;
  auto device = make_device(32 * g);
  std::vector<PhysicalHandle> handles;
  for (std::size_t i = 0; i < 16; ++i) {
    auto handle = device->create(2 * g);
    ASSERT_TRUE(handle);
    handles.push_back(*handle);
    EXPECT_EQ(device->mem_info().free_bytes, 32 * g - (i + 1) * 2 * g);
  }
  auto refused = device->create(g);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  ASSERT_NE(refused.error().oom(), nullptr);
  EXPECT_EQ(refused.error().oom()->requested_bytes, g);
  EXPECT_EQ(refused.error().oom()->device_free_bytes, 0u);
  auto plain_refused = device->allocate(1);
  ASSERT_FALSE(plain_refused);
  EXPECT_EQ(plain_refused.error().code(), Errc::out_of_memory);

  ASSERT_TRUE(device->release(handles.back(), 2 * g));
  handles.pop_back();
  EXPECT_EQ(device->mem_info().free_bytes, 2 * g);
  auto again = device->create(2 * g);
  ASSERT_TRUE(again);
  handles.push_back(*again);
  for (PhysicalHandle h : handles) ASSERT_TRUE(device->release(h, 2 * g));
  EXPECT_EQ(device->mem_info().free_bytes, 32 * g);
}

TEST(HostDevice, PlainAllocationsAreAccountedAtPageSize) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto device = make_device(4 * MiB);
  auto small = device->allocate(1);
  ASSERT_TRUE(small);
  EXPECT_EQ(device->mem_info().free_bytes, 4 * MiB - page);
  auto exact = device->allocate(3 * page);
  ASSERT_TRUE(exact);
  EXPECT_EQ(device->mem_info().free_bytes, 4 * MiB - 4 * page);
  std::memset(*exact, 7, 3 * page);
  auto too_big = device->allocate(4 * MiB - 4 * page + 1);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code(), Errc::out_of_memory);
  ASSERT_TRUE(device->free(*small, 1));
  ASSERT_TRUE(device->free(*exact, 3 * page));
  EXPECT_EQ(device->mem_info().free_bytes, 4 * MiB);
  EXPECT_TRUE(device->free(nullptr, 0));  // as cudaFree(nullptr)
  // Physical and plain memory share the capacity.
  auto plain = device->allocate(2 * MiB);
  ASSERT_TRUE(plain);
  ASSERT_TRUE(device->create(2 * MiB));
  EXPECT_EQ(device->create(2 * MiB).error().code(), Errc::out_of_memory);
}

TEST(HostDevice, ReleasePunchesMemoryOut) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(4 * g);
  ASSERT_TRUE(va);
  auto handle = device->create(4 * g);
  ASSERT_TRUE(handle);
  EXPECT_EQ(device->resident_bytes(), 0u);
  ASSERT_TRUE(device->map(*va, 4 * g, *handle));
  std::memset(*va, 0x5a, 4 * g);
  EXPECT_GE(device->resident_bytes(), 4 * g);
  ASSERT_TRUE(device->unmap(*va, 4 * g));
  EXPECT_GE(device->resident_bytes(), 4 * g);  // unmapped memory keeps its data
  ASSERT_TRUE(device->release(*handle, 4 * g));
  EXPECT_EQ(device->resident_bytes(), 0u);
  // A new handle at the same offsets reads zeros, not the old data.
  auto fresh = device->create(4 * g);
  ASSERT_TRUE(fresh);
  ASSERT_TRUE(device->map(*va, 4 * g, *fresh));
  EXPECT_EQ(as_bytes(*va)[0], 0);
  EXPECT_EQ(as_bytes(*va)[4 * g - 1], 0);
  ASSERT_TRUE(device->unmap(*va, 4 * g));
  ASSERT_TRUE(device->release(*fresh, 4 * g));
  ASSERT_TRUE(device->unreserve(*va, 4 * g));
}

// A forked child inherits the device and its MAP_SHARED memfd: memory it
// created, mapped, wrote through a copy or released would be the parent's.
// As a GPU's context after fork, the device is refused there; what only
// touches the child's own address space (unmap, unreserve, free) is left to
// the child's exit. Before, the child's release punched the parent's live
// memory out (it read zeros).
TEST(HostDevice, AForkedChildIsRefusedAndPunchesNoHoleInItsParentsMemory) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(4 * g);
  ASSERT_TRUE(va);
  auto handle = device->create(2 * g);
  ASSERT_TRUE(handle);
  ASSERT_TRUE(device->map(*va, 2 * g, *handle));
  std::memset(*va, 0x5a, 2 * g);
  auto plain = device->allocate(4096);
  ASSERT_TRUE(plain);

  test::Child child([&]() -> int {
    auto refused = [](const Error& error) {
      return error.code() == Errc::unsupported && contains(error.message(), "forked") &&
             contains(error.message(), "host device \"test\"");
    };
    if (auto more = device->create(g); more || !refused(more.error())) return 10;
    if (auto space = device->reserve(g); space || !refused(space.error())) return 11;
    if (auto block = device->allocate(4096); block || !refused(block.error())) return 12;
    if (Status mapped = device->map(as_bytes(*va) + 2 * g, 2 * g, *handle); mapped || !refused(mapped.error())) return 13;
    char byte = 0x11;
    if (Status copied = device->copy_from_host(*va, &byte, 1); copied || !refused(copied.error())) return 14;
    if (!device->unmap(*va, 2 * g)) return 15;  // the child's own mapping
    if (Status released = device->release(*handle, 2 * g); released || !refused(released.error())) return 16;
    if (!device->free(*plain, 4096) || !device->unreserve(*va, 4 * g)) return 17;
    if (device->mem_info().free_bytes != 0) return 18;
    device.reset();  // closes the child's descriptor only
    return 0;
  });
  ASSERT_EQ(child.wait(std::chrono::seconds(20)), 0);
  EXPECT_EQ(as_bytes(*va)[0], 0x5a);
  EXPECT_EQ(as_bytes(*va)[2 * g - 1], 0x5a);
  EXPECT_GE(device->resident_bytes(), 2 * g);
  ASSERT_TRUE(device->free(*plain, 4096));
  ASSERT_TRUE(device->unmap(*va, 2 * g));
  ASSERT_TRUE(device->release(*handle, 2 * g));
  ASSERT_TRUE(device->unreserve(*va, 4 * g));
}

TEST(HostDevice, EveryPointerIsAligned) {
  auto device = make_device(64 * MiB, 64 * KiB);
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t bytes : {1ul, 255ul, 256ul, 257ul, 4095ul, 65537ul, 1000000ul}) {
    auto ptr = device->allocate(bytes);
    ASSERT_TRUE(ptr);
    EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*ptr), kMinAlignment));
    live.emplace_back(*ptr, bytes);
  }
  for (std::size_t granules : {1ul, 3ul, 17ul}) {
    auto va = device->reserve(granules * 64 * KiB);
    ASSERT_TRUE(va);
    EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*va), 64 * KiB)) << *va;
    ASSERT_TRUE(device->unreserve(*va, granules * 64 * KiB));
  }
  auto big = make_device(64 * MiB, 32 * MiB);
  for (int i = 0; i < 4; ++i) {
    auto va = big->reserve(32 * MiB);
    ASSERT_TRUE(va);
    EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*va), 32 * MiB)) << *va;
  }
  for (auto [ptr, bytes] : live) ASSERT_TRUE(device->free(ptr, bytes));
}

TEST(HostDevice, BadOptionsAreRefused) {
  auto with = [](std::size_t capacity, std::size_t granularity, std::string name) {
    HostDeviceOptions options;
    options.capacity = capacity;
    options.granularity = granularity;
    options.name = std::move(name);
    return HostDevice::create(options);
  };
  struct Case {
    std::size_t capacity, granularity;
    const char* name;
    const char* mentions;
  };
  for (const Case& c : {Case{64 * MiB, 3 * MiB, "x", "granularity"},
                        Case{64 * MiB, 128, "x", "granularity"},
                        Case{64 * MiB, 0, "x", "granularity"},
                        Case{64 * MiB, 1024, "x", "granularity"},  // below the page size
                        Case{0, 2 * MiB, "x", "capacity"},
                        Case{3 * MiB, 2 * MiB, "x", "capacity"},
                        Case{64 * MiB, 2 * MiB, "", "name"},
                        Case{64 * MiB, 2 * MiB, "a/b", "name"}}) {
    auto device = with(c.capacity, c.granularity, c.name);
    ASSERT_FALSE(device) << c.capacity << " " << c.granularity << " " << c.name;
    EXPECT_EQ(device.error().code(), Errc::invalid_argument);
    EXPECT_NE(device.error().message().find(c.mentions), std::string::npos)
        << device.error().message();
  }
  EXPECT_TRUE(with(64 * MiB, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), "ok-1.a_b"));
}

TEST(HostDevice, BrokenPreconditionsAreErrorsAndTheDeviceStaysUsable) {
  auto device = make_device();
  const std::size_t g = device->granularity();
  auto va = device->reserve(8 * g);
  ASSERT_TRUE(va);
  char* base = as_bytes(*va);
  auto handle = device->create(2 * g);
  ASSERT_TRUE(handle);
  auto other = device->create(g);
  ASSERT_TRUE(other);
  const MemInfo before = device->mem_info();
  const std::size_t mappings_before = device->mapping_count();
  auto code = [](const Status& status) { return status ? Errc::corrupt_data : status.error().code(); };

  // Sizes.
  EXPECT_EQ(device->allocate(0).error().code(), Errc::invalid_argument);
  EXPECT_EQ(device->reserve(0).error().code(), Errc::invalid_argument);
  EXPECT_EQ(device->reserve(g + 1).error().code(), Errc::invalid_argument);
  EXPECT_EQ(device->create(0).error().code(), Errc::invalid_argument);
  EXPECT_EQ(device->create(g / 2).error().code(), Errc::invalid_argument);
  // Unknown handles, wrong sizes.
  EXPECT_EQ(code(device->map(base, 2 * g, 999)), Errc::invalid_argument);
  EXPECT_EQ(code(device->map(base, g, *handle)), Errc::invalid_argument);
  EXPECT_EQ(code(device->release(999, g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->release(*handle, g)), Errc::invalid_argument);
  // Map outside a reservation, unaligned, or running past its end.
  std::vector<char> outside(4 * g);
  EXPECT_EQ(code(device->map(outside.data(), 2 * g, *handle)), Errc::invalid_argument);
  EXPECT_EQ(code(device->map(base + 4096, 2 * g, *handle)), Errc::invalid_argument);
  EXPECT_EQ(code(device->map(base + 7 * g, 2 * g, *handle)), Errc::invalid_argument);
  EXPECT_EQ(code(device->map(base - g, g, *other)), Errc::invalid_argument);
  // Map over a mapped range.
  ASSERT_TRUE(device->map(base + 2 * g, 2 * g, *handle));
  EXPECT_EQ(code(device->map(base + 3 * g, 2 * g, *other)), Errc::invalid_argument);
  EXPECT_EQ(code(device->map(base + 2 * g, g, *other)), Errc::invalid_argument);
  // Release of a mapped handle; unreserve while mapped.
  EXPECT_EQ(code(device->release(*handle, 2 * g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unreserve(*va, 8 * g)), Errc::invalid_argument);
  // Unmap that is not exactly one map.
  EXPECT_EQ(code(device->unmap(base + 2 * g, g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unmap(base + 3 * g, g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unmap(base, 2 * g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unmap(outside.data(), g)), Errc::invalid_argument);
  // The mapping still holds its data through all of that.
  base[2 * g] = 'k';
  EXPECT_EQ(base[2 * g], 'k');
  ASSERT_TRUE(device->unmap(base + 2 * g, 2 * g));
  // Unreserve of something not reserved, or with the wrong size.
  EXPECT_EQ(code(device->unreserve(base + g, 7 * g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unreserve(*va, 4 * g)), Errc::invalid_argument);
  EXPECT_EQ(code(device->unreserve(outside.data(), g)), Errc::invalid_argument);
  // Free of an unknown pointer, a wrong size, twice.
  EXPECT_EQ(code(device->free(outside.data(), 16)), Errc::invalid_pointer);
  auto plain = device->allocate(1000);
  ASSERT_TRUE(plain);
  EXPECT_EQ(code(device->free(*plain, 999)), Errc::invalid_argument);
  ASSERT_TRUE(device->free(*plain, 1000));
  EXPECT_EQ(code(device->free(*plain, 1000)), Errc::invalid_pointer);
  // Release twice.
  ASSERT_TRUE(device->release(*other, g));
  Status again = device->release(*other, g);
  EXPECT_EQ(code(again), Errc::double_free);
  EXPECT_EQ(code(device->map(base, g, *other)), Errc::invalid_argument);

  // Nothing drifted, and the device still works.
  EXPECT_EQ(device->mem_info().free_bytes, before.free_bytes + g);
  EXPECT_EQ(device->mapping_count(), mappings_before);
  ASSERT_TRUE(device->map(base + 6 * g, 2 * g, *handle));
  EXPECT_EQ(base[6 * g], 'k');
  ASSERT_TRUE(device->unmap(base + 6 * g, 2 * g));
  ASSERT_TRUE(device->release(*handle, 2 * g));
  ASSERT_TRUE(device->unreserve(*va, 8 * g));
  EXPECT_EQ(device->mem_info().free_bytes, device->mem_info().total_bytes);
}

TEST(HostDevice, MappingCountFollowsTheKernel) {
  auto device = make_device(64 * MiB);
  const std::size_t g = device->granularity();
  const std::size_t start = device->mapping_count();
  auto va = device->reserve(16 * g);
  ASSERT_TRUE(va);
  char* base = as_bytes(*va);
  auto in_reservation = [&] { return kernel_mappings_in(base, 16 * g); };
  EXPECT_EQ(device->mapping_count(), start + 1);
  EXPECT_EQ(in_reservation(), 1u);

  std::vector<PhysicalHandle> h;
  for (int i = 0; i < 8; ++i) h.push_back(*device->create(g));  // contiguous memfd offsets
  auto check = [&](const char* step) {
    EXPECT_EQ(device->mapping_count() - start, in_reservation()) << step;
  };
  ASSERT_TRUE(device->map(base + 4 * g, g, h[0]));  // middle: gap, file, gap
  check("one in the middle");
  ASSERT_TRUE(device->map(base + 5 * g, g, h[1]));  // contiguous offsets: merges
  check("merged neighbour");
  ASSERT_TRUE(device->map(base + 3 * g, g, h[3]));  // offset not contiguous with h[0]
  check("non-contiguous neighbour");
  ASSERT_TRUE(device->map(base, g, h[4]));          // at the start of the reservation
  check("at the start");
  ASSERT_TRUE(device->map(base + 15 * g, g, h[7]));  // at the end
  check("at the end");
  ASSERT_TRUE(device->map(base + 6 * g, g, h[2]));  // h0 h1 h2 form one run
  check("run of three");
  ASSERT_TRUE(device->unmap(base + 5 * g, g));      // splits the run
  check("split");
  ASSERT_TRUE(device->unmap(base + 3 * g, g));
  check("unmap next to a gap");
  ASSERT_TRUE(device->unmap(base + 15 * g, g));
  check("unmap at the end");
  ASSERT_TRUE(device->unmap(base, g));
  ASSERT_TRUE(device->unmap(base + 4 * g, g));
  ASSERT_TRUE(device->unmap(base + 6 * g, g));
  check("all unmapped");
  EXPECT_EQ(device->mapping_count(), start + 1);
  for (PhysicalHandle handle : h) ASSERT_TRUE(device->release(handle, g));
  ASSERT_TRUE(device->unreserve(*va, 16 * g));
  EXPECT_EQ(device->mapping_count(), start);
}

TEST(HostDevice, MappingLimitRefusesScatteredMapsButNotContiguousRuns) {
  const std::size_t g = 2 * MiB;
  auto device = make_device(64 * MiB, g, /*max_mappings=*/8);
  EXPECT_EQ(device->max_mappings(), 8u);
  auto va = device->reserve(32 * g);
  ASSERT_TRUE(va);
  char* base = as_bytes(*va);
  std::vector<PhysicalHandle> h;
  for (int i = 0; i < 16; ++i) h.push_back(*device->create(g));

  // A run of 16 granules with contiguous offsets is one kernel mapping, however many map() calls.
  for (std::size_t i = 0; i < 16; ++i) ASSERT_TRUE(device->map(base + i * g, g, h[i]));
  EXPECT_EQ(device->mapping_count(), 2u);  // the run and the reserved space after it
  for (std::size_t i = 0; i < 16; ++i) ASSERT_TRUE(device->unmap(base + i * g, g));
  EXPECT_EQ(device->mapping_count(), 1u);

  // Every other address and every other handle: nothing merges.
  std::size_t mapped = 0;
  Status refused;
  for (std::size_t i = 0; i < 16; ++i) {
    refused = device->map(base + 2 * i * g, g, h[2 * (i % 8)]);
    if (!refused) break;
    ++mapped;
  }
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::limit_reached);
  EXPECT_NE(refused.error().message().find("would exceed 8 mappings"), std::string::npos)
      << refused.error().message();
  EXPECT_NE(refused.error().message().find("vm.max_map_count"), std::string::npos);
  EXPECT_LE(device->mapping_count(), 8u);
  EXPECT_EQ(mapped, 4u);  // file, gap, file, gap, file, gap, file, gap: the fifth makes 10
  EXPECT_EQ(kernel_mappings_in(base, 32 * g), device->mapping_count());
  // Reserve and plain allocate respect the same budget.
  while (device->mapping_count() < 8) ASSERT_TRUE(device->allocate(4096));
  EXPECT_EQ(device->reserve(g).error().code(), Errc::limit_reached);
  EXPECT_EQ(device->allocate(1).error().code(), Errc::limit_reached);
}

TEST(HostDevice, CreateSucceedsWhenFreeOffsetsAreSplit) {
  const std::size_t g = 2 * MiB;
  auto device = make_device(16 * g);
  std::vector<PhysicalHandle> h;
  for (int i = 0; i < 16; ++i) h.push_back(*device->create(g));
  for (std::size_t i = 0; i < 16; i += 2) ASSERT_TRUE(device->release(h[i], g));
  // 8 granules free, none adjacent: the handle is made of 8 memfd ranges.
  auto big = device->create(8 * g);
  ASSERT_TRUE(big) << big.error().message();
  EXPECT_EQ(device->mem_info().free_bytes, 0u);
  auto va = device->reserve(8 * g);
  ASSERT_TRUE(va);
  ASSERT_TRUE(device->map(*va, 8 * g, *big));
  char* p = as_bytes(*va);
  for (std::size_t i = 0; i < 8; ++i) std::memset(p + i * g, static_cast<int>('0' + i), g);
  ASSERT_TRUE(device->unmap(*va, 8 * g));
  ASSERT_TRUE(device->map(*va, 8 * g, *big));
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(p[i * g], static_cast<char>('0' + i));
    EXPECT_EQ(p[(i + 1) * g - 1], static_cast<char>('0' + i));
  }
  EXPECT_EQ(kernel_mappings_in(*va, 8 * g), 8u);
  ASSERT_TRUE(device->unmap(*va, 8 * g));
  ASSERT_TRUE(device->release(*big, 8 * g));
  for (std::size_t i = 1; i < 16; i += 2) ASSERT_TRUE(device->release(h[i], g));
  EXPECT_EQ(device->mem_info().free_bytes, 16 * g);
  ASSERT_TRUE(device->unreserve(*va, 8 * g));
}

TEST(HostDevice, ThreadsCreateMapUnmapReleaseWithoutDrift) {
  const std::size_t g = 64 * KiB;
  auto device = make_device(256 * MiB, g);
  const std::size_t start_mappings = device->mapping_count();
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto va = device->reserve(8 * g);
      if (!va) { ++failures; return; }
      char* base = as_bytes(*va);
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t granules = 1 + static_cast<std::size_t>((round + t) % 4);
        auto handle = device->create(granules * g);
        if (!handle) { ++failures; continue; }
        char* at = base + static_cast<std::size_t>(round % 4) * g;
        if (!device->map(at, granules * g, *handle)) ++failures;
        at[0] = static_cast<char>(t);
        at[granules * g - 1] = static_cast<char>(round);
        if (at[0] != static_cast<char>(t)) ++failures;
        if (!device->unmap(at, granules * g)) ++failures;
        if (!device->release(*handle, granules * g)) ++failures;
        auto plain = device->allocate(100 + static_cast<std::size_t>(round));
        if (!plain || !device->free(*plain, 100 + static_cast<std::size_t>(round))) ++failures;
      }
      if (!device->unreserve(*va, 8 * g)) ++failures;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(device->mem_info().free_bytes, 256 * MiB);
  EXPECT_EQ(device->mapping_count(), start_mappings);
  EXPECT_EQ(device->resident_bytes(), 0u);
}

TEST(HostDevice, DefaultMappingBudgetLeavesHeadroomBelowTheKernelLimit) {
  auto device = make_device();
  std::ifstream in("/proc/sys/vm/max_map_count");
  std::size_t kernel_limit = 65530;
  in >> kernel_limit;
  EXPECT_GT(device->max_mappings(), 0u);
  EXPECT_LT(device->max_mappings(), kernel_limit);
}

}  // namespace
}  // namespace tidepool
