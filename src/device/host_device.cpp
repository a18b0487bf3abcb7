#include "tidepool/host_device.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/process.hpp"
#include "device/extent_allocator.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using detail::Extent;

std::string os_error(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

/// The first number in `path`, or 0 when it cannot be read.
std::size_t read_number(const char* path) {
  std::ifstream in(path);
  std::size_t value = 0;
  if (!(in >> value)) return 0;
  return value;
}

/// Lines of /proc/self/maps: the kernel mappings the process holds now.
std::size_t process_mapping_count() {
  std::ifstream in("/proc/self/maps");
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

/// The default mapping budget: what vm.max_map_count leaves after the
/// mappings the process holds now, less headroom for what it maps later
/// (libraries, thread stacks, malloc arenas) and for splits during unmap().
std::size_t default_max_mappings(std::size_t kernel_limit) {
  const std::size_t in_use = process_mapping_count();
  const std::size_t available = kernel_limit > in_use ? kernel_limit - in_use : 0;
  const std::size_t headroom = std::max(available / 8, std::min<std::size_t>(4096, available / 2));
  return std::max<std::size_t>(available - headroom, 1);
}

constexpr std::size_t kDefaultMaxMapCount = 65530;  // Linux's DEFAULT_MAX_MAP_COUNT

}  // namespace

struct HostDevice::State {
  /// A physical handle: memfd ranges, mapped at any number of addresses
  /// (each a view of the same memory, as CUDA maps one handle at several).
  struct Physical {
    std::vector<Extent> extents;
    std::size_t bytes = 0;
    std::size_t mappings = 0;  // map() calls holding it
  };
  /// One extent mapped at an address: what the kernel sees as a file mapping
  /// (merged with an address- and offset-contiguous neighbour).
  struct Piece {
    std::size_t bytes = 0;
    std::size_t offset = 0;
  };
  struct MapCall {
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
  };
  struct PlainAllocation {
    std::size_t bytes = 0;          // as asked
    std::size_t mapped_bytes = 0;   // page-rounded: what is accounted
  };

  HostDeviceOptions options;
  MakerProcess maker;  // a forked child may not touch the parent's memfd (core/process.hpp)
  std::size_t page_size = 0;
  std::size_t kernel_limit = 0;  // vm.max_map_count when read
  int memfd = -1;

  mutable std::mutex mutex;
  detail::ExtentAllocator offsets;
  std::unordered_map<PhysicalHandle, Physical> physicals;
  PhysicalHandle next_handle = 1;  // handles are never reused: a stale one is detectable
  std::map<std::uintptr_t, std::size_t> reservations;  // base -> bytes
  std::map<std::uintptr_t, MapCall> maps;               // va -> one map() call
  std::map<std::uintptr_t, Piece> pieces;               // va -> one mapped extent
  std::unordered_map<void*, PlainAllocation> plain;
  std::size_t physical_bytes = 0;
  std::size_t plain_bytes = 0;
  std::size_t mappings = 0;  // kernel mappings held, as the kernel merges them

  explicit State(const HostDeviceOptions& device_options)
      : options(device_options), offsets(device_options.capacity) {}

  std::string who() const { return "host device \"" + options.name + "\""; }
  /// In a forked child: the memfd's memory is the parent's (MAP_SHARED), so
  /// memory made, mapped, copied into or released there would be the
  /// parent's too; as a GPU's context, the device is refused there.
  Error refused_in_child() const { return maker.refusal(who()); }

  /// The physical memory `handle` names, created with `bytes`. Errors lead
  /// with "<call> of handle N"; a handle released already is `released`
  /// (release: double_free; map: invalid_argument).
  Expected<Physical*> created(PhysicalHandle handle, std::size_t bytes, std::string_view call, Errc released) {
    auto lead = [&] { return who() + ": " + std::string(call) + " of handle " + std::to_string(handle); };
    auto physical = physicals.find(handle);
    if (physical == physicals.end()) {
      if (handle != 0 && handle < next_handle) return Error(released, lead() + ", which was released already");
      return Error(Errc::invalid_argument, lead() + ", which this device never created");
    }
    if (physical->second.bytes != bytes) {
      return Error(Errc::invalid_argument, lead() + " with " + std::to_string(bytes) +
                                               " bytes, but it was created with " +
                                               std::to_string(physical->second.bytes));
    }
    return &physical->second;
  }
  std::size_t free_bytes() const { return options.capacity - physical_bytes - plain_bytes; }

  Error out_of_memory(std::size_t requested) const {
    OomReport report;
    report.requested_bytes = requested;
    report.device_free_bytes = free_bytes();
    report.hint = format_bytes(physical_bytes) + " physical and " + format_bytes(plain_bytes) +
                  " plain of " + format_bytes(options.capacity) + " are taken";
    return Error::out_of_memory(who(), std::move(report));
  }

  Error limit_reached(std::size_t added, const char* advice) const {
    return Error(Errc::limit_reached,
                 who() + ": would exceed " + std::to_string(options.max_mappings) +
                     " mappings (holds " + std::to_string(mappings) + ", this call adds " +
                     std::to_string(added) + "; vm.max_map_count is " +
                     std::to_string(kernel_limit) + "); " + advice);
  }

  /// The reservation holding all of [va, va + bytes), or reservations.end().
  std::map<std::uintptr_t, std::size_t>::const_iterator reservation_of(std::uintptr_t va,
                                                                        std::size_t bytes) const {
    auto after = reservations.upper_bound(va);
    if (after == reservations.begin()) return reservations.end();
    auto found = std::prev(after);
    if (va + bytes > found->first + found->second || va + bytes < va) return reservations.end();
    return found;
  }

  /// What the kernel mapping count becomes when [va, va + bytes), unmapped
  /// inside [base, end), is filled with `extents` in order: the new file
  /// mappings, less those that merge with each other or with a file mapping
  /// next to them, plus the reserved space left on either side, less the one
  /// reserved mapping they replace. unmap() is the same change reversed.
  long map_delta(std::uintptr_t base, std::uintptr_t end, std::uintptr_t va, std::size_t bytes,
                 const std::vector<Extent>& extents) const {
    long delta = static_cast<long>(extents.size()) - 1;
    for (std::size_t i = 0; i + 1 < extents.size(); ++i) {
      if (extents[i].offset + extents[i].bytes == extents[i + 1].offset) --delta;
    }
    if (va > base) {
      auto left = pieces.lower_bound(va);
      if (left != pieces.begin() && std::prev(left)->first + std::prev(left)->second.bytes == va) {
        const Piece& piece = std::prev(left)->second;
        if (piece.offset + piece.bytes == extents.front().offset) --delta;
      } else {
        ++delta;  // reserved space stays on the left
      }
    }
    if (va + bytes < end) {
      auto right = pieces.find(va + bytes);
      if (right != pieces.end()) {
        if (extents.back().offset + extents.back().bytes == right->second.offset) --delta;
      } else {
        ++delta;  // reserved space stays on the right
      }
    }
    return delta;
  }

  /// Puts PROT_NONE reserved space back over [va, va + bytes).
  bool restore_reserved(std::uintptr_t va, std::size_t bytes) const {
    void* placed = mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return placed != MAP_FAILED;
  }
};

Expected<std::shared_ptr<HostDevice>> HostDevice::create(HostDeviceOptions options) {
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t page_size = page > 0 ? static_cast<std::size_t>(page) : 4096;
  const std::size_t g = options.granularity;
  if (!is_power_of_two(g) || g < page_size || g < kMinAlignment) {
    return Error(Errc::invalid_argument,
                 "HostDeviceOptions.granularity = " + std::to_string(g) +
                     ": must be a power of two, at least the page size (" +
                     std::to_string(page_size) + ") and at least " + std::to_string(kMinAlignment));
  }
  if (options.capacity == 0 || options.capacity % g != 0 ||
      options.capacity > static_cast<std::size_t>(std::numeric_limits<off_t>::max())) {
    return Error(Errc::invalid_argument,
                 "HostDeviceOptions.capacity = " + std::to_string(options.capacity) +
                     ": must be a positive multiple of the granularity (" + format_bytes(g) + ")");
  }
  const bool name_ok =
      !options.name.empty() && options.name.size() <= 200 &&
      options.name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos;
  if (!name_ok) {
    return Error(Errc::invalid_argument,
                 "HostDeviceOptions.name = \"" + options.name +
                     "\": must be 1 to 200 letters, digits, '.', '_' or '-'");
  }

  std::size_t kernel_limit = read_number("/proc/sys/vm/max_map_count");
  if (kernel_limit == 0) kernel_limit = kDefaultMaxMapCount;
  if (options.max_mappings == 0) options.max_mappings = default_max_mappings(kernel_limit);

  auto state = std::make_unique<State>(options);
  state->page_size = page_size;
  state->kernel_limit = kernel_limit;
  const std::string memfd_name = "tidepool-host:" + options.name;
  state->memfd = memfd_create(memfd_name.c_str(), MFD_CLOEXEC);
  if (state->memfd < 0) return Error(Errc::device_error, os_error("memfd_create"));
  if (ftruncate(state->memfd, static_cast<off_t>(options.capacity)) != 0) {
    Error error(Errc::device_error,
                os_error(("ftruncate of the memfd to " + format_bytes(options.capacity)).c_str()));
    close(state->memfd);
    return error;
  }
  return std::shared_ptr<HostDevice>(new HostDevice(std::move(state)));
}

HostDevice::HostDevice(std::unique_ptr<State> state) : state_(std::move(state)) {}

HostDevice::~HostDevice() {
  for (const auto& [base, bytes] : state_->reservations) munmap(reinterpret_cast<void*>(base), bytes);
  for (const auto& [ptr, allocation] : state_->plain) munmap(ptr, allocation.mapped_bytes);
  close(state_->memfd);
}

std::string HostDevice::id() const { return "host:" + state_->options.name; }

std::string HostDevice::description() const {
  return state_->who() + " (" + format_bytes(state_->options.capacity) + ", " +
         format_bytes(state_->options.granularity) + " granules)";
}

Expected<void*> HostDevice::allocate(std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  if (bytes == 0) return Error(Errc::invalid_argument, s.who() + ": allocate of 0 bytes");
  std::lock_guard lock(s.mutex);
  if (bytes > s.free_bytes()) return s.out_of_memory(bytes);
  const std::size_t mapped_bytes = round_up(bytes, s.page_size);
  if (mapped_bytes > s.free_bytes()) return s.out_of_memory(bytes);
  if (s.mappings + 1 > s.options.max_mappings) {
    return s.limit_reached(1, "free plain allocations or raise vm.max_map_count");
  }
  void* ptr = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (ptr == MAP_FAILED) {
    return Error(Errc::device_error, s.who() + ": " +
                                         os_error(("mmap of " + format_bytes(mapped_bytes)).c_str()));
  }
  s.plain.emplace(ptr, State::PlainAllocation{bytes, mapped_bytes});
  s.plain_bytes += mapped_bytes;
  s.mappings += 1;
  return ptr;
}

Status HostDevice::free(void* ptr, std::size_t bytes) {
  State& s = *state_;
  if (ptr == nullptr) return {};  // as cudaFree(nullptr)
  if (s.maker.forked()) return {};  // the child's copy goes when it exits or execs
  std::lock_guard lock(s.mutex);
  auto found = s.plain.find(ptr);
  if (found == s.plain.end()) {
    return Error(Errc::invalid_pointer, s.who() + ": free of " + format_address(ptr) +
                                            ", which is not a live allocation of this device "
                                            "(never allocated here, or freed already)");
  }
  if (found->second.bytes != bytes) {
    return Error(Errc::invalid_argument, s.who() + ": free of " + format_address(ptr) + " with " +
                                             std::to_string(bytes) + " bytes, but it was allocated with " +
                                             std::to_string(found->second.bytes));
  }
  if (munmap(ptr, found->second.mapped_bytes) != 0) {
    return Error(Errc::device_error, s.who() + ": " + os_error(("munmap of " + format_address(ptr)).c_str()));
  }
  s.plain_bytes -= found->second.mapped_bytes;
  s.mappings -= 1;
  s.plain.erase(found);
  return {};
}

MemInfo HostDevice::mem_info() const {
  if (state_->maker.forked()) return MemInfo{0, state_->options.capacity};  // none of it is the child's
  std::lock_guard lock(state_->mutex);
  return MemInfo{state_->free_bytes(), state_->options.capacity};
}

std::size_t HostDevice::granularity() const { return state_->options.granularity; }

Expected<void*> HostDevice::reserve(std::size_t va_bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  const std::size_t g = s.options.granularity;
  if (va_bytes == 0 || va_bytes % g != 0) {
    return Error(Errc::invalid_argument, s.who() + ": reserve of " + std::to_string(va_bytes) +
                                             " bytes: must be a positive multiple of the granularity (" +
                                             std::to_string(g) + ")");
  }
  std::lock_guard lock(s.mutex);
  if (s.mappings + 1 > s.options.max_mappings) {
    return s.limit_reached(1, "unreserve unused reservations or raise vm.max_map_count");
  }
  // mmap aligns to pages only: take a granule more, then trim both ends.
  const std::size_t slack = g > s.page_size ? g : 0;
  if (va_bytes + slack < va_bytes) {
    return Error(Errc::invalid_argument, s.who() + ": reserve of " + std::to_string(va_bytes) +
                                             " bytes is more address space than exists");
  }
  void* raw = mmap(nullptr, va_bytes + slack, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return Error(Errc::device_error,
                 s.who() + ": " + os_error(("reserving " + format_bytes(va_bytes) +
                                            " of address space").c_str()));
  }
  const auto raw_base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = round_up(raw_base, g);
  if (base > raw_base) munmap(raw, base - raw_base);
  const std::uintptr_t end = base + va_bytes;
  if (raw_base + va_bytes + slack > end) {
    munmap(reinterpret_cast<void*>(end), raw_base + va_bytes + slack - end);
  }
  s.reservations.emplace(base, va_bytes);
  s.mappings += 1;
  return reinterpret_cast<void*>(base);
}

Status HostDevice::unreserve(void* va, std::size_t va_bytes) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the child's copy goes when it exits or execs
  const auto base = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard lock(s.mutex);
  auto found = s.reservations.find(base);
  if (found == s.reservations.end()) {
    return Error(Errc::invalid_argument,
                 s.who() + ": unreserve of " + format_address(va) + ", which is not the start of a reservation");
  }
  if (found->second != va_bytes) {
    return Error(Errc::invalid_argument, s.who() + ": unreserve of " + format_address(va) + " with " +
                                             std::to_string(va_bytes) + " bytes, but it reserved " +
                                             std::to_string(found->second));
  }
  auto mapped = s.maps.lower_bound(base);
  if (mapped != s.maps.end() && mapped->first < base + va_bytes) {
    return Error(Errc::invalid_argument, s.who() + ": unreserve of " + format_address(va) +
                                             ", which still has " +
                                             std::to_string(mapped->second.bytes) +
                                             " bytes mapped at " + format_address(mapped->first));
  }
  if (munmap(va, va_bytes) != 0) {
    return Error(Errc::device_error, s.who() + ": " + os_error(("munmap of " + format_address(va)).c_str()));
  }
  s.reservations.erase(found);
  s.mappings -= 1;
  return {};
}

Expected<PhysicalHandle> HostDevice::create(std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  const std::size_t g = s.options.granularity;
  if (bytes == 0 || bytes % g != 0) {
    return Error(Errc::invalid_argument, s.who() + ": create of " + std::to_string(bytes) +
                                             " bytes: must be a positive multiple of the granularity (" +
                                             std::to_string(g) + ")");
  }
  std::lock_guard lock(s.mutex);
  if (bytes > s.free_bytes()) return s.out_of_memory(bytes);
  // Plain allocations take no memfd offsets, so the offsets hold at least
  // free_bytes() and the allocation cannot fail here.
  std::vector<Extent> extents = s.offsets.allocate(bytes);
  const PhysicalHandle handle = s.next_handle++;
  s.physicals.emplace(handle, State::Physical{std::move(extents), bytes, 0});
  s.physical_bytes += bytes;
  return handle;
}

Status HostDevice::map(void* va, std::size_t bytes, PhysicalHandle handle) {
  return map_many(va, bytes, std::span<const PhysicalHandle>(&handle, 1));
}

Status HostDevice::map_many(void* va, std::size_t bytes, std::span<const PhysicalHandle> handles) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  const auto address = reinterpret_cast<std::uintptr_t>(va);
  const std::size_t total = bytes * handles.size();
  std::lock_guard lock(s.mutex);
  if (handles.empty()) return {};
  std::vector<State::Physical*> targets;
  targets.reserve(handles.size());
  for (const PhysicalHandle handle : handles) {
    Expected<State::Physical*> physical = s.created(handle, bytes, "map", Errc::invalid_argument);
    if (!physical) return std::move(physical).error();
    targets.push_back(*physical);
  }
  if (handles.size() > 1) {  // the same handle twice in one call (sorted: a run of 512 stays cheap)
    std::vector<PhysicalHandle> sorted(handles.begin(), handles.end());
    std::sort(sorted.begin(), sorted.end());
    if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
      return Error(Errc::invalid_argument, s.who() + ": map of handle " + std::to_string(*twice) +
                                               ", which is already mapped at " + format_address(address) +
                                               " by this same call");
    }
  }
  if (!is_aligned(address, s.options.granularity)) {
    return Error(Errc::invalid_argument, s.who() + ": map at " + format_address(va) +
                                             ", which is not aligned to the granularity (" +
                                             std::to_string(s.options.granularity) + ")");
  }
  auto reservation = s.reservation_of(address, total);
  if (reservation == s.reservations.end()) {
    return Error(Errc::invalid_argument, s.who() + ": map of [" + format_address(va) + ", +" +
                                             std::to_string(total) +
                                             "), which is not inside one reservation");
  }
  auto next = s.maps.lower_bound(address);
  auto overlapping = s.maps.end();
  if (next != s.maps.end() && next->first < address + total) overlapping = next;
  if (next != s.maps.begin() && std::prev(next)->first + std::prev(next)->second.bytes > address) {
    overlapping = std::prev(next);
  }
  if (overlapping != s.maps.end()) {
    return Error(Errc::invalid_argument,
                 s.who() + ": map of [" + format_address(va) + ", +" + std::to_string(total) +
                     "), which overlaps handle " + std::to_string(overlapping->second.handle) +
                     " mapped at " + format_address(overlapping->first));
  }

  // Every handle's memfd ranges in address order; one mmap per run of them
  // that is contiguous in the memfd too.
  std::vector<Extent> extents;
  for (const State::Physical* target : targets) {
    extents.insert(extents.end(), target->extents.begin(), target->extents.end());
  }
  const std::uintptr_t end = reservation->first + reservation->second;
  const long delta = s.map_delta(reservation->first, end, address, total, extents);
  if (delta > 0 && s.mappings + static_cast<std::size_t>(delta) > s.options.max_mappings) {
    return s.limit_reached(static_cast<std::size_t>(delta),
                           "map adjacent granules together or raise vm.max_map_count");
  }
  std::uintptr_t at = address;
  for (std::size_t i = 0; i < extents.size();) {
    std::size_t run = extents[i].bytes;
    std::size_t j = i + 1;
    while (j < extents.size() && extents[j].offset == extents[i].offset + run) run += extents[j++].bytes;
    void* placed = mmap(reinterpret_cast<void*>(at), run, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                        s.memfd, static_cast<off_t>(extents[i].offset));
    if (placed == MAP_FAILED) {
      Error error(Errc::device_error, s.who() + ": " + os_error(("map at " + format_address(at)).c_str()));
      s.restore_reserved(address, at - address);
      return error;
    }
    at += run;
    i = j;
  }
  at = address;
  for (const Extent& extent : extents) {
    s.pieces.emplace(at, State::Piece{extent.bytes, extent.offset});
    at += extent.bytes;
  }
  for (std::size_t i = 0; i < handles.size(); ++i) {
    s.maps.emplace(address + i * bytes, State::MapCall{bytes, handles[i]});
    ++targets[i]->mappings;
  }
  s.mappings = static_cast<std::size_t>(static_cast<long>(s.mappings) + delta);
  return {};
}

Status HostDevice::unmap(void* va, std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the child's copy goes when it exits or execs
  const auto address = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard lock(s.mutex);
  auto found = s.maps.find(address);
  if (found == s.maps.end()) {
    return Error(Errc::invalid_argument,
                 s.who() + ": unmap of " + format_address(va) + ", where no map() call starts");
  }
  if (found->second.bytes != bytes) {
    return Error(Errc::invalid_argument, s.who() + ": unmap of " + format_address(va) + " with " +
                                             std::to_string(bytes) + " bytes, but " +
                                             std::to_string(found->second.bytes) +
                                             " were mapped there");
  }
  State::Physical& target = s.physicals.at(found->second.handle);
  auto reservation = s.reservation_of(address, bytes);
  const std::uintptr_t end = reservation->first + reservation->second;
  // Take this call's pieces out first, so the neighbours map_delta sees are the others.
  auto first_piece = s.pieces.find(address);
  auto past_pieces = s.pieces.lower_bound(address + bytes);
  std::map<std::uintptr_t, State::Piece> own;
  own.insert(first_piece, past_pieces);
  s.pieces.erase(first_piece, past_pieces);
  const long delta = -s.map_delta(reservation->first, end, address, bytes, target.extents);
  if (!s.restore_reserved(address, bytes)) {
    Error error(Errc::device_error, s.who() + ": " + os_error(("unmap at " + format_address(va)).c_str()));
    s.pieces.insert(own.begin(), own.end());
    return error;
  }
  s.maps.erase(found);
  --target.mappings;
  s.mappings = static_cast<std::size_t>(static_cast<long>(s.mappings) + delta);
  return {};
}

Status HostDevice::release(PhysicalHandle handle, std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();  // a punched hole would be the parent's
  std::lock_guard lock(s.mutex);
  Expected<State::Physical*> physical = s.created(handle, bytes, "release", Errc::double_free);
  if (!physical) return std::move(physical).error();
  State::Physical& target = **physical;
  if (target.mappings != 0) {
    const auto mapped = std::find_if(s.maps.begin(), s.maps.end(),
                                     [handle](const auto& call) { return call.second.handle == handle; });
    return Error(Errc::invalid_argument, s.who() + ": release of handle " + std::to_string(handle) +
                                             ", which is still mapped at " + format_address(mapped->first) +
                                             (target.mappings > 1 ? " and " + std::to_string(target.mappings - 1) +
                                                                        " other addresses"
                                                                  : std::string()));
  }
  for (const Extent& extent : target.extents) {
    if (fallocate(s.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(extent.offset), static_cast<off_t>(extent.bytes)) != 0) {
      return Error(Errc::device_error,
                   s.who() + ": " + os_error(("punching out memfd offset " +
                                              std::to_string(extent.offset)).c_str()));
    }
  }
  for (const Extent& extent : target.extents) s.offsets.free(extent);
  s.physical_bytes -= bytes;
  s.physicals.erase(handle);
  return {};
}

Status HostDevice::synchronize(Stream) { return {}; }

Expected<bool> HostDevice::query(Stream) { return true; }

Expected<void*> HostDevice::allocate_host(std::size_t bytes) {
  if (bytes == 0) return Error(Errc::invalid_argument, state_->who() + ": allocate_host of 0 bytes");
  void* ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (ptr == MAP_FAILED) {
    return Error(Errc::out_of_memory,
                 state_->who() + ": " + os_error(("allocate_host of " + format_bytes(bytes)).c_str()));
  }
  return ptr;
}

Status HostDevice::free_host(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || munmap(ptr, bytes) != 0) {
    return Error(Errc::invalid_pointer, state_->who() + ": free_host of " + format_address(ptr) + " (" +
                                            format_bytes(bytes) + "): not a buffer from allocate_host");
  }
  return {};
}

Status HostDevice::copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (state_->maker.forked()) return state_->refused_in_child();
  std::memcpy(host_dst, device_src, bytes);
  return {};
}

Status HostDevice::copy_from_host(void* device_dst, const void* host_src, std::size_t bytes) {
  if (state_->maker.forked()) return state_->refused_in_child();
  std::memcpy(device_dst, host_src, bytes);
  return {};
}

std::size_t HostDevice::mapping_count() const {
  if (state_->maker.forked()) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->mappings;
}

std::size_t HostDevice::max_mappings() const { return state_->options.max_mappings; }

std::size_t HostDevice::resident_bytes() const {
  struct stat info {};
  if (fstat(state_->memfd, &info) != 0) return 0;
  return static_cast<std::size_t>(info.st_blocks) * 512;
}

}  // namespace tidepool
