// Size classes of the best-fit arena, and a bitmap of the classes that hold a
// free chunk. Internal to the pool layer.
//
// XLA's BFC has 21 power-of-two bins and keeps each bin's free chunks in a
// std::set ordered by size; a set node per free chunk costs a heap allocation
// on every free and a tree walk on every allocation. Here small sizes get a bin
// each, so the head of the first non-empty bin at or above the request is an
// exact best fit in O(1), and the per-bin lists are intrusive (no allocation).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "tidepool/device.hpp"
#include "tidepool/units.hpp"

namespace tidepool::pool {

/// Every chunk size and address in an arena is a multiple of this.
inline constexpr std::size_t kChunkGranule = kMinAlignment;

/// Bins 0 .. kExactBins-1 hold one size each: 256, 512, ..., kExactBinLimit.
/// Above that, each power of two [2^e, 2^(e+1)) is split into 8 bins of equal
/// width, as TLSF does, so a bin's chunks differ in size by at most 12.5%.
struct SizeBins {
  static constexpr std::size_t kExactBinLimit = 1 * MiB;
  static constexpr std::size_t kExactBins = kExactBinLimit / kChunkGranule;  // 4096
  static constexpr int kSubBinBits = 3;                                      // 8 per power of two
  static constexpr int kExactLimitLog2 = 20;                                 // log2(kExactBinLimit)
  static constexpr std::size_t kNumBins =
      kExactBins + (64 - kExactLimitLog2) * (std::size_t{1} << kSubBinBits);

  /// size > 0 and a multiple of kChunkGranule.
  static constexpr std::size_t bin_of(std::size_t size) noexcept {
    if (size <= kExactBinLimit) return size / kChunkGranule - 1;
    const int log2 = std::bit_width(size) - 1;  // >= kExactLimitLog2
    const std::size_t sub = (size >> (log2 - kSubBinBits)) & ((std::size_t{1} << kSubBinBits) - 1);
    return kExactBins + static_cast<std::size_t>(log2 - kExactLimitLog2) * (std::size_t{1} << kSubBinBits) +
           sub;
  }
  /// Whether every chunk in `bin` has the same size.
  static constexpr bool is_exact(std::size_t bin) noexcept { return bin < kExactBins; }
  /// The smallest size that falls into `bin`.
  static constexpr std::size_t lower_bound(std::size_t bin) noexcept {
    if (bin < kExactBins) return (bin + 1) * kChunkGranule;
    const std::size_t above = bin - kExactBins;
    const int log2 = kExactLimitLog2 + static_cast<int>(above >> kSubBinBits);
    const std::size_t sub = above & ((std::size_t{1} << kSubBinBits) - 1);
    const std::size_t base = std::size_t{1} << log2;
    std::size_t size = base + sub * (base >> kSubBinBits);
    if (bin == kExactBins) size = kExactBinLimit + kChunkGranule;  // 2^20 itself is exact
    return size;
  }
};

/// Which bins are non-empty: one bit per bin and a summary bit per word, so
/// "first non-empty bin at or after b" is a few instructions.
class BinBitmap {
 public:
  static constexpr std::size_t kNone = SIZE_MAX;

  void set(std::size_t bin) noexcept {
    words_[bin / 64] |= bit(bin % 64);
    summary_[bin / 64 / 64] |= bit(bin / 64 % 64);
  }
  void clear(std::size_t bin) noexcept {
    std::uint64_t& word = words_[bin / 64];
    word &= ~bit(bin % 64);
    if (word == 0) summary_[bin / 64 / 64] &= ~bit(bin / 64 % 64);
  }
  bool test(std::size_t bin) const noexcept { return (words_[bin / 64] & bit(bin % 64)) != 0; }

  /// The first set bin >= from, or kNone.
  std::size_t first_at_or_after(std::size_t from) const noexcept {
    if (from >= SizeBins::kNumBins) return kNone;
    std::size_t word = from / 64;
    const std::uint64_t here = words_[word] & (~std::uint64_t{0} << (from % 64));
    if (here != 0) return word * 64 + static_cast<std::size_t>(std::countr_zero(here));
    ++word;  // the next non-empty word, found through the summary
    if (word >= kWords) return kNone;
    std::size_t s = word / 64;
    std::uint64_t candidates = summary_[s] & (~std::uint64_t{0} << (word % 64));
    for (;;) {
      if (candidates != 0) {
        const std::size_t w = s * 64 + static_cast<std::size_t>(std::countr_zero(candidates));
        return w * 64 + static_cast<std::size_t>(std::countr_zero(words_[w]));
      }
      if (++s >= kSummaryWords) break;
      candidates = summary_[s];
    }
    return kNone;
  }
  /// The last set bin, or kNone.
  std::size_t last() const noexcept {
    for (std::size_t s = kSummaryWords; s-- > 0;) {
      if (summary_[s] == 0) continue;
      const std::size_t w = s * 64 + 63 - static_cast<std::size_t>(std::countl_zero(summary_[s]));
      return w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(words_[w]));
    }
    return kNone;
  }

 private:
  static constexpr std::uint64_t bit(std::size_t i) noexcept { return std::uint64_t{1} << i; }
  static constexpr std::size_t kWords = (SizeBins::kNumBins + 63) / 64;
  static constexpr std::size_t kSummaryWords = (kWords + 63) / 64;
  std::array<std::uint64_t, kWords> words_{};
  std::array<std::uint64_t, kSummaryWords> summary_{};
};

}  // namespace tidepool::pool
