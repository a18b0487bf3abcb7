// Runs the built `tidepool` command with a controlled environment and checks
// what it prints and how it exits.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tidepool/ledger.hpp"
#include "tools/run_cli.hpp"

namespace {

#ifdef TIDEPOOL_CLI

using tidepool::test::contains;
using tidepool::test::read_file;
using Result = tidepool::test::CliResult;
Result run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  return tidepool::test::run_cli(args, env);
}

TEST(TidepoolCommand, HelpListsSubcommands) {
  Result result = run_cli({"--help"}, {});
  EXPECT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "info")) << result.out;
  EXPECT_TRUE(contains(result.out, "Show the device")) << result.out;
}

TEST(TidepoolCommand, NoSubcommandIsAnError) {
  Result result = run_cli({}, {});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.exit_status, -1);
}

TEST(TidepoolInfo, DefaultsAndWhereTheyCameFrom) {
  // Pinned to the host device: on a machine with a GPU the default is the GPU.
  Result result = run_cli({"info"}, {"TIDEPOOL_DEVICE=host"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_TRUE(contains(out, "Device")) << out;
  EXPECT_TRUE(contains(out, "capacity         16.0 GiB (17179869184 bytes)")) << out;
  EXPECT_TRUE(contains(out, "granularity")) << out;
  EXPECT_TRUE(contains(out, "mode               expandable")) << out;
  EXPECT_TRUE(contains(out, "keep all, until trim()")) << out;
  EXPECT_TRUE(contains(out, "ledger_mode        user (0600)")) << out;
  EXPECT_TRUE(contains(out, "mem_fraction       0.75")) << out;
  EXPECT_TRUE(contains(out, "bytes_limit        12.0 GiB")) << out;
  EXPECT_TRUE(contains(out, "default")) << out;
  // The JAX mapping notes, always shown.
  EXPECT_TRUE(contains(out, "XLA_PYTHON_CLIENT_ALLOCATOR=vmm -> expandable")) << out;
  EXPECT_TRUE(contains(out, "XLA_PYTHON_CLIENT_ALLOCATOR=address -> platform")) << out;
  EXPECT_FALSE(contains(out, "Warnings")) << out;
  EXPECT_TRUE(result.err.empty()) << result.err;
}

TEST(TidepoolInfo, SaysWhichVariableSetWhat) {
  Result result = run_cli({"info"}, {"TIDEPOOL_DEVICE=host", "XLA_PYTHON_CLIENT_PREALLOCATE=false",
                                     "XLA_CLIENT_MEM_FRACTION=0.5", "TIDEPOOL_HOST_CAPACITY=80GiB"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_TRUE(contains(out, "growth")) << out;
  EXPECT_TRUE(contains(out, "XLA_PYTHON_CLIENT_PREALLOCATE=false")) << out;
  EXPECT_TRUE(contains(out, "XLA_CLIENT_MEM_FRACTION=0.5")) << out;
  EXPECT_TRUE(contains(out, "80.0 GiB (85899345920 bytes)")) << out;
  EXPECT_TRUE(contains(out, "TIDEPOOL_HOST_CAPACITY=80GiB")) << out;
  EXPECT_TRUE(contains(out, "bytes_limit        40.0 GiB")) << out;
}

TEST(TidepoolInfo, ExplainsJaxVmmAndAddress) {
  Result vmm = run_cli({"info"}, {"XLA_PYTHON_CLIENT_ALLOCATOR=vmm"});
  ASSERT_EQ(vmm.exit_status, 0) << vmm.err;
  EXPECT_TRUE(contains(vmm.out, "mode               expandable")) << vmm.out;
  EXPECT_TRUE(contains(vmm.out, "XLA_PYTHON_CLIENT_ALLOCATOR=vmm (XLA's virtual-memory allocator) "
                                "runs as tidepool's expandable pool"))
      << vmm.out;
  Result address = run_cli({"info"}, {"XLA_PYTHON_CLIENT_ALLOCATOR=address"});
  ASSERT_EQ(address.exit_status, 0) << address.err;
  EXPECT_TRUE(contains(address.out, "mode               platform")) << address.out;
  EXPECT_TRUE(contains(address.out, "runs as tidepool's platform (pass-through) pool"))
      << address.out;
}

TEST(TidepoolInfo, ShowsWarnings) {
  Result result = run_cli({"info"}, {"XLA_PYTHON_CLIENT_PREALLOCATE=maybe", "TIDEPOOL_ALLOCATR=growth"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "Warnings")) << result.out;
  EXPECT_TRUE(contains(result.out, "XLA_PYTHON_CLIENT_PREALLOCATE='maybe' is neither true nor false"))
      << result.out;
  EXPECT_TRUE(contains(result.out, "unknown variable TIDEPOOL_ALLOCATR")) << result.out;
}

TEST(TidepoolInfo, ShowsTheSchedulersQuotaAndWhereItCameFrom) {
  // A ledger of its own, so that the test shares nothing with others.
  const std::string segment = "/tidepool-info-test-hami-" + std::to_string(getpid());
  Result result = run_cli({"info"}, {"CUDA_DEVICE_MEMORY_LIMIT=8g", "CUDA_DEVICE_MEMORY_LIMIT_0=2g",
                                     "TIDEPOOL_LEDGER_NAME=" + segment});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "quota              2.00 GiB")) << result.out;
  EXPECT_TRUE(contains(result.out, "CUDA_DEVICE_MEMORY_LIMIT_0=2g")) << result.out;
  EXPECT_TRUE(contains(result.out, "ledger             on")) << result.out;
  EXPECT_TRUE(contains(result.out, "the container's device memory limit")) << result.out;
  EXPECT_TRUE(contains(result.out, "on (segment " + segment + ")")) << result.out;
  // Resolving the quota against the device built nothing in the ledger.
  EXPECT_FALSE(tidepool::Ledger::open_existing(segment)) << "tidepool info created " << segment;
  shm_unlink(segment.c_str());
}

TEST(TidepoolInfo, BadVariablesFailClearly) {
  struct Case {
    std::string variable;
    std::string value;
    std::string allowed;
  };
  const std::vector<Case> cases = {
      {"TIDEPOOL_MEM_FRACTION", "1.5", "at most 1"},
      {"TIDEPOOL_MEM_FRACTION", "0", "greater than 0"},
      {"XLA_CLIENT_MEM_FRACTION", "abc", "a number greater than 0 and at most 1"},
      {"TIDEPOOL_ALLOCATOR", "foo", "expandable"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR", "foo", "vmm"},
      {"TIDEPOOL_HOST_CAPACITY", "-3", "GiB"},
      {"TIDEPOOL_PREALLOCATE", "maybe", "true, false"},
      {"TIDEPOOL_DEVICE", "gpu", "host or cuda"},
      {"TIDEPOOL_QUOTA", "150%", "percentage"},
      {"TIDEPOOL_LEDGER", "sometimes", "on or off"},
      {"TIDEPOOL_RELEASE_THRESHOLD", "lots", "GiB"},
      {"CUDA_DEVICE_MEMORY_LIMIT", "1.5g", "HAMi-core's form"},
  };
  for (const Case& c : cases) {
    Result result = run_cli({"info"}, {c.variable + "=" + c.value});
    EXPECT_EQ(result.exit_status, 1) << c.variable << "=" << c.value;
    EXPECT_TRUE(result.out.empty()) << result.out;
    EXPECT_TRUE(contains(result.err, "tidepool: error: ")) << result.err;
    EXPECT_TRUE(contains(result.err, c.variable + "='" + c.value + "'")) << result.err;
    EXPECT_TRUE(contains(result.err, c.allowed)) << result.err;
  }
}

TEST(TidepoolInfo, BothJaxFractionNamesFail) {
  Result result =
      run_cli({"info"}, {"XLA_CLIENT_MEM_FRACTION=0.5", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5"});
  EXPECT_EQ(result.exit_status, 1);
  EXPECT_TRUE(contains(result.err, "are both set")) << result.err;
}

TEST(TidepoolInfo, CudaDeviceWithoutCudaFails) {
#ifdef TIDEPOOL_HAVE_CUDA
  GTEST_SKIP() << "this build has the CUDA device";
#else
  Result result = run_cli({"info"}, {"TIDEPOOL_DEVICE=cuda"});
  EXPECT_EQ(result.exit_status, 1);
  EXPECT_TRUE(contains(result.err, "TIDEPOOL_DEVICE=cuda")) << result.err;
#endif
}

TEST(TidepoolInfo, Json) {
  Result result = run_cli({"info", "--json"},
                          {"TIDEPOOL_DEVICE=host", "TIDEPOOL_ALLOCATOR=growth", "TIDEPOOL_HOST_CAPACITY=1GiB",
                           "XLA_PYTHON_CLIENT_PREALLOCATE=FALSE"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  auto info = nlohmann::json::parse(result.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(info.is_discarded()) << result.out;
  EXPECT_EQ(info["device"]["total_bytes"], 1u << 30);
  EXPECT_EQ(info["configuration"]["mode"]["value"], "growth");
  EXPECT_EQ(info["configuration"]["mode"]["source"], "TIDEPOOL_ALLOCATOR");
  EXPECT_EQ(info["configuration"]["mode"]["text"], "growth");
  EXPECT_EQ(info["configuration"]["bytes_limit"]["bytes"], (1u << 30) / 4 * 3);
  EXPECT_EQ(info["configuration"]["host_capacity"]["source"], "TIDEPOOL_HOST_CAPACITY");
  EXPECT_EQ(info["modes"]["growth"]["available"], true);
  ASSERT_EQ(info["warnings"].size(), 1u);
  EXPECT_TRUE(contains(info["warnings"][0].get<std::string>(), "FALSE"));
  EXPECT_FALSE(info["jax_mapping"].empty());
}

#else

TEST(TidepoolCommand, NotBuilt) { GTEST_SKIP() << "the tidepool command is not part of this build"; }

#endif

}  // namespace
