// Runs the built `tidepool` command (TIDEPOOL_CLI) for the tests in
// tests/tools/: a controlled environment, output captured in files so that
// neither pipe can fill and block the child.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tidepool::test {

struct CliResult {
  int exit_status = -1;  // -1: did not exit normally
  std::string out;
  std::string err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#ifdef TIDEPOOL_CLI
/// Runs `tidepool args...` with exactly `env` ("NAME=value" each) and PATH as
/// its environment.
inline CliResult run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  char dir_template[] = "/tmp/tidepool-cli-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  EXPECT_NE(dir, nullptr);
  if (dir == nullptr) return {};
  const std::string out_path = std::string(dir) + "/out";
  const std::string err_path = std::string(dir) + "/err";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);

  std::vector<std::string> argv_storage = {TIDEPOOL_CLI};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_storage = {"PATH=/usr/bin:/bin"};
  env_storage.insert(env_storage.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& var : env_storage) envp.push_back(var.data());
  envp.push_back(nullptr);

  CliResult result;
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, TIDEPOOL_CLI, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(spawned, 0) << "cannot run " << TIDEPOOL_CLI;
  if (spawned == 0) {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) result.exit_status = WEXITSTATUS(status);
  }
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  rmdir(dir);
  return result;
}
#endif

}  // namespace tidepool::test
