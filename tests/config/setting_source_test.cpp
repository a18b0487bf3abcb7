// Where each setting came from (Origin, the name the user used) and the
// vocabulary of what the config layer says: variables for the environment,
// keys for a config string, never one translated into the other.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tidepool/config.hpp"

namespace tidepool {
namespace {

using Vars = std::map<std::string, std::string>;

Config from_vars(const Vars& vars) {
  auto config = Config::from_env(
      [&vars](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      DeviceKind::host);
  EXPECT_TRUE(config) << config.error().message();
  return config ? *config : Config{};
}

Config from_keys(const KeyValues& keys) {
  auto config = Config::from_keys(keys, DeviceKind::host);
  EXPECT_TRUE(config) << config.error().message();
  return config ? *config : Config{};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every message a configuration carries for later layers and the user.
std::vector<std::string> said(const Config& config) {
  std::vector<std::string> lines = config.notes;
  lines.insert(lines.end(), config.warnings.begin(), config.warnings.end());
  return lines;
}

void expect_source(const SettingSource& setting, Origin origin, const std::string& name, const std::string& text) {
  EXPECT_EQ(setting.origin, origin) << name;
  EXPECT_EQ(setting.name, name);
  EXPECT_EQ(setting.text, text) << name;
  EXPECT_EQ(setting.source(), name);
  EXPECT_FALSE(setting.is_default()) << name;
}

TEST(SettingOrigin, DefaultsHaveNoName) {
  const Config config = from_vars({});
  for (const SettingSource* setting :
       std::vector<const SettingSource*>{&config.mode, &config.mem_fraction, &config.preallocate, &config.device,
                                         &config.host_capacity, &config.release_threshold, &config.idle_release,
                                         &config.aliases, &config.wake_wait, &config.quota, &config.ledger, &config.ledger_mode,
                                         &config.ledger_name}) {
    EXPECT_EQ(setting->origin, Origin::default_value);
    EXPECT_TRUE(setting->is_default());
    EXPECT_FALSE(setting->is_tidepool());
    EXPECT_TRUE(setting->name.empty()) << setting->name;
    EXPECT_EQ(setting->source(), "default");
  }
  EXPECT_EQ(config.vocabulary, Vocabulary::variables);
}

TEST(SettingOrigin, JaxVariables) {
  const Config config = from_vars({{"XLA_CLIENT_MEM_FRACTION", "0.5"},
                                   {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                                   {"XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"}});
  expect_source(config.mem_fraction, Origin::jax_variable, "XLA_CLIENT_MEM_FRACTION", "0.5");
  expect_source(config.preallocate, Origin::jax_variable, "XLA_PYTHON_CLIENT_PREALLOCATE", "false");
  EXPECT_EQ(config.mode.origin, Origin::jax_variable);
  EXPECT_EQ(config.mode.name, "XLA_PYTHON_CLIENT_ALLOCATOR, XLA_PYTHON_CLIENT_PREALLOCATE");
  EXPECT_FALSE(config.mem_fraction.is_tidepool());
}

// A JAX fraction alone brings JAX's default pool back: decided by its
// origin, whichever of JAX's two names set it.
TEST(SettingOrigin, AJaxFractionChoosesJaxsPool) {
  for (const char* variable : {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"}) {
    const Config config = from_vars({{variable, "0.5"}});
    EXPECT_EQ(config.mem_fraction.origin, Origin::jax_variable) << variable;
    EXPECT_EQ(config.mode.value, Mode::preallocate) << variable;
  }
  EXPECT_EQ(from_vars({{"TIDEPOOL_MEM_FRACTION", "0.5"}}).mode.value, Mode::expandable);
}

TEST(SettingOrigin, TidepoolVariables) {
  const Config config = from_vars({{"TIDEPOOL_MEM_FRACTION", "0.4"}, {"TIDEPOOL_ALLOCATOR", "growth"},
                                   {"TIDEPOOL_QUOTA", "2GiB"}, {"TIDEPOOL_IDLE_RELEASE", "5s"}});
  expect_source(config.mem_fraction, Origin::tidepool_variable, "TIDEPOOL_MEM_FRACTION", "0.4");
  expect_source(config.mode, Origin::tidepool_variable, "TIDEPOOL_ALLOCATOR", "growth");
  expect_source(config.preallocate, Origin::tidepool_variable, "TIDEPOOL_ALLOCATOR", "growth");
  expect_source(config.quota, Origin::tidepool_variable, "TIDEPOOL_QUOTA", "2GiB");
  expect_source(config.ledger, Origin::tidepool_variable, "TIDEPOOL_QUOTA", "2GiB");  // the quota turned it on
  expect_source(config.idle_release, Origin::tidepool_variable, "TIDEPOOL_IDLE_RELEASE", "5s");
  EXPECT_TRUE(config.mem_fraction.is_tidepool());
}

TEST(SettingOrigin, DevicePluginVariable) {
  const Config config = from_vars({{"CUDA_DEVICE_MEMORY_LIMIT", "4g"}});
  expect_source(config.quota, Origin::plugin_variable, "CUDA_DEVICE_MEMORY_LIMIT", "4g");
  EXPECT_FALSE(config.quota.is_tidepool());
  EXPECT_EQ(config.ledger.origin, Origin::plugin_variable);
}

TEST(SettingOrigin, ConfigKeys) {
  const Config config = from_keys({{"mem_fraction", "0.5"}, {"mode", "growth"}, {"capacity", "1GiB"},
                                   {"quota", "40%"}, {"wake_wait", "2s"}, {"aliases", "on"}});
  EXPECT_EQ(config.vocabulary, Vocabulary::keys);
  expect_source(config.mem_fraction, Origin::config_key, "mem_fraction", "0.5");
  expect_source(config.mode, Origin::config_key, "mode", "growth");
  expect_source(config.preallocate, Origin::config_key, "mode", "growth");
  expect_source(config.host_capacity, Origin::config_key, "capacity", "1GiB");
  expect_source(config.quota, Origin::config_key, "quota", "40%");
  expect_source(config.ledger, Origin::config_key, "quota", "40%");
  expect_source(config.wake_wait, Origin::config_key, "wake_wait", "2s");
  expect_source(config.aliases, Origin::config_key, "aliases", "on");
  EXPECT_TRUE(config.aliases.value);
  EXPECT_TRUE(config.quota.is_tidepool());  // strict, as TIDEPOOL_QUOTA
  EXPECT_TRUE(config.device.is_default());
}

// Keys are tidepool's settings; the rules are the same whichever name set them.
TEST(SettingOrigin, KeysFollowTheVariablesRules) {
  EXPECT_EQ(from_keys({}).mode.value, from_vars({}).mode.value);
  EXPECT_EQ(from_keys({{"preallocate", "false"}, {"mode", "bfc"}}).mode.value, Mode::growth);
  EXPECT_EQ(from_keys({{"mem_fraction", "0.5"}}).mode.value, Mode::expandable);  // not a JAX fraction
}

// Each key's bad value: an error naming the key and the value, and never
// the TIDEPOOL_ variable the key stands for.
TEST(SettingVocabulary, ABadKeyValueNamesTheKey) {
  std::set<std::string> keys;
  for (const SettingName& setting : setting_names()) {
    if (setting.key.empty()) continue;
    const std::string key(setting.key);
    keys.insert(key);
    auto config = Config::from_keys({{key, "bogus!"}}, DeviceKind::host);
    ASSERT_FALSE(config) << key << "=bogus! was accepted";
    EXPECT_EQ(config.error().code(), Errc::invalid_argument);
    const std::string& message = config.error().message();
    EXPECT_TRUE(message.starts_with(key + "='bogus!' is invalid")) << message;
    EXPECT_FALSE(contains(message, "TIDEPOOL_")) << message;
  }
  EXPECT_EQ(keys.size(), 12u);  // the keys the C ABI and Python accept
  auto fraction = Config::from_keys({{"mem_fraction", "abc"}}, DeviceKind::host);
  ASSERT_FALSE(fraction);
  EXPECT_TRUE(contains(fraction.error().message(), "mem_fraction='abc' is invalid: not a number"))
      << fraction.error().message();
}

TEST(SettingVocabulary, ContradictionsAndAdviceUseKeys) {
  auto growth = Config::from_keys({{"mode", "growth"}, {"preallocate", "true"}}, DeviceKind::host);
  ASSERT_FALSE(growth);
  EXPECT_EQ(growth.error().message(),
            "mode='growth' contradicts preallocate='true'; allowed: set one of them, or mode=bfc to let "
            "preallocate choose");
  auto quota = Config::from_keys({{"quota", "1GiB"}, {"ledger", "off"}}, DeviceKind::host);
  ASSERT_FALSE(quota);
  EXPECT_TRUE(contains(quota.error().message(), "quota='1GiB' contradicts ledger='off'")) << quota.error().message();
  EXPECT_TRUE(contains(quota.error().message(), "or ledger=on")) << quota.error().message();
  EXPECT_FALSE(contains(quota.error().message(), "TIDEPOOL_")) << quota.error().message();
  // The same in the environment's vocabulary.
  auto variables = Config::from_env(
      [](const char* name) -> const char* {
        return std::string(name) == "TIDEPOOL_QUOTA" ? "1GiB" : std::string(name) == "TIDEPOOL_LEDGER" ? "off" : nullptr;
      },
      DeviceKind::host);
  ASSERT_FALSE(variables);
  EXPECT_TRUE(contains(variables.error().message(), "or TIDEPOOL_LEDGER=on")) << variables.error().message();
}

TEST(SettingVocabulary, NotesAndWarningsUseKeys) {
  const Config config = from_keys({{"mode", "platform"}, {"mem_fraction", "0.5"}, {"idle_release", "1s"},
                                   {"release_threshold", "1GiB"}, {"ledger_mode", "group"}});
  ASSERT_FALSE(said(config).empty());
  for (const std::string& line : said(config)) EXPECT_FALSE(contains(line, "TIDEPOOL_")) << line;
  bool fraction_said = false;
  for (const std::string& line : config.notes) fraction_said |= line.starts_with("mem_fraction has no effect");
  EXPECT_TRUE(fraction_said);
}

TEST(SettingVocabulary, OomWordsUseTheConfigurationsNames) {
  const OomWords keys = from_keys({}).oom_words();
  EXPECT_EQ(keys.limit, "mem_fraction");
  EXPECT_EQ(keys.grow_on_demand, "preallocate=false");
  EXPECT_EQ(keys.expandable, "mode=expandable");
  const OomWords variables = from_vars({}).oom_words();
  EXPECT_EQ(variables.limit, "TIDEPOOL_MEM_FRACTION");
  EXPECT_EQ(variables.expandable, "TIDEPOOL_ALLOCATOR=expandable");
}

TEST(SettingVocabulary, UnknownKeysListTheKeys) {
  auto config = Config::from_keys({{"colour", "blue"}}, DeviceKind::host);
  ASSERT_FALSE(config);
  EXPECT_TRUE(contains(config.error().message(), "unknown setting 'colour'")) << config.error().message();
  EXPECT_TRUE(contains(config.error().message(), "mem_fraction")) << config.error().message();
  // TIDEPOOL_LEDGER_NAME has no key: not settable by a config string.
  EXPECT_FALSE(Config::from_keys({{"ledger_name", "x"}}, DeviceKind::host));
}

TEST(ConfigString, ParsesKeysInOrder) {
  auto settings = parse_config_string(" mode = growth ,mem_fraction=0.5");
  ASSERT_TRUE(settings) << settings.error().message();
  EXPECT_EQ(*settings, (KeyValues{{"mode", "growth"}, {"mem_fraction", "0.5"}}));
  EXPECT_TRUE(parse_config_string("  ")->empty());
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"mode", "no '='"}, {"=3", "no key"}, {"colour=blue", "unknown key 'colour'"},
           {"mode=growth,mode=platform", "a second time"}}) {
    auto bad = parse_config_string(text);
    ASSERT_FALSE(bad) << text;
    EXPECT_TRUE(contains(bad.error().message(), why)) << bad.error().message();
  }
}

TEST(SettingNames, EachVariableAndKeyOnce) {
  std::set<std::string_view> variables, keys;
  for (const SettingName& setting : setting_names()) {
    EXPECT_TRUE(setting.variable.starts_with("TIDEPOOL_")) << setting.variable;
    EXPECT_TRUE(variables.insert(setting.variable).second) << setting.variable;
    if (!setting.key.empty()) {
      EXPECT_TRUE(keys.insert(setting.key).second) << setting.key;
    }
  }
}

}  // namespace
}  // namespace tidepool
