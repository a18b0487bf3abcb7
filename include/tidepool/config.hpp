// Configuration from the environment or a config string: every setting
// parsed, with where it came from (Origin) and the name the user gave it. Building the stack from it is the stack layer's (stack.hpp).
//
// JAX's variables keep JAX's meaning (jaxlib's xla_client.py
// generate_pjrt_gpu_plugin_options and XLA's GpuAllocatorConfig):
//   XLA_PYTHON_CLIENT_PREALLOCATE   default true; only "false", "False", "0" turn it off
//   XLA_CLIENT_MEM_FRACTION         default 0.75 (XLA_PYTHON_CLIENT_MEM_FRACTION is its
//                                   deprecated old name; setting both is an error)
//   XLA_PYTHON_CLIENT_ALLOCATOR     default|bfc|platform|cuda_async|vmm|address (any case)
// tidepool's own TIDEPOOL_* variables are strict, and win where both are set.
// README.md has the full table.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidepool/error.hpp"

namespace tidepool {

/// What the pool of the stack is. The replay tool and the reports use the
/// same names.
enum class Mode {
  preallocate,  // BestFitPool, one region of fraction x total at start (JAX's default)
  growth,       // BestFitPool growing region by region up to fraction x total (PREALLOCATE=false)
  platform,     // PassthroughPool: every request to the device (XLA's platform)
  expandable,   // ExpandablePool: virtual memory, stitching, release (XLA's vmm)
  cuda_async,   // AsyncPool over cudaMallocAsync (CUDA only)
};

/// "preallocate", "growth", "platform", "expandable", "cuda_async".
std::string_view mode_name(Mode mode) noexcept;
/// Every mode, in declaration order.
std::span<const Mode> all_modes() noexcept;
/// The mode of a name as mode_name() writes it; an error lists the names.
Expected<Mode> parse_mode(std::string_view name);

/// Where the device memory comes from.
enum class DeviceKind { host, cuda };
/// "host" or "cuda".
std::string_view device_kind_name(DeviceKind kind) noexcept;

/// A per-process share of the device for the ledger: bytes, or a fraction of
/// the device's total. Exactly one of the two is non-zero.
struct Quota {
  std::size_t bytes = 0;
  double fraction = 0.0;

  /// The quota in bytes on a device of `device_total` bytes.
  std::size_t resolve(std::size_t device_total) const noexcept;
  /// "20.0 GiB" or "40%".
  std::string to_string() const;
};

/// Where a setting's value came from. Decisions that depend on who set a
/// value (JAX's loose rules or tidepool's strict ones, JAX's default pool)
/// test this, never the name.
enum class Origin {
  default_value,      // nothing set it
  jax_variable,       // one of JAX's variables (XLA_PYTHON_CLIENT_PREALLOCATE, ...)
  tidepool_variable,  // one of tidepool's TIDEPOOL_* variables
  plugin_variable,    // a GPU-sharing device plugin's limit (HAMi's CUDA_DEVICE_MEMORY_LIMIT)
  config_key,         // a key of a config string or a Python keyword (mem_fraction=0.5)
  program,            // the program that read the settings (`tidepool run --pool`)
};

/// How a setting was set: its origin, the name the user set it by and the
/// text they wrote. Messages about a setting use these, so they speak the
/// user's vocabulary (a variable, or a key) without translation.
struct SettingSource {
  Origin origin = Origin::default_value;
  /// The variable or key as the user wrote it ("XLA_CLIENT_MEM_FRACTION",
  /// "mem_fraction"); empty for a default. Where two settings decided one
  /// value (the mode), both names: "TIDEPOOL_ALLOCATOR, TIDEPOOL_PREALLOCATE".
  std::string name;
  /// The value's text as given; empty for a default.
  std::string text;

  bool is_default() const noexcept { return origin == Origin::default_value; }
  /// True for tidepool's own settings, by variable or key, which are read
  /// strictly (JAX's are read as JAX reads them).
  bool is_tidepool() const noexcept {
    return origin == Origin::tidepool_variable || origin == Origin::config_key;
  }
  /// "default", or the name: the source `tidepool info` shows.
  std::string source() const { return is_default() ? "default" : name; }
  /// name='text' for a message, a long text cut (format_excerpt).
  std::string quoted() const;
};

/// A value and where it came from.
template <class T>
struct Setting : SettingSource {
  Setting() = default;
  /// A default value, or one set as `from` says.
  Setting(T initial, SettingSource from = {}) : SettingSource(std::move(from)), value(std::move(initial)) {}

  T value{};
};

/// One of tidepool's settings by its two names: the environment's variable
/// and the key a config string (or a Python keyword) sets it by; an empty
/// key where a config string cannot set it.
struct SettingName {
  std::string_view variable;
  std::string_view key;
};

/// Every TIDEPOOL_* variable tidepool reads, with its key (a TIDEPOOL_*
/// variable not listed is reported as probably misspelt). Those with a key
/// are the config string's keys, in this order.
std::span<const SettingName> setting_names() noexcept;

/// How a configuration names tidepool's settings in what it says: by
/// variable (read from the environment) or by key (a config string).
enum class Vocabulary { variables, keys };

/// key -> value, in the order given: a config string's entries, Python's
/// keyword arguments.
using KeyValues = std::vector<std::pair<std::string, std::string>>;

/// Parses "key=value,key=value" (spaces around keys and values ignored; an
/// empty text is no settings). Errors (invalid_argument) name the text and
/// the entry: a missing '=', an empty or unknown key (listing the keys), a
/// key given twice.
Expected<KeyValues> parse_config_string(std::string_view text);

/// A getenv-like lookup: the value of a variable, or nullptr when unset.
using GetEnv = std::function<const char*(const char* name)>;

struct Config {
  /// The pool. From TIDEPOOL_ALLOCATOR or XLA_PYTHON_CLIENT_ALLOCATOR; for
  /// bfc/default, preallocate or growth as `preallocate` says. text keeps the
  /// spelling the user wrote (e.g. "vmm").
  /// With none of them, nor XLA_PYTHON_CLIENT_PREALLOCATE or a JAX memory
  /// fraction, set: expandable, tidepool's default. Any JAX variable brings
  /// JAX's own default back (preallocate, BFC).
  Setting<Mode> mode{Mode::expandable};
  /// The most the pool takes, as a fraction of the device's total, in (0, 1].
  Setting<double> mem_fraction{0.75};
  /// Whether bfc/default preallocates. Also passed to cuda_async (XLA reserves
  /// its pool up front when true); platform and expandable ignore it.
  Setting<bool> preallocate{true};
  Setting<DeviceKind> device{DeviceKind::host};
  /// Capacity of the host device (TIDEPOOL_DEVICE=host).
  Setting<std::size_t> host_capacity{std::size_t{16} << 30};
  /// Cached free bytes an expandable or cuda_async pool keeps before handing
  /// memory back; unset means the pool's own default.
  Setting<std::optional<std::size_t>> release_threshold;
  /// How long an expandable pool waits with no allocate or free before it
  /// releases every free granule (TIDEPOOL_IDLE_RELEASE); 0 means never.
  Setting<std::chrono::milliseconds> idle_release{std::chrono::milliseconds(0)};
  /// Whether an expandable pool keeps a stolen granule mapped where it was
  /// too (TIDEPOOL_ALIASES; ExpandableOptions::aliases).
  Setting<bool> aliases{false};
  /// The longest a wake of a sleeping tag waits, over the ledger, for other
  /// processes to free or trim (TIDEPOOL_WAKE_WAIT; LedgerOptions::wake_wait).
  Setting<std::chrono::milliseconds> wake_wait{std::chrono::milliseconds(10000)};
  /// The per-process quota in the cross-process ledger; unset means none.
  /// From TIDEPOOL_QUOTA, else the limit a GPU-sharing device plugin set for
  /// the container (HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_0, else
  /// CUDA_DEVICE_MEMORY_LIMIT; docs/cluster.md), which also turns the ledger on.
  Setting<std::optional<Quota>> quota;
  /// Whether the cross-process ledger guards the device. TIDEPOOL_QUOTA
  /// turns it on unless TIDEPOOL_LEDGER says otherwise (which is an error).
  Setting<bool> ledger{false};
  /// Permissions of a ledger segment this process creates: 0600 (this user
  /// only) or 0660 (also the group), from TIDEPOOL_LEDGER_MODE=user|group.
  Setting<unsigned> ledger_mode{0600};
  /// The ledger's shared-memory segment, "/name" (TIDEPOOL_LEDGER_NAME, which
  /// `tidepool run --ledger` sets); empty: named after the device's identity.
  Setting<std::string> ledger_name;

  /// How the messages below, and later layers' (through each setting's
  /// name), name tidepool's settings.
  Vocabulary vocabulary = Vocabulary::variables;
  /// Values that were accepted but are probably not what the user meant.
  std::vector<std::string> warnings;
  /// How the JAX variables that are set were translated, for `tidepool info`.
  std::vector<std::string> notes;

  /// Reads the process environment; `default_device` where TIDEPOOL_DEVICE
  /// is unset. Errors (invalid_argument) name the variable, the value and
  /// what is allowed. Parsing only: nothing is probed or built.
  static Expected<Config> from_env(DeviceKind default_device);
  /// Reads variables through `getenv` (e.g. a map in a test).
  static Expected<Config> from_env(const GetEnv& getenv, DeviceKind default_device);
  /// The same with the device a machine offers by default (a CUDA device
  /// when one is present: default_device_kind()). Defined by the stack
  /// layer, which can probe for one (tidepool/stack.hpp).
  static Expected<Config> from_env();
  static Expected<Config> from_env(const GetEnv& getenv);

  /// Reads settings given by key (setting_names()) and nothing else: the
  /// environment is not read, so JAX's and a device plugin's variables,
  /// which have no keys, play no part. The same rules as from_env, and
  /// every message names the keys ("mem_fraction='abc' is invalid: ...");
  /// an unknown key is an error that lists the keys.
  static Expected<Config> from_keys(const KeyValues& settings, DeviceKind default_device);
  /// The same with the machine's default device (stack layer, as from_env()).
  static Expected<Config> from_keys(const KeyValues& settings);

  /// The pool's bytes_limit on a device of `device_total` bytes: mem_fraction
  /// x total, truncated as XLA does. Bounds growth mode too, as in JAX.
  std::size_t bytes_limit(std::size_t device_total) const noexcept;

  /// The names an out-of-memory error's advice gives these settings
  /// (Error::worded): the variable or key that set each one, else tidepool's
  /// own name for it in this configuration's vocabulary ("raise
  /// TIDEPOOL_MEM_FRACTION", "raise mem_fraction").
  OomWords oom_words() const;
};

}  // namespace tidepool
