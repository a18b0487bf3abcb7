// Byte sizes: parsing what users type ("80GiB", "512MiB", "4096") and printing
// sizes (and addresses) people can read. Shared by config, the command and the reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tidepool/error.hpp"

namespace tidepool {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;
inline constexpr std::size_t TiB = std::size_t{1} << 40;

/// Precondition: alignment is a power of two.
constexpr std::size_t round_up(std::size_t n, std::size_t alignment) noexcept {
  return (n + alignment - 1) & ~(alignment - 1);
}
constexpr bool is_aligned(std::uintptr_t n, std::size_t alignment) noexcept {
  return (n & (alignment - 1)) == 0;
}

/// Parses a byte count: a non-negative number (decimals allowed with a unit)
/// followed by an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB
/// (case-insensitive; all units are binary, as GPU memory is). "80GiB",
/// "1.5G", "4096". An error names the text and what is allowed.
Expected<std::size_t> parse_bytes(std::string_view text);

/// "1.50 GiB", "256 B", "12.0 MiB": three significant digits, binary units.
std::string format_bytes(std::size_t bytes);

/// "0x7f3a2c000000": an address as error messages and dump() print it
/// (lower-case hex digits, no padding; null is "0x0").
std::string format_address(std::uintptr_t address);
std::string format_address(const void* address);
/// A GPU's 16-byte UUID as nvidia-smi writes it: "GPU-" then 8-4-4-4-12
/// lower-case hex digits. One form for CudaDevice::id() and the interposer,
/// so that both name the same ledger for a GPU.
std::string format_gpu_uuid(const char (&bytes)[16]);

/// A value as error messages quote it: whole when at most `max_chars`
/// characters, else its first `max_chars` and "... (N bytes in all)", so a
/// megabyte of bad input never becomes a megabyte of message.
std::string format_excerpt(std::string_view text, std::size_t max_chars = 80);

}  // namespace tidepool
