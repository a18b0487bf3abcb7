// Reading the configuration: JAX's variables with JAX's meaning, tidepool's
// own (by variable or by key) strictly, tidepool's winning where both are
// set. One parser reads both the environment and a config string through a
// Reader, which hands each setting over with its origin and the name the
// user gave it; every message is built from those names, never rewritten.
#include "tidepool/config.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "config/setting_names.hpp"
#include "tidepool/units.hpp"

extern char** environ;  // POSIX: the process environment, for spotting misspelt names

namespace tidepool {
namespace {

constexpr std::array<Mode, 5> kModes = {Mode::preallocate, Mode::growth, Mode::platform,
                                        Mode::expandable, Mode::cuda_async};

// The CUDA device the stack uses (make_device: CudaDevice::open(0)), whose
// CUDA_DEVICE_MEMORY_LIMIT_<index> applies.
constexpr int kHamiDeviceIndex = 0;

constexpr const char* kJaxFalseSpellings = "'false', 'False' or '0'";
constexpr const char* kStrictBoolAllowed = "true, false, 1, 0, yes, no, on or off";
constexpr const char* kFractionAllowed = "a number greater than 0 and at most 1, e.g. 0.75";

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

Error invalid(const SettingSource& given, std::string_view why, std::string_view allowed) {
  return Error(Errc::invalid_argument,
               given.quoted() + " is invalid: " + std::string(why) + "; allowed: " + std::string(allowed));
}

// Where a parse reads its settings, and how it names them: the environment
// by variable (JAX's and a device plugin's too), or a config string by key
// (tidepool's settings alone). Each setting comes back with its origin and
// the name the user used, so every message is worded in their vocabulary
// from the start.
class Reader {
 public:
  static Reader environment(const GetEnv& getenv) { return Reader(&getenv, nullptr); }
  static Reader keys(const KeyValues& settings) { return Reader(nullptr, &settings); }

  Vocabulary vocabulary() const noexcept { return keys_ ? Vocabulary::keys : Vocabulary::variables; }
  /// How this source names one of tidepool's settings (for advice about a
  /// setting that may not be set).
  std::string name(const SettingName& setting) const { return config_names::name_in(vocabulary(), setting); }

  /// One of tidepool's settings, or nullopt when unset.
  std::optional<SettingSource> get(const SettingName& setting) const {
    if (keys_) {
      for (const auto& [key, text] : *keys_)
        if (!setting.key.empty() && key == setting.key) return SettingSource{Origin::config_key, key, text};
      return std::nullopt;
    }
    return variable(std::string(setting.variable), Origin::tidepool_variable);
  }
  /// Another program's variable (JAX's, a device plugin's), or nullopt when
  /// unset: a config string has none of them.
  std::optional<SettingSource> variable(const std::string& name, Origin origin) const {
    if (keys_) return std::nullopt;
    const char* text = (*getenv_)(name.c_str());
    if (text == nullptr) return std::nullopt;
    return SettingSource{origin, name, text};
  }
  /// A JAX variable; JAX reads one set to "" as unset (os.getenv(...) is falsy).
  std::optional<SettingSource> jax(const char* name) const {
    auto found = variable(name, Origin::jax_variable);
    if (found && found->text.empty()) return std::nullopt;
    return found;
  }

 private:
  Reader(const GetEnv* getenv, const KeyValues* keys) : getenv_(getenv), keys_(keys) {}

  const GetEnv* getenv_;
  const KeyValues* keys_;
};

/// A decimal number, the whole text (surrounding spaces allowed, as Python's
/// float() allows them).
std::optional<double> parse_number(std::string_view text) {
  std::string_view s = trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double value = 0.0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

Expected<double> parse_fraction(const SettingSource& given) {
  const std::string_view text = given.text;
  auto value = parse_number(text);
  if (!value) return invalid(given, "not a number", kFractionAllowed);
  if (*value <= 0.0) return invalid(given, "must be greater than 0", kFractionAllowed);
  if (*value > 1.0)
    return invalid(given,
                   "more than the whole device (tidepool does not oversubscribe)",
                   kFractionAllowed);
  return *value;
}

Expected<bool> parse_strict_bool(const SettingSource& given) {
  const std::string_view text = given.text;
  const std::string word = lower(trim(text));
  if (word == "true" || word == "1" || word == "yes" || word == "on") return true;
  if (word == "false" || word == "0" || word == "no" || word == "off") return false;
  return invalid(given, text.empty() ? "empty" : "not a boolean", kStrictBoolAllowed);
}

constexpr const char* kDurationAllowed =
    "a duration: seconds, or a number with ms, s, min or h (e.g. 30s, 500ms, 2min); 0 for never";

// A duration of at most 30 days, rounded up to whole milliseconds.
Expected<std::chrono::milliseconds> parse_duration(const SettingSource& given) {
  const std::string_view text = given.text;
  const std::string word = lower(trim(text));
  std::string_view number = word;
  double ms_per_unit = 1000.0;  // a bare number is seconds
  // "ms" before "s": both end in s.
  for (auto [suffix, scale] : {std::pair<std::string_view, double>{"ms", 1.0}, {"min", 60e3}, {"s", 1e3}, {"h", 3600e3}}) {
    if (number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      ms_per_unit = scale;
      break;
    }
  }
  auto value = parse_number(number);
  if (!value) return invalid(given, text.empty() ? "empty" : "not a duration", kDurationAllowed);
  if (*value < 0.0) return invalid(given, "negative", kDurationAllowed);
  const double ms = std::ceil(*value * ms_per_unit);
  if (ms > 30.0 * 24 * 3600e3) return invalid(given, "more than 30 days", kDurationAllowed);
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

Expected<std::size_t> parse_size(const SettingSource& given) {
  const std::string_view text = given.text;
  auto bytes = parse_bytes(text);
  if (!bytes)
    return Error(Errc::invalid_argument, given.quoted() + " is invalid: " + bytes.error().message());
  return *bytes;
}

// --- allocator names -------------------------------------------------------

// What an allocator name asks for: bfc defers to the preallocate setting.
enum class Choice { bfc, preallocate, growth, platform, expandable, cuda_async };

struct AllocatorName {
  std::string_view name;
  Choice choice;
  bool jax;  // accepted by XLA_PYTHON_CLIENT_ALLOCATOR
};

// JAX's names in jaxlib's order, then tidepool's own.
constexpr std::array<AllocatorName, 9> kAllocatorNames = {{
    {"default", Choice::bfc, true},
    {"platform", Choice::platform, true},
    {"bfc", Choice::bfc, true},
    {"cuda_async", Choice::cuda_async, true},
    {"vmm", Choice::expandable, true},
    {"address", Choice::platform, true},
    {"growth", Choice::growth, false},
    {"preallocate", Choice::preallocate, false},
    {"expandable", Choice::expandable, false},
}};

std::string allowed_allocators(bool jax_only) {
  std::string out;
  for (const auto& entry : kAllocatorNames) {
    if (jax_only && !entry.jax) continue;
    if (!out.empty()) out += ", ";
    out += entry.name;
  }
  return out + " (any case)";
}

/// JAX's variable accepts JAX's names only.
Expected<Choice> parse_allocator(const SettingSource& given) {
  const std::string_view text = given.text;
  const bool jax = given.origin == Origin::jax_variable;
  // As jaxlib does: os.getenv(...).lower(), then an exact match.
  const std::string word = lower(text);
  for (const auto& entry : kAllocatorNames)
    if (entry.name == word && (entry.jax || !jax)) return entry.choice;
  return invalid(given, text.empty() ? "empty" : "unknown allocator",
                 allowed_allocators(jax));
}

/// Where a mode decided by an allocator name and the preallocate setting
/// came from: the allocator's origin and text, and both names where both
/// were set.
SettingSource joined(const SettingSource& allocator, const SettingSource& preallocate) {
  if (allocator.is_default()) return {preallocate.origin, preallocate.name, allocator.text};
  if (preallocate.is_default() || allocator.name == preallocate.name) return allocator;
  return {allocator.origin, allocator.name + ", " + preallocate.name, allocator.text};
}

/// name=text, as a note quotes a setting.
std::string assigned(const SettingSource& given) { return given.name + "=" + given.text; }

// --- one setting at a time -------------------------------------------------
//
// Each reads through the Reader and names settings by the names it gives:
// the messages are in the vocabulary the settings came in.

using namespace config_names;

constexpr const char* kJaxPreallocate = "XLA_PYTHON_CLIENT_PREALLOCATE";
constexpr const char* kJaxMemFraction = "XLA_CLIENT_MEM_FRACTION";
constexpr const char* kJaxMemFractionOld = "XLA_PYTHON_CLIENT_MEM_FRACTION";  // its deprecated name
constexpr const char* kJaxAllocator = "XLA_PYTHON_CLIENT_ALLOCATOR";

Status read_preallocate(const Reader& reader, Config& config) {
  if (auto given = reader.get(kPreallocate)) {
    auto value = parse_strict_bool(*given);
    if (!value) return std::move(value).error();
    config.preallocate = {*value, *given};
  }
  if (auto given = reader.jax(kJaxPreallocate)) {
    // jaxlib: preallocate = value not in ('false', 'False', '0'). Anything
    // else is true, including "FALSE" and "no": say so, since few expect it.
    const std::string& text = given->text;
    const bool value = !(text == "false" || text == "False" || text == "0");
    if (value) {
      auto strict = parse_strict_bool(*given);
      if (!strict)
        config.warnings.push_back(given->quoted() + " is neither true nor false; as in JAX it means true "
                                  "(only " + kJaxFalseSpellings + " turn preallocation off)");
      else if (!*strict)
        config.warnings.push_back(given->quoted() + " turns preallocation ON: as in JAX, only " +
                                  kJaxFalseSpellings + " turn it off");
    }
    if (config.preallocate.is_default()) {
      config.preallocate = {value, *given};
    } else if (config.preallocate.value != value) {
      config.notes.push_back(assigned(config.preallocate) + " overrides " + assigned(*given));
    }
  }
  return {};
}

Status read_mem_fraction(const Reader& reader, Config& config) {
  auto current = reader.jax(kJaxMemFraction);
  auto deprecated = reader.jax(kJaxMemFractionOld);
  if (current && deprecated)
    return Error(Errc::invalid_argument,
                 current->quoted() + " and " + deprecated->quoted() + " are both set; as in JAX, set only " +
                     current->name + " (" + deprecated->name + " is its deprecated old name)");
  std::optional<Setting<double>> jax;
  if (current || deprecated) {
    const SettingSource& given = current ? *current : *deprecated;
    auto value = parse_fraction(given);
    if (!value) return std::move(value).error();
    jax = Setting<double>{*value, given};
    if (deprecated)
      config.warnings.push_back(deprecated->name + " is deprecated in JAX; use " + kJaxMemFraction);
  }
  if (auto given = reader.get(kMemFraction)) {
    auto value = parse_fraction(*given);
    if (!value) return std::move(value).error();
    config.mem_fraction = {*value, *given};
    if (jax && jax->value != *value) config.notes.push_back(assigned(*given) + " overrides " + assigned(*jax));
  } else if (jax) {
    config.mem_fraction = *jax;
  }
  return {};
}

/// A note for a JAX allocator name that runs as a tidepool pool of another name.
void note_jax_allocator(const SettingSource& given, Config& config) {
  const std::string word = lower(given.text);
  if (word == "vmm")
    config.notes.push_back(assigned(given) + " (XLA's virtual-memory allocator) runs as tidepool's expandable pool");
  else if (word == "address")
    config.notes.push_back(assigned(given) + " runs as tidepool's platform (pass-through) pool");
}

/// Needs the preallocate setting read first: bfc/default means preallocate
/// or growth as it says.
Status read_mode(const Reader& reader, Config& config) {
  Setting<Choice> choice{Choice::bfc};
  // jaxlib rejects an empty value too: "" is not among its names.
  const std::optional<SettingSource> jax = reader.variable(kJaxAllocator, Origin::jax_variable);
  if (jax) {
    auto parsed = parse_allocator(*jax);
    if (!parsed) return std::move(parsed).error();
    choice = {*parsed, *jax};
    note_jax_allocator(*jax, config);
  }
  if (auto given = reader.get(kAllocator)) {
    auto parsed = parse_allocator(*given);
    if (!parsed) return std::move(parsed).error();
    if (jax) config.notes.push_back(assigned(*given) + " overrides " + assigned(*jax));
    choice = {*parsed, *given};
  }

  Setting<bool>& preallocate = config.preallocate;
  switch (choice.value) {
    case Choice::bfc:
      if (choice.is_default() && preallocate.is_default() && config.mem_fraction.origin != Origin::jax_variable) {
        // Nothing names a pool and no JAX variable asks for JAX's behaviour:
        // tidepool's own default, which grows, shrinks and does not fragment.
        config.mode = Setting<Mode>{Mode::expandable};
        return {};
      }
      config.mode = {preallocate.value ? Mode::preallocate : Mode::growth, joined(choice, preallocate)};
      return {};
    case Choice::preallocate:
    case Choice::growth: {
      // The name says whether to preallocate; tidepool's own (strict)
      // preallocate setting that says otherwise is a contradiction, a JAX
      // one is overridden.
      const bool wanted = choice.value == Choice::preallocate;
      if (preallocate.is_tidepool() && preallocate.value != wanted)
        return Error(Errc::invalid_argument,
                     choice.quoted() + " contradicts " + preallocate.quoted() + "; allowed: set one of them, or " +
                         reader.name(kAllocator) + "=bfc to let " + preallocate.name + " choose");
      if (!preallocate.is_default() && preallocate.value != wanted)
        config.notes.push_back(assigned(choice) + " overrides " + assigned(preallocate));
      config.mode = {wanted ? Mode::preallocate : Mode::growth, choice};
      preallocate = {wanted, choice};
      return {};
    }
    case Choice::platform: config.mode = {Mode::platform, choice}; break;
    case Choice::expandable: config.mode = {Mode::expandable, choice}; break;
    case Choice::cuda_async: config.mode = {Mode::cuda_async, choice}; break;
  }
  return {};
}

/// A byte size greater than 0, read with the size parser.
Expected<std::size_t> parse_capacity(const SettingSource& given) {
  auto bytes = parse_size(given);
  if (!bytes) return bytes;
  if (*bytes == 0) return invalid(given, "a device of 0 bytes", "a byte size greater than 0, e.g. 80GiB");
  return bytes;
}

/// A setting read by `parse` into `setting`, when it is set.
template <class T, class Parse>
Status read_into(const Reader& reader, const SettingName& name, Parse parse, Setting<T>& setting) {
  auto given = reader.get(name);
  if (!given) return {};
  auto value = parse(*given);
  if (!value) return std::move(value).error();
  setting = {T(std::move(*value)), *given};
  return {};
}

Status read_device(const Reader& reader, Config& config) {  // the default set by the caller
  if (auto given = reader.get(kDevice)) {
    const std::string word = lower(trim(given->text));
    if (word == "host") config.device = {DeviceKind::host, *given};
    else if (word == "cuda") config.device = {DeviceKind::cuda, *given};
    else return invalid(*given, given->text.empty() ? "empty" : "unknown device", "host or cuda");
  }
  if (Status read = read_into(reader, kHostCapacity, parse_capacity, config.host_capacity); !read) return read;
  if (Status read = read_into(reader, kReleaseThreshold, parse_size, config.release_threshold); !read) return read;
  if (Status read = read_into(reader, kIdleRelease, parse_duration, config.idle_release); !read) return read;
  if (Status read = read_into(reader, kAliases, parse_strict_bool, config.aliases); !read) return read;
  if (Status read = read_into(reader, kWakeWait, parse_duration, config.wake_wait); !read) return read;
  return {};
}

Expected<Quota> parse_quota(const SettingSource& given) {
  const std::string_view text = given.text;
  constexpr const char* allowed =
      "a byte size (e.g. 20GiB), a fraction of the device greater than 0 and at most 1 "
      "(e.g. 0.4), or a percentage (e.g. 40%)";
  std::string_view s = trim(text);
  if (s.empty()) return invalid(given, "empty", allowed);
  if (s.back() == '%') {
    auto percent = parse_number(s.substr(0, s.size() - 1));
    if (!percent) return invalid(given, "not a percentage", allowed);
    if (*percent <= 0.0 || *percent > 100.0)
      return invalid(given, "a percentage must be above 0 and at most 100",
                     allowed);
    return Quota{0, *percent / 100.0};
  }
  const bool has_unit = std::isalpha(static_cast<unsigned char>(s.back())) != 0;
  if (!has_unit) {
    // A plain number: a fraction when at most 1, else a whole number of bytes.
    auto number = parse_number(s);
    if (!number) return invalid(given, "not a number", allowed);
    if (*number <= 0.0) return invalid(given, "must be greater than 0", allowed);
    if (*number <= 1.0) return Quota{0, *number};
    if (s.find_first_of(".eE") != std::string_view::npos)
      return invalid(given,
                     "above 1, so a byte count, but not a whole number", allowed);
  }
  auto bytes = parse_bytes(s);
  if (!bytes) return invalid(given, bytes.error().message(), allowed);
  if (*bytes == 0) return invalid(given, "must be greater than 0", allowed);
  return Quota{*bytes, 0.0};
}

constexpr const char* kHamiLimitAllowed =
    "HAMi-core's form: a whole number of bytes, or one followed by k, m or g (KiB, MiB, GiB; "
    "either case), e.g. 24g or 1000m; decimal or 0x hexadecimal";

/// HAMi-core's per-container device memory limit, as its get_limit_from_env
/// (src/multiprocess/multiprocess_memory_limit.c) reads it: a last character
/// of g/G, m/M or k/k multiplies by 1024^3, 1024^2 or 1024; the number before
/// it is read by strtoul with base 0 (decimal, 0x hexadecimal, a leading 0
/// octal). What HAMi-core would read as something other than what was
/// written (strtoul stops at the first non-digit: "1.5g" is 1 GiB, "1GiB" is
/// 1 byte), a leading 0 (octal), 0 (which HAMi-core calls invalid and
/// ignores) and an overflow are refused, naming the variable.
Expected<std::size_t> parse_hami_limit(const SettingSource& given) {
  const std::string_view text = given.text;
  std::string_view digits = text;
  std::size_t scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'g': case 'G': scale = GiB; break;
      case 'm': case 'M': scale = MiB; break;
      case 'k': case 'K': scale = KiB; break;
      default: break;
    }
    if (scale != 1) digits.remove_suffix(1);
  }
  int base = 10;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    digits.remove_prefix(2);
    base = 16;
  } else if (digits.size() > 1 && digits[0] == '0') {
    return invalid(given, "a leading 0 makes HAMi-core read the number as octal", kHamiLimitAllowed);
  }
  std::size_t number = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number, base);
  if (digits.empty() || ec == std::errc::invalid_argument || digits.front() == '+' || digits.front() == '-')
    return invalid(given, "not a number", kHamiLimitAllowed);
  if (ec == std::errc::result_out_of_range || number > SIZE_MAX / scale)
    return invalid(given, "too large", kHamiLimitAllowed);
  if (end != digits.data() + digits.size())
    return invalid(given,
                   "HAMi-core would read only '" + std::string(digits.substr(0, static_cast<std::size_t>(end - digits.data()))) +
                       "' of it (" + format_bytes(number * scale) + ")",
                   kHamiLimitAllowed);
  if (number == 0) return invalid(given, "0 bytes (HAMi-core ignores it as invalid)", kHamiLimitAllowed);
  return number * scale;
}

/// The device memory limit a GPU-sharing device plugin (HAMi, volcano's
/// vgpu) gave this container: CUDA_DEVICE_MEMORY_LIMIT_<index> for the
/// device tidepool uses, else CUDA_DEVICE_MEMORY_LIMIT, as HAMi-core picks
/// them. Empty is unset, as in HAMi-core.
Expected<std::optional<Setting<std::optional<Quota>>>> read_hami_limit(const Reader& reader) {
  for (const std::string& variable : {"CUDA_DEVICE_MEMORY_LIMIT_" + std::to_string(kHamiDeviceIndex),
                                      std::string("CUDA_DEVICE_MEMORY_LIMIT")}) {
    auto given = reader.variable(variable, Origin::plugin_variable);
    if (!given || given->text.empty()) continue;
    auto bytes = parse_hami_limit(*given);
    if (!bytes) return std::move(bytes).error();
    return std::optional<Setting<std::optional<Quota>>>(Setting<std::optional<Quota>>(Quota{*bytes, 0.0}, *given));
  }
  return std::optional<Setting<std::optional<Quota>>>{};
}

/// The scheduler's quota (HAMi's limit), below tidepool's own quota and
/// unless tidepool's ledger setting turned the ledger off.
void apply_hami_limit(const Setting<std::optional<Quota>>& limit, Config& config) {
  const std::string named = assigned(limit);
  if (config.quota.value) {
    config.notes.push_back(assigned(config.quota) + " is used instead of " + named);
    if (config.quota.value->bytes > limit.value->bytes)
      config.warnings.push_back(assigned(config.quota) + " is more than " + named + " (" +
                                format_bytes(limit.value->bytes) +
                                "), the container's limit: HAMi-core refuses allocations beyond it");
  } else if (!config.ledger.is_default() && !config.ledger.value) {
    config.notes.push_back(named + " is not applied by tidepool: " + assigned(config.ledger) +
                           " turns the ledger off (HAMi-core, where loaded, still enforces it)");
  } else {
    config.quota = limit;
    if (config.ledger.is_default()) {
      config.ledger = {true, limit};
      config.notes.push_back(named + " (the container's device memory limit) is this process's quota "
                             "and turns the cross-process ledger on");
    }
  }
}

/// A quota of tidepool's own is a share in the ledger: it means the ledger
/// is wanted, and the ledger turned off contradicts it.
Status ledger_for_quota(const Reader& reader, Config& config) {
  if (!config.quota.value || !config.quota.is_tidepool()) return {};
  if (config.ledger.is_default()) {
    config.ledger = {true, config.quota};
    config.notes.push_back(assigned(config.quota) + " turns the cross-process ledger on (a quota is a share in it)");
  } else if (!config.ledger.value) {
    return Error(Errc::invalid_argument,
                 config.quota.quoted() + " contradicts " + config.ledger.quoted() +
                     ": a quota is a share in the ledger; allowed: unset one of them, or " + reader.name(kLedger) +
                     "=on");
  }
  return {};
}

/// A POSIX shared-memory name: '/', then a name with no other '/'.
Expected<std::string> parse_segment_name(const SettingSource& given) {
  const std::string& text = given.text;
  const std::string name = text.empty() || text.front() == '/' ? text : "/" + text;
  if (name.size() < 2 || name.size() > 200 || name.find('/', 1) != std::string::npos)
    return invalid(given, name.size() < 2 ? "empty" : "not a segment name",
                   "a shared-memory segment name, '/name' (at most 200 characters, no other '/')");
  return name;
}

Expected<unsigned> parse_ledger_mode(const SettingSource& given) {
  const std::string word = lower(trim(given.text));
  if (word == "user" || word == "0600" || word == "600") return 0600u;
  if (word == "group" || word == "0660" || word == "660") return 0660u;
  return invalid(given, given.text.empty() ? "empty" : "unknown permissions",
                 "user (0600: this user's processes only) or group (0660: also the group's)");
}

Status read_sharing(const Reader& reader, Config& config) {
  if (Status read = read_into(reader, kQuota, parse_quota, config.quota); !read) return read;
  if (Status read = read_into(reader, kLedger, parse_strict_bool, config.ledger); !read) return read;
  auto hami = read_hami_limit(reader);
  if (!hami) return std::move(hami).error();
  if (*hami) apply_hami_limit(**hami, config);
  if (Status quota = ledger_for_quota(reader, config); !quota) return quota;
  if (Status read = read_into(reader, kLedgerName, parse_segment_name, config.ledger_name); !read) return read;
  if (Status read = read_into(reader, kLedgerMode, parse_ledger_mode, config.ledger_mode); !read) return read;
  if (!config.ledger_mode.is_default() && !config.ledger.value)
    config.notes.push_back(config.ledger_mode.name + " has no effect while the ledger is off");
  return {};
}

/// Settings that are valid but do nothing in the chosen stack.
void note_ignored_settings(Config& config) {
  const Mode mode = config.mode.value;
  if (mode == Mode::platform && !config.mem_fraction.is_default())
    config.notes.push_back(config.mem_fraction.name +
                           " has no effect in mode platform: as XLA's platform allocator, it "
                           "takes what it is asked for up to the device's capacity");
  // In these modes only a preallocate variable or key can have set it (an
  // allocator name sets it only for preallocate and growth).
  if ((mode == Mode::platform || mode == Mode::expandable) && !config.preallocate.is_default())
    config.notes.push_back(config.preallocate.name + " has no effect in mode " + std::string(mode_name(mode)));
  if (config.release_threshold.value && !(mode == Mode::expandable || mode == Mode::cuda_async))
    config.notes.push_back(config.release_threshold.name + " has no effect in mode " +
                           std::string(mode_name(mode)) + " (only expandable and cuda_async release)");
  if (config.idle_release.value.count() > 0 && mode != Mode::expandable)
    config.notes.push_back(config.idle_release.name + " has no effect in mode " + std::string(mode_name(mode)) +
                           " (only expandable releases when idle)");
  if (config.aliases.value && mode != Mode::expandable)
    config.notes.push_back(config.aliases.name + " has no effect in mode " + std::string(mode_name(mode)) +
                           " (only expandable maps granules)");
  if (config.device.value != DeviceKind::host && !config.host_capacity.is_default())
    config.notes.push_back(config.host_capacity.name + " has no effect with the cuda device");
}

}  // namespace

std::string_view mode_name(Mode mode) noexcept {
  switch (mode) {
    case Mode::preallocate: return "preallocate";
    case Mode::growth: return "growth";
    case Mode::platform: return "platform";
    case Mode::expandable: return "expandable";
    case Mode::cuda_async: return "cuda_async";
  }
  return "unknown";
}

std::span<const Mode> all_modes() noexcept { return kModes; }

Expected<Mode> parse_mode(std::string_view name) {
  for (Mode mode : kModes)
    if (mode_name(mode) == name) return mode;
  std::string names;
  for (Mode mode : kModes) names += (names.empty() ? "" : ", ") + std::string(mode_name(mode));
  return Error(Errc::invalid_argument,
               "unknown mode '" + std::string(name) + "'; allowed: " + names);
}

std::string_view device_kind_name(DeviceKind kind) noexcept {
  return kind == DeviceKind::cuda ? "cuda" : "host";
}

std::size_t Quota::resolve(std::size_t device_total) const noexcept {
  if (bytes != 0) return bytes;
  return static_cast<std::size_t>(static_cast<long double>(device_total) * fraction);
}

std::string Quota::to_string() const {
  if (bytes != 0) return format_bytes(bytes);
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g%%", fraction * 100.0);
  return buffer;
}

std::string SettingSource::quoted() const { return name + "='" + format_excerpt(text) + "'"; }

OomWords Config::oom_words() const {
  // A setting nobody set is named as this configuration names tidepool's.
  auto name_of = [this](const SettingSource& setting, const SettingName& tidepool) {
    return setting.is_default() ? config_names::name_in(vocabulary, tidepool) : setting.name;
  };
  OomWords words;
  words.limit = name_of(mem_fraction, config_names::kMemFraction);
  words.grow_on_demand = name_of(preallocate, config_names::kPreallocate) + "=false";
  // XLA_PYTHON_CLIENT_ALLOCATOR has no expandable value: tidepool's own name.
  words.expandable = config_names::name_in(vocabulary, config_names::kAllocator) + "=expandable";
  words.quota = name_of(quota, config_names::kQuota);
  return words;
}

std::size_t Config::bytes_limit(std::size_t device_total) const noexcept {
  return static_cast<std::size_t>(static_cast<long double>(device_total) *
                                  static_cast<long double>(mem_fraction.value));
}

namespace {

/// The one parser: every setting `reader` gives, in the order the rules
/// need them.
Expected<Config> read_config(const Reader& reader, DeviceKind default_device) {
  Config config;
  config.vocabulary = reader.vocabulary();
  config.device.value = default_device;
  for (auto read : {read_preallocate, read_mem_fraction, read_mode, read_device, read_sharing}) {
    if (Status status = read(reader, config); !status) return std::move(status).error();
  }
  note_ignored_settings(config);
  return config;
}

}  // namespace

Expected<Config> Config::from_env(const GetEnv& getenv, DeviceKind default_device) {
  return read_config(Reader::environment(getenv), default_device);
}

Expected<Config> Config::from_keys(const KeyValues& settings, DeviceKind default_device) {
  for (const auto& [key, value] : settings)
    if (config_names::find_key(key) == nullptr)
      return Error(Errc::invalid_argument,
                   "unknown setting '" + format_excerpt(key) + "'; keys: " + config_names::key_list());
  return read_config(Reader::keys(settings), default_device);
}

Expected<Config> Config::from_env(DeviceKind default_device) {
  auto config = from_env([](const char* name) -> const char* { return std::getenv(name); }, default_device);
  if (!config) return config;
  // A misspelt tidepool variable would otherwise be ignored without a word.
  std::string known;
  for (const SettingName& setting : setting_names()) known += (known.empty() ? "" : ", ") + std::string(setting.variable);
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view variable(*entry);
    variable = variable.substr(0, variable.find('='));
    if (!variable.starts_with("TIDEPOOL_")) continue;
    bool listed = false;
    for (const SettingName& setting : setting_names()) listed |= setting.variable == variable;
    if (!listed)
      config->warnings.push_back("unknown variable " + std::string(variable) +
                                 " is ignored (misspelt? tidepool reads " + known + ")");
  }
  return config;
}

}  // namespace tidepool
