#include "tidepool/units.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace tidepool {
namespace {

TEST(ParseBytes, AcceptsNumbersAndBinaryUnits) {
  EXPECT_EQ(*parse_bytes("4096"), 4096u);
  EXPECT_EQ(*parse_bytes("80GiB"), 80 * GiB);
  EXPECT_EQ(*parse_bytes("80g"), 80 * GiB);
  EXPECT_EQ(*parse_bytes(" 512 MiB "), 512 * MiB);
  EXPECT_EQ(*parse_bytes("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(*parse_bytes("2KB"), 2 * KiB);
  EXPECT_EQ(*parse_bytes("0"), 0u);
}

TEST(ParseBytes, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "-3", "abc", "12XB", "1.2.3", "GiB", "99999999999999999999",
                          "20000000000TiB", "+5"}) {
    auto parsed = parse_bytes(bad);
    ASSERT_FALSE(parsed) << bad;
    EXPECT_EQ(parsed.error().code(), Errc::invalid_argument);
    EXPECT_NE(parsed.error().message().find(bad), std::string::npos) << parsed.error().message();
  }
}

TEST(FormatBytes, ReadsLikeAPerson) {
  EXPECT_EQ(format_bytes(256), "256 B");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(80 * GiB), "80.0 GiB");
  EXPECT_EQ(format_bytes(12 * MiB), "12.0 MiB");
}

TEST(FormatAddress, LowerCaseHexWithPrefix) {
  EXPECT_EQ(format_address(std::uintptr_t{0x7f3a2c000000}), "0x7f3a2c000000");
  EXPECT_EQ(format_address(std::uintptr_t{0xFFFFFFFFFFFFFFFF}), "0xffffffffffffffff");
  EXPECT_EQ(format_address(nullptr), "0x0");
  const int object = 0;
  EXPECT_EQ(format_address(&object), format_address(reinterpret_cast<std::uintptr_t>(&object)));
}

TEST(Expected, CarriesValueOrError) {
  Expected<int> ok = 3;
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, 3);
  Expected<int> bad = Error(Errc::invalid_argument, "nope");
  ASSERT_FALSE(bad);
  EXPECT_THROW(bad.value(), Exception);
  Status fine;
  EXPECT_TRUE(fine);
  Status oom = Error::out_of_memory("bfc", OomReport{.requested_bytes = 1024, .hint = "try less"});
  ASSERT_FALSE(oom);
  ASSERT_NE(oom.error().oom(), nullptr);
  EXPECT_EQ(oom.error().oom()->requested_bytes, 1024u);
  EXPECT_NE(oom.error().message().find("try less"), std::string::npos);
}

// An Expected is its value, a flag and a pointer to its Error (a Status the
// pointer alone), so the allocation paths move a few words; a copy has an
// Error of its own.
TEST(Expected, KeepsItsErrorOnTheHeapAndCopiesItDeeply) {
  static_assert(sizeof(Status) == sizeof(void*));
  static_assert(sizeof(Expected<void*>) <= 3 * sizeof(void*));
  Expected<std::string> bad = Error(Errc::invalid_argument, "nope");
  const Expected<std::string> copy = bad;
  const Error taken = std::move(bad).error();
  EXPECT_EQ(taken.message(), "nope");
  ASSERT_FALSE(copy);
  EXPECT_EQ(copy.error().message(), "nope");
  Expected<std::unique_ptr<int>> owned = std::make_unique<int>(7);
  const Expected<std::unique_ptr<int>> moved = std::move(owned);
  ASSERT_TRUE(moved);
  EXPECT_EQ(**moved, 7);
  Status failed = Error(Errc::io_error, "disk");
  const Status again = failed;
  failed = Status{};
  EXPECT_TRUE(failed);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), Errc::io_error);
  EXPECT_EQ(again.error().message(), "disk");
}

// A pool's advice is a code; the message words it in the names the caller
// has: the C++ options by default, a variable or a key when an edge asks.
TEST(Error, AnOomsAdviceIsWordedInTheCallersNames) {
  OomReport report{.requested_bytes = 1024, .hint = "the pool is at its limit of 1.00 KiB"};
  report.advice = OomAdvice::free_or_raise_limit;
  const Error oom = Error::out_of_memory("growth pool", report);
  EXPECT_NE(oom.message().find("at its limit of 1.00 KiB; free memory, or raise the pool's LimitDevice"),
            std::string::npos)
      << oom.message();
  OomWords keys;
  keys.limit = "mem_fraction";
  const Error worded = oom.worded(keys);
  EXPECT_NE(worded.message().find("; free memory, or raise mem_fraction"), std::string::npos) << worded.message();
  EXPECT_EQ(worded.message().find("LimitDevice"), std::string::npos) << worded.message();
  EXPECT_EQ(worded.message().substr(0, 12), "growth pool:");
  ASSERT_NE(worded.oom(), nullptr);
  EXPECT_EQ(worded.oom()->hint, report.hint);  // the facts, unworded
  keys.limit.clear();  // nothing to raise: only the rest of the advice
  EXPECT_NE(oom.worded(keys).message().find("Hint: the pool is at its limit of 1.00 KiB; free memory"),
            std::string::npos);
  const Error other(Errc::invalid_argument, "not an OOM");
  EXPECT_EQ(other.worded(keys).message(), "not an OOM");
}

}  // namespace
}  // namespace tidepool

TEST(Units, GpuUuidIsWrittenAsNvidiaSmiDoes) {
  const char bytes[16] = {'\x8f', '\x1a', 0, '\x7e', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, '\xff'};
  EXPECT_EQ(tidepool::format_gpu_uuid(bytes), "GPU-8f1a007e-0102-0304-0506-0708090a0bff");
}
