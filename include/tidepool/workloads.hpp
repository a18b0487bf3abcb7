// Built-in workloads: synthetic traces shaped like real GPU programs, sized
// for an 80 GiB device, for the command's default comparison and for tests.
// Each is seeded and deterministic: the same name, seed and steps give the
// same trace on every platform and compiler.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tidepool/error.hpp"
#include "tidepool/trace.hpp"

namespace tidepool::trace {

struct WorkloadInfo {
  std::string_view name;
  std::string_view description;
  std::uint32_t default_steps;  // WorkloadOptions::steps when it is 0
  std::string_view steps_are;   // what a step is: "training steps", "requests per worker", ...
};

/// A workload is at most this many times its default size (its trace's
/// events, and the memory they take, grow with its steps).
inline constexpr std::uint32_t kMaxStepsFactor = 10;

/// The built-in workloads: "train-step", "llm-inference", "small-tensors",
/// and three that stress a pool where it is weakest: "multi-stream-inference",
/// "near-capacity", "random-mixed".
const std::vector<WorkloadInfo>& workloads();

struct WorkloadOptions {
  std::uint64_t seed = 1;
  /// The workload's size in its own steps (WorkloadInfo::steps_are), at
  /// most kMaxStepsFactor times its default; 0 picks the default.
  std::uint32_t steps = 0;
};

/// The trace of a built-in workload (format "builtin", device_capacity
/// 80 GiB, no times). Blocks that stay live at the end are the program's
/// long-lived state (weights, optimizer state); everything else is freed.
/// invalid_argument naming the known workloads for an unknown name, or the
/// allowed steps for too many.
Expected<Trace> make_workload(std::string_view name, const WorkloadOptions& options = {});

}  // namespace tidepool::trace
