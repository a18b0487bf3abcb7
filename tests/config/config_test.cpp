#include "tidepool/config.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using Vars = std::map<std::string, std::string>;

// Parsing alone: the default device is given (the stack probes for one).
Expected<Config> load(const Vars& vars) {
  return Config::from_env(
      [&vars](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      DeviceKind::host);
}

Config load_ok(const Vars& vars) {
  auto config = load(vars);
  EXPECT_TRUE(config) << config.error().message();
  return config ? *config : Config{};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& line : lines)
    if (contains(line, part)) return true;
  return false;
}

// A bad value must be an invalid_argument error naming the variable, the
// value and what is allowed.
void expect_invalid(const Vars& vars, const std::string& variable, const std::string& value,
                    const std::string& allowed) {
  auto config = load(vars);
  ASSERT_FALSE(config) << variable << "=" << value << " was accepted";
  EXPECT_EQ(config.error().code(), Errc::invalid_argument);
  const std::string& message = config.error().message();
  EXPECT_TRUE(contains(message, variable)) << message;
  EXPECT_TRUE(contains(message, "'" + value + "'")) << message;
  EXPECT_TRUE(contains(message, allowed)) << message;
}

// --- modes --------------------------------------------------------------

TEST(ConfigErrors, ALongValueIsCutInTheMessage) {
  // Issue 14: a 1 MiB value was echoed whole.
  const std::string huge(1 << 20, 'x');
  for (const char* variable : {"TIDEPOOL_HOST_CAPACITY", "TIDEPOOL_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION"}) {
    SCOPED_TRACE(variable);
    auto config = load({{variable, huge}});
    ASSERT_FALSE(config);
    const std::string& message = config.error().message();
    EXPECT_LT(message.size(), 1000u) << message.substr(0, 1000);
    EXPECT_TRUE(contains(message, std::string(variable) + "='xxxx")) << message;
    EXPECT_TRUE(contains(message, "(1048576 bytes in all)")) << message;
  }
}

// An OOM's advice names the variable the user set, else tidepool's own.
TEST(ConfigOomWords, NameTheVariablesTheUserSet) {
  const OomWords defaults = load_ok({}).oom_words();
  EXPECT_EQ(defaults.limit, "TIDEPOOL_MEM_FRACTION");
  EXPECT_EQ(defaults.grow_on_demand, "TIDEPOOL_PREALLOCATE=false");
  EXPECT_EQ(defaults.expandable, "TIDEPOOL_ALLOCATOR=expandable");
  const OomWords jax = load_ok({{"XLA_PYTHON_CLIENT_MEM_FRACTION", ".5"}, {"XLA_PYTHON_CLIENT_PREALLOCATE", "true"},
                                {"XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"}})
                           .oom_words();
  EXPECT_EQ(jax.limit, "XLA_PYTHON_CLIENT_MEM_FRACTION");
  EXPECT_EQ(jax.grow_on_demand, "XLA_PYTHON_CLIENT_PREALLOCATE=false");
  EXPECT_EQ(jax.expandable, "TIDEPOOL_ALLOCATOR=expandable");  // XLA's variable has no such value
}

TEST(Mode, NamesRoundTrip) {
  ASSERT_EQ(all_modes().size(), 5u);
  for (Mode mode : all_modes()) {
    auto parsed = parse_mode(mode_name(mode));
    ASSERT_TRUE(parsed) << mode_name(mode);
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_EQ(mode_name(Mode::preallocate), "preallocate");
  EXPECT_EQ(mode_name(Mode::growth), "growth");
  EXPECT_EQ(mode_name(Mode::platform), "platform");
  EXPECT_EQ(mode_name(Mode::expandable), "expandable");
  EXPECT_EQ(mode_name(Mode::cuda_async), "cuda_async");
  auto bad = parse_mode("bfc");
  ASSERT_FALSE(bad);
  EXPECT_TRUE(contains(bad.error().message(), "'bfc'"));
  EXPECT_TRUE(contains(bad.error().message(), "expandable"));
}

// --- defaults -----------------------------------------------------------

TEST(ConfigDefaults, AreJaxDefaultsButTheExpandablePool) {
  Config config = load_ok({});
  EXPECT_EQ(config.mode.value, Mode::expandable);  // tidepool's own default
  EXPECT_TRUE(config.mode.is_default());
  EXPECT_DOUBLE_EQ(config.mem_fraction.value, 0.75);
  EXPECT_TRUE(config.mem_fraction.is_default());
  EXPECT_TRUE(config.preallocate.value);
  EXPECT_TRUE(config.preallocate.is_default());
  EXPECT_EQ(config.device.value, DeviceKind::host);  // the default given
  EXPECT_TRUE(config.device.is_default());
  EXPECT_EQ(config.host_capacity.value, 16 * GiB);
  EXPECT_FALSE(config.release_threshold.value.has_value());
  EXPECT_FALSE(config.quota.value.has_value());
  EXPECT_FALSE(config.ledger.value);
  EXPECT_TRUE(config.warnings.empty());
  EXPECT_TRUE(config.notes.empty());
  EXPECT_EQ(config.bytes_limit(16 * GiB), 12 * GiB);
}

TEST(ConfigDefaults, AnyJaxVariableBringsBackJaxsDefaultPool) {
  // As in JAX: set XLA_PYTHON_CLIENT_PREALLOCATE or a JAX memory fraction and
  // BFC runs, preallocated unless told otherwise.
  EXPECT_EQ(load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "true"}}).mode.value, Mode::preallocate);
  EXPECT_EQ(load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "false"}}).mode.value, Mode::growth);
  EXPECT_EQ(load_ok({{"XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"}}).mode.value, Mode::preallocate);
  EXPECT_EQ(load_ok({{"XLA_CLIENT_MEM_FRACTION", "0.5"}}).mode.value, Mode::preallocate);
  EXPECT_EQ(load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "default"}}).mode.value, Mode::preallocate);
  EXPECT_EQ(load_ok({{"TIDEPOOL_PREALLOCATE", "true"}}).mode.value, Mode::preallocate);
  // tidepool's own fraction only bounds tidepool's default.
  Config bounded = load_ok({{"TIDEPOOL_MEM_FRACTION", "0.5"}});
  EXPECT_EQ(bounded.mode.value, Mode::expandable);
  EXPECT_EQ(bounded.bytes_limit(16 * GiB), 8 * GiB);
}

// --- JAX variables --------------------------------------------------------

TEST(JaxPreallocate, OnlyThreeSpellingsTurnItOff) {
  for (const char* off : {"false", "False", "0"}) {
    Config config = load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", off}});
    EXPECT_FALSE(config.preallocate.value) << off;
    EXPECT_EQ(config.preallocate.name, "XLA_PYTHON_CLIENT_PREALLOCATE");
    EXPECT_EQ(config.preallocate.text, off);
    EXPECT_EQ(config.mode.value, Mode::growth) << off;
    EXPECT_EQ(config.mode.name, "XLA_PYTHON_CLIENT_PREALLOCATE");
    EXPECT_TRUE(config.warnings.empty()) << off;
  }
  for (const char* on : {"true", "True", "TRUE", "1", "yes"}) {
    Config config = load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", on}});
    EXPECT_TRUE(config.preallocate.value) << on;
    EXPECT_EQ(config.mode.value, Mode::preallocate);
    EXPECT_TRUE(config.warnings.empty()) << on;
  }
}

TEST(JaxPreallocate, WarnsOnValuesJaxReadsAsTrueUnexpectedly) {
  // "FALSE" and "no" look false but JAX reads them as true: keep JAX's
  // meaning and warn.
  for (const char* value : {"FALSE", "no", "off"}) {
    Config config = load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", value}});
    EXPECT_TRUE(config.preallocate.value) << value;
    ASSERT_EQ(config.warnings.size(), 1u) << value;
    EXPECT_TRUE(contains(config.warnings[0], std::string("'") + value + "'"));
    EXPECT_TRUE(contains(config.warnings[0], "'false', 'False' or '0'"));
  }
  Config config = load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "maybe"}});
  EXPECT_TRUE(config.preallocate.value);
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_TRUE(contains(config.warnings[0], "XLA_PYTHON_CLIENT_PREALLOCATE='maybe'"));
  EXPECT_TRUE(contains(config.warnings[0], "neither true nor false"));
}

TEST(JaxPreallocate, EmptyMeansUnsetAsInJax) {
  Config config = load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", ""}});
  EXPECT_TRUE(config.preallocate.value);
  EXPECT_TRUE(config.preallocate.is_default());
}

TEST(JaxMemFraction, BothNamesAreRead) {
  Config current = load_ok({{"XLA_CLIENT_MEM_FRACTION", ".5"}});
  EXPECT_DOUBLE_EQ(current.mem_fraction.value, 0.5);
  EXPECT_EQ(current.mem_fraction.name, "XLA_CLIENT_MEM_FRACTION");
  EXPECT_TRUE(current.warnings.empty());
  EXPECT_EQ(current.bytes_limit(16 * GiB), 8 * GiB);

  Config old = load_ok({{"XLA_PYTHON_CLIENT_MEM_FRACTION", "0.25"}});
  EXPECT_DOUBLE_EQ(old.mem_fraction.value, 0.25);
  EXPECT_EQ(old.mem_fraction.name, "XLA_PYTHON_CLIENT_MEM_FRACTION");
  EXPECT_TRUE(any_contains(old.warnings, "deprecated"));

  Config whole = load_ok({{"XLA_CLIENT_MEM_FRACTION", "1"}});
  EXPECT_EQ(whole.bytes_limit(80 * GiB), 80 * GiB);
}

TEST(JaxMemFraction, BothNamesSetIsAnError) {
  auto config =
      load({{"XLA_CLIENT_MEM_FRACTION", "0.5"}, {"XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6"}});
  ASSERT_FALSE(config);
  EXPECT_EQ(config.error().code(), Errc::invalid_argument);
  EXPECT_TRUE(contains(config.error().message(), "XLA_CLIENT_MEM_FRACTION='0.5'"));
  EXPECT_TRUE(contains(config.error().message(), "XLA_PYTHON_CLIENT_MEM_FRACTION='0.6'"));
  EXPECT_TRUE(contains(config.error().message(), "deprecated"));
  // ... even when tidepool's own name would win.
  EXPECT_FALSE(load({{"XLA_CLIENT_MEM_FRACTION", "0.5"},
                     {"XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6"},
                     {"TIDEPOOL_MEM_FRACTION", "0.4"}}));
  // An empty one is unset, as in JAX.
  Config config2 = load_ok({{"XLA_CLIENT_MEM_FRACTION", "0.5"}, {"XLA_PYTHON_CLIENT_MEM_FRACTION", ""}});
  EXPECT_DOUBLE_EQ(config2.mem_fraction.value, 0.5);
}

TEST(JaxAllocator, EveryJaxName) {
  struct Case {
    const char* value;
    Mode mode;
  };
  for (Case c : {Case{"default", Mode::preallocate}, Case{"bfc", Mode::preallocate},
                 Case{"BFC", Mode::preallocate}, Case{"platform", Mode::platform},
                 Case{"Platform", Mode::platform}, Case{"cuda_async", Mode::cuda_async},
                 Case{"vmm", Mode::expandable}, Case{"address", Mode::platform}}) {
    Config config = load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", c.value}});
    EXPECT_EQ(config.mode.value, c.mode) << c.value;
    EXPECT_EQ(config.mode.name, "XLA_PYTHON_CLIENT_ALLOCATOR") << c.value;
    EXPECT_EQ(config.mode.text, c.value);
  }
  Config growth =
      load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"}, {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"}});
  EXPECT_EQ(growth.mode.value, Mode::growth);
  EXPECT_EQ(growth.mode.name, "XLA_PYTHON_CLIENT_ALLOCATOR, XLA_PYTHON_CLIENT_PREALLOCATE");
}

TEST(JaxAllocator, VmmAndAddressAreExplained) {
  Config vmm = load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "vmm"}});
  EXPECT_TRUE(any_contains(vmm.notes, "vmm"));
  EXPECT_TRUE(any_contains(vmm.notes, "expandable"));
  Config address = load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "address"}});
  EXPECT_TRUE(any_contains(address.notes, "address"));
  EXPECT_TRUE(any_contains(address.notes, "platform"));
}

TEST(JaxAllocator, FractionBoundsGrowthToo) {
  // XLA's CreateBFCAllocator: the limit is total x fraction whether or not it
  // preallocates.
  Config config =
      load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "false"}, {"XLA_CLIENT_MEM_FRACTION", "0.5"}});
  EXPECT_EQ(config.mode.value, Mode::growth);
  EXPECT_EQ(config.bytes_limit(4 * GiB), 2 * GiB);
}

// --- tidepool's variables ---------------------------------------------------

TEST(TidepoolVariables, Allocator) {
  struct Case {
    const char* value;
    Mode mode;
  };
  for (Case c : {Case{"bfc", Mode::preallocate}, Case{"default", Mode::preallocate},
                 Case{"growth", Mode::growth}, Case{"preallocate", Mode::preallocate},
                 Case{"platform", Mode::platform}, Case{"address", Mode::platform},
                 Case{"expandable", Mode::expandable}, Case{"vmm", Mode::expandable},
                 Case{"cuda_async", Mode::cuda_async}, Case{"Expandable", Mode::expandable}}) {
    Config config = load_ok({{"TIDEPOOL_ALLOCATOR", c.value}});
    EXPECT_EQ(config.mode.value, c.mode) << c.value;
    EXPECT_EQ(config.mode.name, "TIDEPOOL_ALLOCATOR") << c.value;
  }
  // growth and preallocate say what preallocate is.
  Config growth = load_ok({{"TIDEPOOL_ALLOCATOR", "growth"}});
  EXPECT_FALSE(growth.preallocate.value);
  EXPECT_EQ(growth.preallocate.name, "TIDEPOOL_ALLOCATOR");
  Config bfc = load_ok({{"TIDEPOOL_ALLOCATOR", "bfc"}, {"TIDEPOOL_PREALLOCATE", "no"}});
  EXPECT_EQ(bfc.mode.value, Mode::growth);
  EXPECT_EQ(bfc.mode.name, "TIDEPOOL_ALLOCATOR, TIDEPOOL_PREALLOCATE");
}

TEST(TidepoolVariables, MemFraction) {
  Config config = load_ok({{"TIDEPOOL_MEM_FRACTION", "0.4"}});
  EXPECT_DOUBLE_EQ(config.mem_fraction.value, 0.4);
  EXPECT_EQ(config.mem_fraction.name, "TIDEPOOL_MEM_FRACTION");
  EXPECT_EQ(config.mem_fraction.text, "0.4");
  EXPECT_EQ(config.bytes_limit(10 * GiB), static_cast<std::size_t>(10.0L * GiB * 0.4L));
}

TEST(TidepoolVariables, Preallocate) {
  for (const char* on : {"true", "1", "yes", "YES", "on"})
    EXPECT_TRUE(load_ok({{"TIDEPOOL_PREALLOCATE", on}}).preallocate.value) << on;
  for (const char* off : {"false", "0", "no", "False", "off"}) {
    Config config = load_ok({{"TIDEPOOL_PREALLOCATE", off}});
    EXPECT_FALSE(config.preallocate.value) << off;
    EXPECT_EQ(config.preallocate.name, "TIDEPOOL_PREALLOCATE");
    EXPECT_EQ(config.mode.value, Mode::growth);
  }
}

TEST(TidepoolVariables, DeviceCapacityThreshold) {
  Config host = load_ok({{"TIDEPOOL_DEVICE", "host"}, {"TIDEPOOL_HOST_CAPACITY", "80GiB"}});
  EXPECT_EQ(host.device.value, DeviceKind::host);
  EXPECT_EQ(host.device.name, "TIDEPOOL_DEVICE");
  EXPECT_EQ(host.host_capacity.value, 80 * GiB);
  EXPECT_EQ(host.host_capacity.name, "TIDEPOOL_HOST_CAPACITY");
  EXPECT_EQ(host.host_capacity.text, "80GiB");

  Config cuda = load_ok({{"TIDEPOOL_DEVICE", "cuda"}});
  EXPECT_EQ(cuda.device.value, DeviceKind::cuda);
  EXPECT_EQ(device_kind_name(cuda.device.value), "cuda");

  Config threshold =
      load_ok({{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_RELEASE_THRESHOLD", "512MiB"}});
  ASSERT_TRUE(threshold.release_threshold.value.has_value());
  EXPECT_EQ(*threshold.release_threshold.value, 512 * MiB);
  EXPECT_EQ(threshold.release_threshold.name, "TIDEPOOL_RELEASE_THRESHOLD");
  EXPECT_TRUE(threshold.notes.empty());
  EXPECT_EQ(*load_ok({{"TIDEPOOL_RELEASE_THRESHOLD", "0"}}).release_threshold.value, 0u);
}

TEST(TidepoolVariables, IdleReleaseIsADuration) {
  using std::chrono::milliseconds;
  EXPECT_EQ(load_ok({}).idle_release.value, milliseconds(0));  // never, by default
  for (auto [text, ms] : {std::pair<const char*, std::int64_t>{"30", 30000}, {"30s", 30000}, {"1.5", 1500},
                          {"500ms", 500}, {" 2 MIN ", 120000}, {"1h", 3600000}, {"0.0001s", 1}, {"0", 0}}) {
    Config config = load_ok({{"TIDEPOOL_IDLE_RELEASE", text}});
    EXPECT_EQ(config.idle_release.value, milliseconds(ms)) << text;
    EXPECT_EQ(config.idle_release.name, "TIDEPOOL_IDLE_RELEASE");
  }
  for (const char* value : {"soon", "-1s", "10d", "", "s", "721h"})
    expect_invalid({{"TIDEPOOL_IDLE_RELEASE", value}}, "TIDEPOOL_IDLE_RELEASE", value, "a duration");
  Config bfc = load_ok({{"TIDEPOOL_ALLOCATOR", "growth"}, {"TIDEPOOL_IDLE_RELEASE", "10s"}});
  EXPECT_TRUE(any_contains(bfc.notes, "TIDEPOOL_IDLE_RELEASE has no effect in mode growth"));
}

TEST(TidepoolVariables, AliasesIsAStrictBoolean) {
  EXPECT_FALSE(load_ok({}).aliases.value);  // off by default
  for (auto [text, value] : {std::pair{"1", true}, {"on", true}, {"TRUE", true}, {"0", false}, {"off", false}}) {
    Config config = load_ok({{"TIDEPOOL_ALIASES", text}});
    EXPECT_EQ(config.aliases.value, value) << text;
    EXPECT_EQ(config.aliases.name, "TIDEPOOL_ALIASES");
  }
  for (const char* value : {"maybe", "", "2"})
    expect_invalid({{"TIDEPOOL_ALIASES", value}}, "TIDEPOOL_ALIASES", value, "true, false");
  Config bfc = load_ok({{"TIDEPOOL_ALLOCATOR", "growth"}, {"TIDEPOOL_ALIASES", "on"}});
  EXPECT_TRUE(any_contains(bfc.notes, "TIDEPOOL_ALIASES has no effect in mode growth"));
  EXPECT_TRUE(load_ok({{"TIDEPOOL_ALIASES", "on"}}).notes.empty());
}

TEST(TidepoolVariables, WakeWaitIsADuration) {
  using std::chrono::milliseconds;
  EXPECT_EQ(load_ok({}).wake_wait.value, milliseconds(10000));
  Config config = load_ok({{"TIDEPOOL_WAKE_WAIT", "2min"}});
  EXPECT_EQ(config.wake_wait.value, milliseconds(120000));
  EXPECT_EQ(config.wake_wait.name, "TIDEPOOL_WAKE_WAIT");
  EXPECT_EQ(load_ok({{"TIDEPOOL_WAKE_WAIT", "0"}}).wake_wait.value, milliseconds(0));  // no wait
  for (const char* value : {"later", "-1", ""})
    expect_invalid({{"TIDEPOOL_WAKE_WAIT", value}}, "TIDEPOOL_WAKE_WAIT", value, "a duration");
}

TEST(TidepoolVariables, QuotaInEveryForm) {
  Config bytes = load_ok({{"TIDEPOOL_QUOTA", "20GiB"}});
  ASSERT_TRUE(bytes.quota.value.has_value());
  EXPECT_EQ(bytes.quota.value->bytes, 20 * GiB);
  EXPECT_EQ(bytes.quota.value->resolve(80 * GiB), 20 * GiB);
  EXPECT_EQ(bytes.quota.name, "TIDEPOOL_QUOTA");

  Config fraction = load_ok({{"TIDEPOOL_QUOTA", "0.4"}});
  ASSERT_TRUE(fraction.quota.value.has_value());
  EXPECT_DOUBLE_EQ(fraction.quota.value->fraction, 0.4);
  EXPECT_EQ(fraction.quota.value->resolve(10 * GiB), static_cast<std::size_t>(10.0L * GiB * 0.4L));

  Config percent = load_ok({{"TIDEPOOL_QUOTA", "40%"}});
  ASSERT_TRUE(percent.quota.value.has_value());
  EXPECT_DOUBLE_EQ(percent.quota.value->fraction, 0.4);
  EXPECT_EQ(percent.quota.value->to_string(), "40%");

  Config whole = load_ok({{"TIDEPOOL_QUOTA", "1"}});
  EXPECT_DOUBLE_EQ(whole.quota.value->fraction, 1.0);
  Config count = load_ok({{"TIDEPOOL_QUOTA", "1073741824"}});
  EXPECT_EQ(count.quota.value->bytes, GiB);
}

TEST(TidepoolVariables, Ledger) {
  EXPECT_TRUE(load_ok({{"TIDEPOOL_LEDGER", "on"}}).ledger.value);
  EXPECT_FALSE(load_ok({{"TIDEPOOL_LEDGER", "off"}}).ledger.value);
  EXPECT_EQ(load_ok({{"TIDEPOOL_LEDGER", "on"}}).ledger.name, "TIDEPOOL_LEDGER");
}

// --- the scheduler's quota: HAMi-core's CUDA_DEVICE_MEMORY_LIMIT ------------

TEST(HamiLimit, ParsedAsHamiCoreReadsIt) {
  // HAMi-core's get_limit_from_env: k/m/g (either case) are binary units, no
  // suffix is bytes, strtoul base 0 reads 0x as hexadecimal.
  const std::pair<const char*, std::size_t> cases[] = {
      {"24g", 24 * GiB}, {"24G", 24 * GiB}, {"1000m", 1000 * MiB}, {"1000M", 1000 * MiB},
      {"512k", 512 * KiB}, {"512K", 512 * KiB}, {"1073741824", GiB}, {"0x40000000", GiB}, {"0x10g", 16 * GiB}};
  for (const auto& [text, bytes] : cases) {
    Config config = load_ok({{"CUDA_DEVICE_MEMORY_LIMIT", text}});
    ASSERT_TRUE(config.quota.value.has_value()) << text;
    EXPECT_EQ(config.quota.value->bytes, bytes) << text;
    EXPECT_EQ(config.quota.value->fraction, 0.0) << text;
    EXPECT_EQ(config.quota.name, "CUDA_DEVICE_MEMORY_LIMIT") << text;
    EXPECT_EQ(config.quota.text, text);
    EXPECT_TRUE(config.ledger.value) << "a quota is a share in the ledger";
    EXPECT_EQ(config.ledger.name, "CUDA_DEVICE_MEMORY_LIMIT");
    EXPECT_TRUE(any_contains(config.notes, "the container's device memory limit")) << text;
  }
  // Empty is unset, as in HAMi-core.
  EXPECT_FALSE(load_ok({{"CUDA_DEVICE_MEMORY_LIMIT", ""}}).quota.value.has_value());
  EXPECT_FALSE(load_ok({{"CUDA_DEVICE_MEMORY_LIMIT", ""}}).ledger.value);
}

TEST(HamiLimit, RefusesWhatHamiCoreWouldMisreadWithTheVariableNamed) {
  // strtoul stops at the first non-digit: HAMi-core reads "1.5g" as 1 GiB,
  // "1GiB" and "2gb" as 1 and 2 bytes; a leading 0 is octal; 0 it ignores.
  for (const char* value : {"1.5g", "1GiB", "2gb", "010m", "0", "0g", "g", "lots", "-1g", "+5g", " 5g",
                            "99999999999999999999", "99999999999g"})
    expect_invalid({{"CUDA_DEVICE_MEMORY_LIMIT", value}}, "CUDA_DEVICE_MEMORY_LIMIT", value,
                   "HAMi-core's form");
  auto misread = load({{"CUDA_DEVICE_MEMORY_LIMIT_0", "1.5g"}});
  ASSERT_FALSE(misread);
  EXPECT_TRUE(contains(misread.error().message(), "HAMi-core would read only '1'")) << misread.error().message();
  EXPECT_TRUE(contains(misread.error().message(), "CUDA_DEVICE_MEMORY_LIMIT_0='1.5g'")) << misread.error().message();
}

TEST(HamiLimit, Precedence) {
  // The device's own variable over the container-wide one (HAMi-core's order).
  Config indexed = load_ok({{"CUDA_DEVICE_MEMORY_LIMIT", "8g"}, {"CUDA_DEVICE_MEMORY_LIMIT_0", "2g"}});
  EXPECT_EQ(indexed.quota.value->bytes, 2 * GiB);
  EXPECT_EQ(indexed.quota.name, "CUDA_DEVICE_MEMORY_LIMIT_0");
  // Another device's variable is not this device's.
  Config other = load_ok({{"CUDA_DEVICE_MEMORY_LIMIT", "8g"}, {"CUDA_DEVICE_MEMORY_LIMIT_1", "2g"}});
  EXPECT_EQ(other.quota.value->bytes, 8 * GiB);
  EXPECT_EQ(other.quota.name, "CUDA_DEVICE_MEMORY_LIMIT");
  // TIDEPOOL_QUOTA wins over both, with a note; a warning when it asks for more.
  Config tidepool = load_ok({{"TIDEPOOL_QUOTA", "4GiB"}, {"CUDA_DEVICE_MEMORY_LIMIT_0", "2g"}});
  EXPECT_EQ(tidepool.quota.value->bytes, 4 * GiB);
  EXPECT_EQ(tidepool.quota.name, "TIDEPOOL_QUOTA");
  EXPECT_EQ(tidepool.ledger.name, "TIDEPOOL_QUOTA");
  EXPECT_TRUE(any_contains(tidepool.notes, "TIDEPOOL_QUOTA=4GiB is used instead of CUDA_DEVICE_MEMORY_LIMIT_0=2g"));
  EXPECT_TRUE(any_contains(tidepool.warnings, "more than CUDA_DEVICE_MEMORY_LIMIT_0=2g"));
  Config smaller = load_ok({{"TIDEPOOL_QUOTA", "1GiB"}, {"CUDA_DEVICE_MEMORY_LIMIT", "2g"}});
  EXPECT_TRUE(smaller.warnings.empty());
  // A bad HAMi value is an error even when TIDEPOOL_QUOTA is set: the
  // container's configuration is wrong either way.
  expect_invalid({{"TIDEPOOL_QUOTA", "1GiB"}, {"CUDA_DEVICE_MEMORY_LIMIT", "1.5g"}}, "CUDA_DEVICE_MEMORY_LIMIT",
                 "1.5g", "HAMi-core's form");
  // TIDEPOOL_LEDGER=off: not applied (no quota without the ledger), said in a note.
  Config off = load_ok({{"TIDEPOOL_LEDGER", "off"}, {"CUDA_DEVICE_MEMORY_LIMIT", "2g"}});
  EXPECT_FALSE(off.quota.value.has_value());
  EXPECT_FALSE(off.ledger.value);
  EXPECT_TRUE(any_contains(off.notes, "CUDA_DEVICE_MEMORY_LIMIT=2g is not applied by tidepool"));
  Config on = load_ok({{"TIDEPOOL_LEDGER", "on"}, {"CUDA_DEVICE_MEMORY_LIMIT", "2g"}});
  EXPECT_EQ(on.quota.value->bytes, 2 * GiB);
  EXPECT_EQ(on.ledger.name, "TIDEPOOL_LEDGER");
}

// --- precedence -------------------------------------------------------------

TEST(Precedence, TidepoolNamesWin) {
  Config config = load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "platform"},
                           {"TIDEPOOL_ALLOCATOR", "expandable"},
                           {"XLA_CLIENT_MEM_FRACTION", "0.5"},
                           {"TIDEPOOL_MEM_FRACTION", "0.9"},
                           {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                           {"TIDEPOOL_PREALLOCATE", "true"}});
  EXPECT_EQ(config.mode.value, Mode::expandable);
  EXPECT_EQ(config.mode.name, "TIDEPOOL_ALLOCATOR");
  EXPECT_DOUBLE_EQ(config.mem_fraction.value, 0.9);
  EXPECT_EQ(config.mem_fraction.name, "TIDEPOOL_MEM_FRACTION");
  EXPECT_TRUE(config.preallocate.value);
  EXPECT_EQ(config.preallocate.name, "TIDEPOOL_PREALLOCATE");
  EXPECT_TRUE(any_contains(config.notes, "TIDEPOOL_ALLOCATOR=expandable overrides "
                                         "XLA_PYTHON_CLIENT_ALLOCATOR=platform"));
  EXPECT_TRUE(any_contains(config.notes, "TIDEPOOL_MEM_FRACTION=0.9 overrides "
                                         "XLA_CLIENT_MEM_FRACTION=0.5"));
}

TEST(Precedence, TidepoolPreallocateDecidesJaxBfc) {
  Config config =
      load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "true"}, {"TIDEPOOL_PREALLOCATE", "false"}});
  EXPECT_EQ(config.mode.value, Mode::growth);
  EXPECT_EQ(config.mode.name, "TIDEPOOL_PREALLOCATE");
}

TEST(Precedence, TidepoolAllocatorOverridesJaxPreallocate) {
  Config config =
      load_ok({{"XLA_PYTHON_CLIENT_PREALLOCATE", "true"}, {"TIDEPOOL_ALLOCATOR", "growth"}});
  EXPECT_EQ(config.mode.value, Mode::growth);
  EXPECT_FALSE(config.preallocate.value);
  EXPECT_TRUE(any_contains(config.notes, "overrides XLA_PYTHON_CLIENT_PREALLOCATE"));
}

TEST(Precedence, StrictContradictionIsAnError) {
  expect_invalid({{"TIDEPOOL_ALLOCATOR", "growth"}, {"TIDEPOOL_PREALLOCATE", "true"}},
                 "TIDEPOOL_ALLOCATOR", "growth", "TIDEPOOL_PREALLOCATE");
  expect_invalid({{"TIDEPOOL_ALLOCATOR", "preallocate"}, {"TIDEPOOL_PREALLOCATE", "0"}},
                 "TIDEPOOL_ALLOCATOR", "preallocate", "TIDEPOOL_PREALLOCATE");
  // Agreeing is fine.
  EXPECT_EQ(load_ok({{"TIDEPOOL_ALLOCATOR", "growth"}, {"TIDEPOOL_PREALLOCATE", "no"}}).mode.value,
            Mode::growth);
}

TEST(Notes, SettingsWithoutEffectAreSaid) {
  Config platform = load_ok({{"XLA_PYTHON_CLIENT_ALLOCATOR", "platform"},
                             {"XLA_CLIENT_MEM_FRACTION", "0.5"},
                             {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                             {"TIDEPOOL_RELEASE_THRESHOLD", "1GiB"}});
  EXPECT_TRUE(any_contains(platform.notes, "XLA_CLIENT_MEM_FRACTION has no effect in mode platform"));
  EXPECT_TRUE(
      any_contains(platform.notes, "XLA_PYTHON_CLIENT_PREALLOCATE has no effect in mode platform"));
  EXPECT_TRUE(any_contains(platform.notes, "TIDEPOOL_RELEASE_THRESHOLD has no effect"));
  EXPECT_TRUE(platform.warnings.empty());
}

// --- bad values ---------------------------------------------------------------

TEST(BadValues, Fractions) {
  const std::string allowed = "greater than 0 and at most 1";
  for (const char* variable :
       {"TIDEPOOL_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"}) {
    for (const char* value : {"1.5", "0", "abc", "-0.5", "nan", "inf", "0.5x"})
      expect_invalid({{variable, value}}, variable, value, allowed);
  }
  expect_invalid({{"TIDEPOOL_MEM_FRACTION", ""}}, "TIDEPOOL_MEM_FRACTION", "", allowed);
}

TEST(BadValues, Allocators) {
  expect_invalid({{"TIDEPOOL_ALLOCATOR", "foo"}}, "TIDEPOOL_ALLOCATOR", "foo",
                 "bfc, cuda_async, vmm, address, growth, preallocate, expandable");
  expect_invalid({{"TIDEPOOL_ALLOCATOR", ""}}, "TIDEPOOL_ALLOCATOR", "", "expandable");
  // JAX's variable takes JAX's names only, and (as jaxlib) not an empty one.
  expect_invalid({{"XLA_PYTHON_CLIENT_ALLOCATOR", "foo"}}, "XLA_PYTHON_CLIENT_ALLOCATOR", "foo",
                 "default, platform, bfc, cuda_async, vmm, address");
  expect_invalid({{"XLA_PYTHON_CLIENT_ALLOCATOR", "expandable"}}, "XLA_PYTHON_CLIENT_ALLOCATOR",
                 "expandable", "vmm");
  expect_invalid({{"XLA_PYTHON_CLIENT_ALLOCATOR", ""}}, "XLA_PYTHON_CLIENT_ALLOCATOR", "",
                 "default");
}

TEST(BadValues, Booleans) {
  for (const char* variable : {"TIDEPOOL_PREALLOCATE", "TIDEPOOL_LEDGER"})
    for (const char* value : {"maybe", "", "2", "tru"})
      expect_invalid({{variable, value}}, variable, value, "true, false, 1, 0, yes, no");
}

TEST(BadValues, Device) {
  expect_invalid({{"TIDEPOOL_DEVICE", "gpu"}}, "TIDEPOOL_DEVICE", "gpu", "host or cuda");
  expect_invalid({{"TIDEPOOL_DEVICE", ""}}, "TIDEPOOL_DEVICE", "", "host or cuda");
}

TEST(BadValues, Sizes) {
  for (const char* value : {"-3", "abc", "12XB", "", "0"})
    expect_invalid({{"TIDEPOOL_HOST_CAPACITY", value}}, "TIDEPOOL_HOST_CAPACITY", value, "GiB");
  for (const char* value : {"-1", "lots", "5 parsecs"})
    expect_invalid({{"TIDEPOOL_RELEASE_THRESHOLD", value}}, "TIDEPOOL_RELEASE_THRESHOLD", value,
                   "GiB");
}

TEST(BadValues, Quota) {
  for (const char* value : {"0", "0%", "150%", "-0.4", "1.5", "abc", "20XB", "", "0GiB", "x%"})
    expect_invalid({{"TIDEPOOL_QUOTA", value}}, "TIDEPOOL_QUOTA", value,
                   "a byte size (e.g. 20GiB), a fraction");
}

TEST(BadValues, FirstErrorStopsEvenWithGoodNeighbours) {
  expect_invalid({{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_HOST_CAPACITY", "-3"}},
                 "TIDEPOOL_HOST_CAPACITY", "-3", "GiB");
}

TEST(ConfigSharing, LedgerNameIsASegmentName) {
  EXPECT_TRUE(load_ok({}).ledger_name.value.empty());
  const Config named = load_ok({{"TIDEPOOL_LEDGER_NAME", "team-gpu0"}});
  EXPECT_EQ(named.ledger_name.value, "/team-gpu0");
  EXPECT_EQ(named.ledger_name.name, "TIDEPOOL_LEDGER_NAME");
  EXPECT_TRUE(named.warnings.empty());  // a known variable
  EXPECT_EQ(load_ok({{"TIDEPOOL_LEDGER_NAME", "/x"}}).ledger_name.value, "/x");
  expect_invalid({{"TIDEPOOL_LEDGER_NAME", "a/b"}}, "TIDEPOOL_LEDGER_NAME", "a/b", "no other '/'");
  expect_invalid({{"TIDEPOOL_LEDGER_NAME", "/"}}, "TIDEPOOL_LEDGER_NAME", "/", "segment name");
}

}  // namespace
}  // namespace tidepool
