// Reading the configuration: JAX's variables with JAX's meaning, tidepool's
// own strictly, tidepool's winning where both are set.
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

#include "tidepool/units.hpp"

extern char** environ;  // POSIX: the process environment, for spotting misspelt names

namespace tidepool {
namespace {

constexpr std::array<Mode, 5> kModes = {Mode::preallocate, Mode::growth, Mode::platform,
                                        Mode::expandable, Mode::cuda_async};

// The variables this file reads, and those the interposer of `tidepool run`
// reads itself (TIDEPOOL_RECORD, TIDEPOOL_POOL, TIDEPOOL_REPORT,
// TIDEPOOL_RUN_PID: bindings/preload/). A TIDEPOOL_* variable not listed
// here is reported as probably misspelt: add new variables to this list.
constexpr std::array<std::string_view, 16> kTidepoolVariables = {
    "TIDEPOOL_ALLOCATOR",     "TIDEPOOL_MEM_FRACTION",      "TIDEPOOL_PREALLOCATE",
    "TIDEPOOL_DEVICE",        "TIDEPOOL_HOST_CAPACITY",     "TIDEPOOL_RELEASE_THRESHOLD",
    "TIDEPOOL_IDLE_RELEASE",  "TIDEPOOL_QUOTA",             "TIDEPOOL_LEDGER",
    "TIDEPOOL_LEDGER_MODE",   "TIDEPOOL_LEDGER_NAME",       "TIDEPOOL_RECORD",
    "TIDEPOOL_POOL",          "TIDEPOOL_REPORT",            "TIDEPOOL_RUN_PID",
    "TIDEPOOL_WAKE_WAIT"};

std::string known_names() {
  std::string out;
  for (std::string_view name : kTidepoolVariables) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

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

Error invalid(std::string_view variable, std::string_view value, std::string_view why,
              std::string_view allowed) {
  return Error(Errc::invalid_argument, std::string(variable) + "='" + format_excerpt(value) +
                                           "' is invalid: " + std::string(why) +
                                           "; allowed: " + std::string(allowed));
}

// The environment, read once per variable, with empty values told apart.
class Environment {
 public:
  explicit Environment(const GetEnv& getenv) : getenv_(getenv) {}

  /// The value, or nullopt when unset.
  std::optional<std::string> get(const char* name) const {
    const char* value = getenv_(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }
  /// JAX reads a variable set to "" as unset (os.getenv(...) is falsy).
  std::optional<std::string> get_jax(const char* name) const {
    auto value = get(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }

 private:
  const GetEnv& getenv_;
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

Expected<double> parse_fraction(std::string_view variable, std::string_view text) {
  auto value = parse_number(text);
  if (!value) return invalid(variable, text, "not a number", kFractionAllowed);
  if (*value <= 0.0) return invalid(variable, text, "must be greater than 0", kFractionAllowed);
  if (*value > 1.0)
    return invalid(variable, text,
                   "more than the whole device (tidepool does not oversubscribe)",
                   kFractionAllowed);
  return *value;
}

Expected<bool> parse_strict_bool(std::string_view variable, std::string_view text) {
  const std::string word = lower(trim(text));
  if (word == "true" || word == "1" || word == "yes" || word == "on") return true;
  if (word == "false" || word == "0" || word == "no" || word == "off") return false;
  return invalid(variable, text, text.empty() ? "empty" : "not a boolean", kStrictBoolAllowed);
}

constexpr const char* kDurationAllowed =
    "a duration: seconds, or a number with ms, s, min or h (e.g. 30s, 500ms, 2min); 0 for never";

// A duration of at most 30 days, rounded up to whole milliseconds.
Expected<std::chrono::milliseconds> parse_duration(std::string_view variable, std::string_view text) {
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
  if (!value) return invalid(variable, text, text.empty() ? "empty" : "not a duration", kDurationAllowed);
  if (*value < 0.0) return invalid(variable, text, "negative", kDurationAllowed);
  const double ms = std::ceil(*value * ms_per_unit);
  if (ms > 30.0 * 24 * 3600e3) return invalid(variable, text, "more than 30 days", kDurationAllowed);
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

Expected<std::size_t> parse_size(std::string_view variable, std::string_view text) {
  auto bytes = parse_bytes(text);
  if (!bytes)
    return Error(Errc::invalid_argument, std::string(variable) + "='" + format_excerpt(text) +
                                             "' is invalid: " + bytes.error().message());
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

Expected<Choice> parse_allocator(std::string_view variable, std::string_view text, bool jax) {
  // As jaxlib does: os.getenv(...).lower(), then an exact match.
  const std::string word = lower(text);
  for (const auto& entry : kAllocatorNames)
    if (entry.name == word && (entry.jax || !jax)) return entry.choice;
  return invalid(variable, text, text.empty() ? "empty" : "unknown allocator",
                 allowed_allocators(jax));
}

std::string join_sources(std::string_view a, std::string_view b) {
  if (a == "default") return std::string(b);
  if (b == "default" || a == b) return std::string(a);
  return std::string(a) + ", " + std::string(b);
}

// --- one setting at a time -------------------------------------------------

Status read_preallocate(const Environment& env, Config& config) {
  if (auto text = env.get("TIDEPOOL_PREALLOCATE")) {
    auto value = parse_strict_bool("TIDEPOOL_PREALLOCATE", *text);
    if (!value) return std::move(value).error();
    config.preallocate = {*value, "TIDEPOOL_PREALLOCATE", *text};
  }
  if (auto text = env.get_jax("XLA_PYTHON_CLIENT_PREALLOCATE")) {
    // jaxlib: preallocate = value not in ('false', 'False', '0'). Anything
    // else is true, including "FALSE" and "no": say so, since few expect it.
    const bool value = !(*text == "false" || *text == "False" || *text == "0");
    if (value) {
      auto strict = parse_strict_bool("XLA_PYTHON_CLIENT_PREALLOCATE", *text);
      if (!strict)
        config.warnings.push_back("XLA_PYTHON_CLIENT_PREALLOCATE='" + *text +
                                  "' is neither true nor false; as in JAX it means true "
                                  "(only " + kJaxFalseSpellings +
                                  " turn preallocation off)");
      else if (!*strict)
        config.warnings.push_back("XLA_PYTHON_CLIENT_PREALLOCATE='" + *text +
                                  "' turns preallocation ON: as in JAX, only " +
                                  kJaxFalseSpellings + " turn it off");
    }
    if (config.preallocate.is_default()) {
      config.preallocate = {value, "XLA_PYTHON_CLIENT_PREALLOCATE", *text};
    } else if (config.preallocate.value != value) {
      config.notes.push_back("TIDEPOOL_PREALLOCATE=" + config.preallocate.text +
                             " overrides XLA_PYTHON_CLIENT_PREALLOCATE=" + *text);
    }
  }
  return {};
}

Status read_mem_fraction(const Environment& env, Config& config) {
  auto current = env.get_jax("XLA_CLIENT_MEM_FRACTION");
  auto deprecated = env.get_jax("XLA_PYTHON_CLIENT_MEM_FRACTION");
  if (current && deprecated)
    return Error(Errc::invalid_argument,
                 "XLA_CLIENT_MEM_FRACTION='" + *current + "' and XLA_PYTHON_CLIENT_MEM_FRACTION='" +
                     *deprecated +
                     "' are both set; as in JAX, set only XLA_CLIENT_MEM_FRACTION "
                     "(XLA_PYTHON_CLIENT_MEM_FRACTION is its deprecated old name)");
  std::optional<Setting<double>> jax;
  if (current || deprecated) {
    const char* name = current ? "XLA_CLIENT_MEM_FRACTION" : "XLA_PYTHON_CLIENT_MEM_FRACTION";
    const std::string& text = current ? *current : *deprecated;
    auto value = parse_fraction(name, text);
    if (!value) return std::move(value).error();
    jax = Setting<double>{*value, name, text};
    if (deprecated)
      config.warnings.push_back(
          "XLA_PYTHON_CLIENT_MEM_FRACTION is deprecated in JAX; use XLA_CLIENT_MEM_FRACTION");
  }
  if (auto text = env.get("TIDEPOOL_MEM_FRACTION")) {
    auto value = parse_fraction("TIDEPOOL_MEM_FRACTION", *text);
    if (!value) return std::move(value).error();
    config.mem_fraction = {*value, "TIDEPOOL_MEM_FRACTION", *text};
    if (jax && jax->value != *value)
      config.notes.push_back("TIDEPOOL_MEM_FRACTION=" + *text + " overrides " + jax->source +
                             "=" + jax->text);
  } else if (jax) {
    config.mem_fraction = *jax;
  }
  return {};
}

/// Needs the preallocate setting read first: bfc/default means preallocate
/// or growth as it says.
Status read_mode(const Environment& env, Config& config) {
  Setting<Choice> choice{Choice::bfc};
  std::optional<std::string> jax_text = env.get("XLA_PYTHON_CLIENT_ALLOCATOR");
  if (jax_text) {
    // jaxlib rejects an empty value too: "" is not among its names.
    auto parsed = parse_allocator("XLA_PYTHON_CLIENT_ALLOCATOR", *jax_text, true);
    if (!parsed) return std::move(parsed).error();
    choice = {*parsed, "XLA_PYTHON_CLIENT_ALLOCATOR", *jax_text};
    const std::string word = lower(*jax_text);
    if (word == "vmm")
      config.notes.push_back(
          "XLA_PYTHON_CLIENT_ALLOCATOR=vmm (XLA's virtual-memory allocator) runs as tidepool's "
          "expandable pool");
    else if (word == "address")
      config.notes.push_back(
          "XLA_PYTHON_CLIENT_ALLOCATOR=address runs as tidepool's platform (pass-through) pool");
  }
  if (auto text = env.get("TIDEPOOL_ALLOCATOR")) {
    auto parsed = parse_allocator("TIDEPOOL_ALLOCATOR", *text, false);
    if (!parsed) return std::move(parsed).error();
    if (jax_text)
      config.notes.push_back("TIDEPOOL_ALLOCATOR=" + *text + " overrides XLA_PYTHON_CLIENT_ALLOCATOR=" +
                             *jax_text);
    choice = {*parsed, "TIDEPOOL_ALLOCATOR", *text};
  }

  Setting<bool>& preallocate = config.preallocate;
  switch (choice.value) {
    case Choice::bfc:
      if (choice.is_default() && preallocate.is_default() && config.mem_fraction.source.rfind("XLA_", 0) != 0) {
        // Nothing names a pool and no JAX variable asks for JAX's behaviour:
        // tidepool's own default, which grows, shrinks and does not fragment.
        config.mode = Setting<Mode>{Mode::expandable};
        return {};
      }
      config.mode = {preallocate.value ? Mode::preallocate : Mode::growth,
                     join_sources(choice.source, preallocate.source), choice.text};
      return {};
    case Choice::preallocate:
    case Choice::growth: {
      // The name says whether to preallocate; a strict TIDEPOOL_PREALLOCATE
      // that says otherwise is a contradiction, a JAX one is overridden.
      const bool wanted = choice.value == Choice::preallocate;
      if (preallocate.source == "TIDEPOOL_PREALLOCATE" && preallocate.value != wanted)
        return Error(Errc::invalid_argument,
                     "TIDEPOOL_ALLOCATOR='" + choice.text + "' contradicts TIDEPOOL_PREALLOCATE='" +
                         preallocate.text + "'; allowed: set one of them, or TIDEPOOL_ALLOCATOR=bfc "
                         "to let TIDEPOOL_PREALLOCATE choose");
      if (!preallocate.is_default() && preallocate.value != wanted)
        config.notes.push_back("TIDEPOOL_ALLOCATOR=" + choice.text + " overrides " +
                               preallocate.source + "=" + preallocate.text);
      config.mode = {wanted ? Mode::preallocate : Mode::growth, choice.source, choice.text};
      preallocate = {wanted, choice.source, choice.text};
      return {};
    }
    case Choice::platform: config.mode = {Mode::platform, choice.source, choice.text}; break;
    case Choice::expandable: config.mode = {Mode::expandable, choice.source, choice.text}; break;
    case Choice::cuda_async: config.mode = {Mode::cuda_async, choice.source, choice.text}; break;
  }
  return {};
}

Status read_device(const Environment& env, Config& config) {  // the default set by the caller
  if (auto text = env.get("TIDEPOOL_DEVICE")) {
    const std::string word = lower(trim(*text));
    if (word == "host") config.device = {DeviceKind::host, "TIDEPOOL_DEVICE", *text};
    else if (word == "cuda") config.device = {DeviceKind::cuda, "TIDEPOOL_DEVICE", *text};
    else return invalid("TIDEPOOL_DEVICE", *text, text->empty() ? "empty" : "unknown device",
                        "host or cuda");
  }
  if (auto text = env.get("TIDEPOOL_HOST_CAPACITY")) {
    auto bytes = parse_size("TIDEPOOL_HOST_CAPACITY", *text);
    if (!bytes) return std::move(bytes).error();
    if (*bytes == 0)
      return invalid("TIDEPOOL_HOST_CAPACITY", *text, "a device of 0 bytes",
                     "a byte size greater than 0, e.g. 80GiB");
    config.host_capacity = {*bytes, "TIDEPOOL_HOST_CAPACITY", *text};
  }
  if (auto text = env.get("TIDEPOOL_RELEASE_THRESHOLD")) {
    auto bytes = parse_size("TIDEPOOL_RELEASE_THRESHOLD", *text);
    if (!bytes) return std::move(bytes).error();
    config.release_threshold = {*bytes, "TIDEPOOL_RELEASE_THRESHOLD", *text};
  }
  if (auto text = env.get("TIDEPOOL_IDLE_RELEASE")) {
    auto idle = parse_duration("TIDEPOOL_IDLE_RELEASE", *text);
    if (!idle) return std::move(idle).error();
    config.idle_release = {*idle, "TIDEPOOL_IDLE_RELEASE", *text};
  }
  if (auto text = env.get("TIDEPOOL_WAKE_WAIT")) {
    auto wait = parse_duration("TIDEPOOL_WAKE_WAIT", *text);
    if (!wait) return std::move(wait).error();
    config.wake_wait = {*wait, "TIDEPOOL_WAKE_WAIT", *text};
  }
  return {};
}

Expected<Quota> parse_quota(std::string_view text) {
  constexpr const char* allowed =
      "a byte size (e.g. 20GiB), a fraction of the device greater than 0 and at most 1 "
      "(e.g. 0.4), or a percentage (e.g. 40%)";
  std::string_view s = trim(text);
  if (s.empty()) return invalid("TIDEPOOL_QUOTA", text, "empty", allowed);
  if (s.back() == '%') {
    auto percent = parse_number(s.substr(0, s.size() - 1));
    if (!percent) return invalid("TIDEPOOL_QUOTA", text, "not a percentage", allowed);
    if (*percent <= 0.0 || *percent > 100.0)
      return invalid("TIDEPOOL_QUOTA", text, "a percentage must be above 0 and at most 100",
                     allowed);
    return Quota{0, *percent / 100.0};
  }
  const bool has_unit = std::isalpha(static_cast<unsigned char>(s.back())) != 0;
  if (!has_unit) {
    // A plain number: a fraction when at most 1, else a whole number of bytes.
    auto number = parse_number(s);
    if (!number) return invalid("TIDEPOOL_QUOTA", text, "not a number", allowed);
    if (*number <= 0.0) return invalid("TIDEPOOL_QUOTA", text, "must be greater than 0", allowed);
    if (*number <= 1.0) return Quota{0, *number};
    if (s.find_first_of(".eE") != std::string_view::npos)
      return invalid("TIDEPOOL_QUOTA", text,
                     "above 1, so a byte count, but not a whole number", allowed);
  }
  auto bytes = parse_bytes(s);
  if (!bytes) return invalid("TIDEPOOL_QUOTA", text, bytes.error().message(), allowed);
  if (*bytes == 0) return invalid("TIDEPOOL_QUOTA", text, "must be greater than 0", allowed);
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
Expected<std::size_t> parse_hami_limit(std::string_view variable, std::string_view text) {
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
    return invalid(variable, text, "a leading 0 makes HAMi-core read the number as octal", kHamiLimitAllowed);
  }
  std::size_t number = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number, base);
  if (digits.empty() || ec == std::errc::invalid_argument || digits.front() == '+' || digits.front() == '-')
    return invalid(variable, text, "not a number", kHamiLimitAllowed);
  if (ec == std::errc::result_out_of_range || number > SIZE_MAX / scale)
    return invalid(variable, text, "too large", kHamiLimitAllowed);
  if (end != digits.data() + digits.size())
    return invalid(variable, text,
                   "HAMi-core would read only '" + std::string(digits.substr(0, static_cast<std::size_t>(end - digits.data()))) +
                       "' of it (" + format_bytes(number * scale) + ")",
                   kHamiLimitAllowed);
  if (number == 0) return invalid(variable, text, "0 bytes (HAMi-core ignores it as invalid)", kHamiLimitAllowed);
  return number * scale;
}

/// The device memory limit a GPU-sharing device plugin (HAMi, volcano's
/// vgpu) gave this container: CUDA_DEVICE_MEMORY_LIMIT_<index> for the
/// device tidepool uses, else CUDA_DEVICE_MEMORY_LIMIT, as HAMi-core picks
/// them. Empty is unset, as in HAMi-core.
Expected<std::optional<Setting<std::optional<Quota>>>> read_hami_limit(const Environment& env) {
  for (const std::string& variable : {"CUDA_DEVICE_MEMORY_LIMIT_" + std::to_string(kHamiDeviceIndex),
                                      std::string("CUDA_DEVICE_MEMORY_LIMIT")}) {
    auto text = env.get(variable.c_str());
    if (!text || text->empty()) continue;
    auto bytes = parse_hami_limit(variable, *text);
    if (!bytes) return std::move(bytes).error();
    return std::optional<Setting<std::optional<Quota>>>(
        Setting<std::optional<Quota>>(Quota{*bytes, 0.0}, variable, *text));
  }
  return std::optional<Setting<std::optional<Quota>>>{};
}

Status read_sharing(const Environment& env, Config& config) {
  if (auto text = env.get("TIDEPOOL_QUOTA")) {
    auto quota = parse_quota(*text);
    if (!quota) return std::move(quota).error();
    config.quota = {*quota, "TIDEPOOL_QUOTA", *text};
  }
  if (auto text = env.get("TIDEPOOL_LEDGER")) {
    auto value = parse_strict_bool("TIDEPOOL_LEDGER", *text);
    if (!value) return std::move(value).error();
    config.ledger = {*value, "TIDEPOOL_LEDGER", *text};
  }
  auto hami = read_hami_limit(env);
  if (!hami) return std::move(hami).error();
  if (*hami) {
    // The scheduler's quota, below TIDEPOOL_QUOTA.
    const Setting<std::optional<Quota>>& limit = **hami;
    const std::string named = limit.source + "=" + limit.text;
    if (config.quota.value) {
      config.notes.push_back("TIDEPOOL_QUOTA=" + config.quota.text + " is used instead of " + named);
      if (config.quota.value->bytes > limit.value->bytes)
        config.warnings.push_back("TIDEPOOL_QUOTA=" + config.quota.text + " is more than " + named +
                                  " (" + format_bytes(limit.value->bytes) +
                                  "), the container's limit: HAMi-core refuses allocations beyond it");
    } else if (!config.ledger.is_default() && !config.ledger.value) {
      config.notes.push_back(named + " is not applied by tidepool: TIDEPOOL_LEDGER=" + config.ledger.text +
                             " turns the ledger off (HAMi-core, where loaded, still enforces it)");
    } else {
      config.quota = limit;
      if (config.ledger.is_default()) {
        config.ledger = {true, limit.source, limit.text};
        config.notes.push_back(named + " (the container's device memory limit) is this process's quota "
                               "and turns the cross-process ledger on");
      }
    }
  }
  if (config.quota.value && config.quota.source == "TIDEPOOL_QUOTA") {
    // A quota is a share in the ledger: it means the ledger is wanted.
    if (config.ledger.is_default()) {
      config.ledger = {true, "TIDEPOOL_QUOTA", config.quota.text};
      config.notes.push_back("TIDEPOOL_QUOTA=" + config.quota.text +
                             " turns the cross-process ledger on (a quota is a share in it)");
    } else if (!config.ledger.value) {
      return Error(Errc::invalid_argument,
                   "TIDEPOOL_QUOTA='" + config.quota.text + "' contradicts TIDEPOOL_LEDGER='" +
                       config.ledger.text +
                       "': a quota is a share in the ledger; allowed: unset one of them, or "
                       "TIDEPOOL_LEDGER=on");
    }
  }
  if (auto text = env.get("TIDEPOOL_LEDGER_NAME")) {
    // A POSIX shared-memory name: '/', then a name with no other '/'.
    const std::string name = text->empty() || text->front() == '/' ? *text : "/" + *text;
    if (name.size() < 2 || name.size() > 200 || name.find('/', 1) != std::string::npos)
      return invalid("TIDEPOOL_LEDGER_NAME", *text, name.size() < 2 ? "empty" : "not a segment name",
                     "a shared-memory segment name, '/name' (at most 200 characters, no other '/')");
    config.ledger_name = {name, "TIDEPOOL_LEDGER_NAME", *text};
  }
  if (auto text = env.get("TIDEPOOL_LEDGER_MODE")) {
    const std::string word = lower(trim(*text));
    unsigned mode = 0;
    if (word == "user" || word == "0600" || word == "600") mode = 0600;
    else if (word == "group" || word == "0660" || word == "660") mode = 0660;
    else
      return invalid("TIDEPOOL_LEDGER_MODE", *text, text->empty() ? "empty" : "unknown permissions",
                     "user (0600: this user's processes only) or group (0660: also the group's)");
    config.ledger_mode = {mode, "TIDEPOOL_LEDGER_MODE", *text};
    if (!config.ledger.value)
      config.notes.push_back("TIDEPOOL_LEDGER_MODE has no effect while the ledger is off");
  }
  return {};
}

/// Settings that are valid but do nothing in the chosen stack.
void note_ignored_settings(Config& config) {
  const Mode mode = config.mode.value;
  if (mode == Mode::platform && !config.mem_fraction.is_default())
    config.notes.push_back(config.mem_fraction.source +
                           " has no effect in mode platform: as XLA's platform allocator, it "
                           "takes what it is asked for up to the device's capacity");
  if ((mode == Mode::platform || mode == Mode::expandable) &&
      config.preallocate.source.find("PREALLOCATE") != std::string::npos)
    config.notes.push_back(config.preallocate.source + " has no effect in mode " +
                           std::string(mode_name(mode)));
  if (config.release_threshold.value &&
      !(mode == Mode::expandable || mode == Mode::cuda_async))
    config.notes.push_back("TIDEPOOL_RELEASE_THRESHOLD has no effect in mode " +
                           std::string(mode_name(mode)) + " (only expandable and cuda_async release)");
  if (config.idle_release.value.count() > 0 && mode != Mode::expandable)
    config.notes.push_back("TIDEPOOL_IDLE_RELEASE has no effect in mode " + std::string(mode_name(mode)) +
                           " (only expandable releases when idle)");
  if (config.device.value != DeviceKind::host && !config.host_capacity.is_default())
    config.notes.push_back("TIDEPOOL_HOST_CAPACITY has no effect with the cuda device");
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

OomWords Config::oom_words(const std::function<std::string(std::string_view)>& spell) const {
  OomWords words;
  words.limit = mem_fraction.is_default() ? spell("TIDEPOOL_MEM_FRACTION") : mem_fraction.source;
  words.grow_on_demand = (preallocate.is_default() ? spell("TIDEPOOL_PREALLOCATE") : preallocate.source) + "=false";
  // XLA_PYTHON_CLIENT_ALLOCATOR has no expandable value: tidepool's own name.
  words.expandable = spell("TIDEPOOL_ALLOCATOR") + "=expandable";
  return words;
}

std::size_t Config::bytes_limit(std::size_t device_total) const noexcept {
  return static_cast<std::size_t>(static_cast<long double>(device_total) *
                                  static_cast<long double>(mem_fraction.value));
}

Expected<Config> Config::from_env(const GetEnv& getenv, DeviceKind default_device) {
  const Environment env(getenv);
  Config config;
  config.device.value = default_device;
  for (auto read : {read_preallocate, read_mem_fraction, read_mode, read_device, read_sharing}) {
    if (Status status = read(env, config); !status) return std::move(status).error();
  }
  note_ignored_settings(config);
  return config;
}

Expected<Config> Config::from_env(DeviceKind default_device) {
  auto config = from_env([](const char* name) -> const char* { return std::getenv(name); }, default_device);
  if (!config) return config;
  // A misspelt tidepool variable would otherwise be ignored without a word.
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view variable(*entry);
    variable = variable.substr(0, variable.find('='));
    if (!variable.starts_with("TIDEPOOL_")) continue;
    bool known = false;
    for (std::string_view name : kTidepoolVariables) known |= name == variable;
    if (!known)
      config->warnings.push_back("unknown variable " + std::string(variable) +
                                 " is ignored (misspelt? tidepool reads " + known_names() + ")");
  }
  return config;
}

}  // namespace tidepool
