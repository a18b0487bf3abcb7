// tidepool's settings by name: each variable written once, with its key. The
// parser reads through these, so a setting's name in a message is whichever
// of the two the user's vocabulary uses.
#pragma once

#include <array>
#include <string>

#include "tidepool/config.hpp"

namespace tidepool::config_names {

inline constexpr SettingName kAllocator{"TIDEPOOL_ALLOCATOR", "mode"};
inline constexpr SettingName kDevice{"TIDEPOOL_DEVICE", "device"};
inline constexpr SettingName kHostCapacity{"TIDEPOOL_HOST_CAPACITY", "capacity"};
inline constexpr SettingName kMemFraction{"TIDEPOOL_MEM_FRACTION", "mem_fraction"};
inline constexpr SettingName kPreallocate{"TIDEPOOL_PREALLOCATE", "preallocate"};
inline constexpr SettingName kReleaseThreshold{"TIDEPOOL_RELEASE_THRESHOLD", "release_threshold"};
inline constexpr SettingName kIdleRelease{"TIDEPOOL_IDLE_RELEASE", "idle_release"};
inline constexpr SettingName kAliases{"TIDEPOOL_ALIASES", "aliases"};
inline constexpr SettingName kWakeWait{"TIDEPOOL_WAKE_WAIT", "wake_wait"};
inline constexpr SettingName kQuota{"TIDEPOOL_QUOTA", "quota"};
inline constexpr SettingName kLedger{"TIDEPOOL_LEDGER", "ledger"};
inline constexpr SettingName kLedgerMode{"TIDEPOOL_LEDGER_MODE", "ledger_mode"};
// No key: a config string's allocator joins the device's ledger.
inline constexpr SettingName kLedgerName{"TIDEPOOL_LEDGER_NAME", ""};

// Read by the interposer of `tidepool run` itself (bindings/preload/), listed
// so that they are not reported as misspelt.
inline constexpr std::array<SettingName, 4> kInterposerOnly = {{
    {"TIDEPOOL_RECORD", ""}, {"TIDEPOOL_POOL", ""}, {"TIDEPOOL_REPORT", ""}, {"TIDEPOOL_RUN_PID", ""}}};

/// `setting`'s name in `vocabulary`.
inline std::string name_in(Vocabulary vocabulary, const SettingName& setting) {
  return std::string(vocabulary == Vocabulary::keys ? setting.key : setting.variable);
}

/// The config string's keys, "mode, device, ...", for an error.
std::string key_list();
/// The setting a config string's `key` sets, or nullptr for an unknown key.
const SettingName* find_key(std::string_view key);

}  // namespace tidepool::config_names
