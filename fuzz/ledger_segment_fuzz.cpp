// Fuzzes the ledger's trust boundary: the shared-memory segment, which any
// process of the same user can write. Each input is a list of patches
// (offset, byte) applied to a valid segment while this process holds an
// entry in it (through a LedgerDevice), which then reserves through it;
// a trailing byte also truncates it under the live process;
// afterwards the ledger is opened again, read and reclaimed. None of it may crash or read
// out of bounds: a segment it cannot trust is refused with a message, and
// one it accepts never lets the reservations pass the limit.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "share/segment.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;

#define require(condition)                                                                      \
  do {                                                                                          \
    if (!(condition)) {                                                                         \
      std::fprintf(stderr, "ledger_segment_fuzz: broke %s (line %d)\n", #condition, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (false)

const std::string& segment_name() {
  static const std::string name = "/tidepool-fuzz-" + std::to_string(::getpid());
  return name;
}

void check_refusal(const Error& error) { require(!error.message().empty()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)Ledger::remove(segment_name());
  auto device = HostDevice::create({.capacity = 64 * MiB, .granularity = 2 * MiB, .name = "fuzz"});
  require(device.has_value());
  LedgerOptions options;
  options.segment_name = segment_name();
  options.poll_period = std::chrono::milliseconds(0);
  options.trim_wait = std::chrono::milliseconds(0);
  options.lock_timeout = std::chrono::milliseconds(50);
  {
    auto ledger = LedgerDevice::create(*device, options);
    require(ledger.has_value());
    auto handle = (*ledger)->create(4 * MiB);
    require(handle.has_value());
    require((*ledger)->release(*handle, 4 * MiB).has_value());

    // The patches, onto the live segment.
    const int fd = shm_open(segment_name().c_str(), O_RDWR, 0);
    require(fd >= 0);
    struct stat info {};
    require(fstat(fd, &info) == 0 && info.st_size > 0);
    const auto bytes = static_cast<std::size_t>(info.st_size);
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    require(mapped != MAP_FAILED);
    auto* segment = static_cast<std::uint8_t*>(mapped);
    // Left alone: the creator's ready flag and pid (a later process waits up
    // to 2 s for a creator that is alive, which would only slow the fuzzer)
    // and the pthread mutex, the C library's object, which no reader can
    // validate (a same-user process that scribbles on it can also kill ours).
    const std::size_t mutex_begin = offsetof(share::SegmentHeader, mutex);
    const std::size_t mutex_end = mutex_begin + sizeof(pthread_mutex_t);
    for (std::size_t i = 0; i + 3 <= size; i += 3) {
      const std::size_t offset = (std::size_t{data[i]} | std::size_t{data[i + 1]} << 8) % bytes;
      if (offset < offsetof(share::SegmentHeader, identity) || (offset >= mutex_begin && offset < mutex_end)) continue;
      segment[offset] = data[i + 2];
    }
    munmap(mapped, bytes);
    // A byte left over after the patches shrinks the segment under this live
    // process to 4096 + 64 times its value bytes, a whole header (smaller would
    // make the reopen below wait 2 s for it to grow) but not always whole
    // entries (issue 14: every process died of SIGBUS).
    if (size % 3 == 1) {
      const int shrink = shm_open(segment_name().c_str(), O_RDWR, 0);
      require(shrink >= 0);
      require(ftruncate(shrink, static_cast<off_t>(4096 + std::size_t{data[size - 1]} * 64)) == 0);
      close(shrink);
    }

    // The process that registered reads and reserves through the patched segment.
    auto more = (*ledger)->create(2 * MiB);
    if (more) {
      require((*ledger)->release(*more, 2 * MiB).has_value());
    } else {
      check_refusal(more.error());
    }
    (void)(*ledger)->mem_info();
  }

  // Another process (this one again, later) opens it and reads it.
  auto reopened = Ledger::open_existing(segment_name(), std::chrono::milliseconds(50));
  if (!reopened) {
    check_refusal(reopened.error());
  } else {
    auto snapshot = (*reopened)->snapshot();
    if (!snapshot) {
      check_refusal(snapshot.error());
    } else {
      require(snapshot->entries.size() <= snapshot->entry_capacity);
    }
    auto reclaimed = (*reopened)->reclaim_dead();
    if (!reclaimed) check_refusal(reclaimed.error());
  }
  (void)Ledger::remove(segment_name());
  return 0;
}
