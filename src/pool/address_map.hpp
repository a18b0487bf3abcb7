// A flat hash map from a block's start address to its chunk id: the arena's
// O(1) pointer lookup. Internal to the pool layer.
//
// XLA's BFC keeps an int per 256 bytes of every region (1/64 of the pool in
// host memory: 1.25 GiB for an 80 GiB card). This map holds a slot per live
// block instead (free chunks are reached through their neighbours), with linear probing and backward-shift deletion (no
// tombstones), so lookups stay short however long the pool lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tidepool::pool {

class AddressMap {
 public:
  using Value = std::uint32_t;
  static constexpr Value kMissing = UINT32_MAX;

  AddressMap() { slots_.resize(kInitialSlots); }

  /// address != 0 and not in the map yet.
  void insert(std::uintptr_t address, Value value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(address, value);
    ++size_;
  }

  /// The value stored for `address`, or kMissing.
  Value find(std::uintptr_t address) const noexcept {
    for (std::size_t i = home(address);; i = next(i)) {
      const Slot& slot = slots_[i];
      if (slot.address == address) return slot.value;
      if (slot.address == 0) return kMissing;
    }
  }

  /// Removes `address` and returns its value, or returns kMissing if it is
  /// not in the map.
  Value take(std::uintptr_t address) noexcept {
    std::size_t hole = home(address);
    while (slots_[hole].address != address) {
      if (slots_[hole].address == 0) return kMissing;
      hole = next(hole);
    }
    const Value value = slots_[hole].value;
    // Backward shift: move later entries of the probe run into the hole when
    // their home position does not lie cyclically in (hole, i].
    for (std::size_t i = next(hole);; i = next(i)) {
      const Slot& slot = slots_[i];
      if (slot.address == 0) break;
      const std::size_t want = home(slot.address);
      const bool stays = hole <= i ? (hole < want && want <= i) : (hole < want || want <= i);
      if (!stays) {
        slots_[hole] = slot;
        hole = i;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return value;
  }

  std::size_t size() const noexcept { return size_; }

 private:
  struct Slot {
    std::uintptr_t address = 0;
    Value value = kMissing;
  };
  static constexpr std::size_t kInitialSlots = 1024;

  std::size_t home(std::uintptr_t address) const noexcept {
    // Addresses are multiples of 256: drop the zero bits, then mix (Fibonacci hashing).
    const std::uint64_t mixed = (static_cast<std::uint64_t>(address) >> 8) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(mixed >> shift_);
  }
  std::size_t next(std::size_t i) const noexcept { return (i + 1) & (slots_.size() - 1); }

  void place(std::uintptr_t address, Value value) noexcept {
    std::size_t i = home(address);
    while (slots_[i].address != 0) i = next(i);
    slots_[i] = Slot{address, value};
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    --shift_;
    for (const Slot& slot : old) {
      if (slot.address != 0) place(slot.address, slot.value);
    }
  }

  std::vector<Slot> slots_;
  int shift_ = 64 - 10;  // log2(kInitialSlots) = 10
  std::size_t size_ = 0;
};

}  // namespace tidepool::pool
