// Errors as values. A failed allocation, a bad pointer or a bad setting is an
// `Error` carried in an `Expected<T>`; `Exception` is how it leaves at an API
// edge (the command, the bindings) when the caller prefers to throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tidepool {

enum class Errc {
  out_of_memory,     // the device or the pool cannot serve the request
  invalid_argument,  // a request or setting outside what is allowed
  invalid_pointer,   // a pointer this allocator never handed out
  double_free,       // a pointer handed out, then freed already
  unsupported,       // the device lacks the capability (e.g. virtual memory)
  device_error,      // the driver or the OS refused (carries its message)
  limit_reached,     // an OS or driver limit (e.g. vm.max_map_count)
  corrupt_data,      // a trace, ledger segment or file that cannot be trusted
  io_error,          // a file could not be read or written
};

/// Name of an error code, e.g. "out_of_memory".
const char* errc_name(Errc code) noexcept;

/// What an out-of-memory error advises changing, as a code: the pool knows
/// which setting would help, the layer that knows the caller's names for the
/// settings (an environment variable, a config-string key) words it.
enum class OomAdvice : std::uint8_t {
  none,
  raise_limit,          // the request is larger than the limit
  free_or_raise_limit,  // the limit is taken
  lower_limit,          // preallocating the limit failed
  use_expandable,       // free memory is split into blocks too small
  lower_quota,          // a ledger quota does not fit beside the others' commitments
};

/// The caller's names for the settings an OOM's advice is about. The
/// defaults are the C++ API's (a pool's limit is its device's, a LimitDevice
/// under it when smaller).
struct OomWords {
  std::string limit = "the pool's LimitDevice";             // empty: no advice about the limit
  std::string grow_on_demand = "BestFitOptions::preallocate = false";
  std::string expandable = "ExpandablePool";
  std::string quota = "LedgerOptions::quota_bytes";
};

/// `advice` in `words`, e.g. "raise TIDEPOOL_MEM_FRACTION"; empty for none
/// (or a limit with no name).
std::string oom_advice(OomAdvice advice, const OomWords& words);

/// What an out-of-memory error knows about the state that refused it.
struct OomReport {
  std::size_t requested_bytes = 0;
  std::size_t bytes_in_use = 0;        // live bytes handed out by the pool
  std::size_t bytes_reserved = 0;      // bytes the pool holds from the device
  std::size_t device_free_bytes = 0;   // what the device says is free
  std::size_t largest_free_block_bytes = 0;  // largest block the pool could hand out
  std::string hint;                    // the facts behind it; may be empty
  OomAdvice advice = OomAdvice::none;  // what to change (worded by Error::worded)

  /// The hint with its advice in `words`, as the message shows it.
  std::string worded_hint(const OomWords& words) const;
};

class Error {
 public:
  Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}
  /// An out-of-memory error; the message is composed from the report, its
  /// advice in `words`.
  static Error out_of_memory(std::string_view who, OomReport report, const OomWords& words = {});
  /// This error with an OOM report's advice worded in `words`: what an API
  /// edge returns, in its caller's names. Other errors come back unchanged.
  Error worded(const OomWords& words) const;

  Errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// The report of an out-of-memory error, or null.
  const OomReport* oom() const noexcept { return oom_ ? &*oom_ : nullptr; }

 private:
  Errc code_;
  std::string message_;
  std::optional<OomReport> oom_;
  std::string oom_who_;  // out_of_memory's `who`, for worded()
};

/// An `Error` thrown at an API edge.
class Exception : public std::runtime_error {
 public:
  explicit Exception(Error error) : std::runtime_error(error.message()), error_(std::move(error)) {}
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

// The error lives on the heap, so that an Expected is its value, a flag and
// one pointer: returning one from the allocation paths stores a few words,
// and destroying one is a test or two (an Error, with its message and OOM report,
// is some 200 bytes; errors are the rare path).
namespace detail {
inline std::unique_ptr<Error> copy_error(const std::unique_ptr<Error>& error) {
  return error ? std::make_unique<Error>(*error) : nullptr;
}
}  // namespace detail

/// A value or the error that prevented it (std::expected is C++23).
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)), has_value_(true) {}  // NOLINT: implicit by design
  Expected(Error error) : error_(std::make_unique<Error>(std::move(error))) {}  // NOLINT
  Expected(const Expected& other) : error_(detail::copy_error(other.error_)), has_value_(other.has_value_) {
    if (has_value_) std::construct_at(&value_, other.value_);
  }
  // A moved-from Expected keeps its state: a (moved-from) value, or an error
  // that is gone (error() may not be called on it).
  Expected(Expected&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
      : error_(std::move(other.error_)), has_value_(other.has_value_) {
    if (has_value_) std::construct_at(&value_, std::move(other.value_));
  }
  Expected& operator=(const Expected& other) {
    if (this != &other) *this = Expected(other);
    return *this;
  }
  Expected& operator=(Expected&& other) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (this != &other) {
      destroy_value();
      error_ = std::move(other.error_);
      if (other.has_value_) std::construct_at(&value_, std::move(other.value_));
      has_value_ = other.has_value_;
    }
    return *this;
  }
  ~Expected() { destroy_value(); }

  bool has_value() const noexcept { return has_value_; }
  explicit operator bool() const noexcept { return has_value_; }

  /// The value; throws `Exception` if this holds an error.
  T& value() & {
    if (!has_value_) throw Exception(*error_);
    return value_;
  }
  const T& value() const& {
    if (!has_value_) throw Exception(*error_);
    return value_;
  }
  T&& value() && {
    if (!has_value_) throw Exception(*error_);
    return std::move(value_);
  }
  T& operator*() & { return value_; }
  const T& operator*() const& { return value_; }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

  /// Precondition: !has_value().
  const Error& error() const& { return *error_; }
  Error&& error() && { return std::move(*error_); }

 private:
  void destroy_value() noexcept {
    if (has_value_) std::destroy_at(&value_);
    has_value_ = false;
  }
  // Not std::optional: GCC 12 takes a disengaged optional in a copy for
  // maybe-uninitialized, in the caller's code, under -Werror too.
  union {
    T value_;
  };
  std::unique_ptr<Error> error_;
  bool has_value_ = false;
};

/// Success or an error.
template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() noexcept = default;
  Expected(Error error) : error_(std::make_unique<Error>(std::move(error))) {}  // NOLINT: implicit by design
  Expected(const Expected& other) : error_(detail::copy_error(other.error_)) {}
  Expected& operator=(const Expected& other) {
    if (this != &other) error_ = detail::copy_error(other.error_);
    return *this;
  }
  Expected(Expected&&) noexcept = default;
  Expected& operator=(Expected&&) noexcept = default;
  ~Expected() = default;

  bool has_value() const noexcept { return error_ == nullptr; }
  explicit operator bool() const noexcept { return has_value(); }
  /// Throws `Exception` if this holds an error.
  void value() const {
    if (error_) throw Exception(*error_);
  }
  /// Precondition: !has_value().
  const Error& error() const& { return *error_; }
  Error&& error() && { return std::move(*error_); }

 private:
  std::unique_ptr<Error> error_;
};

using Status = Expected<void>;

}  // namespace tidepool
