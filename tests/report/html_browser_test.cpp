// The HTML report in a real browser: headless Chromium loads the page with
// no script errors and Chart.js draws every chart (the page's own marks,
// read back with --dump-dom), and a screenshot of it is not blank
// (tests/report/html/check_screenshot.py decodes the PNG). Skipped, with the
// reason, where Chromium, python3 or Chart.js is missing: scripts/install-deps
// --test installs them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tidepool/replay.hpp"
#include "tidepool/report.hpp"
#include "tidepool/units.hpp"

namespace tidepool::report {
namespace {

namespace fs = std::filesystem;

/// The first of `names` found in /usr/bin or /bin, or empty.
std::string find_program(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    for (const char* dir : {"/usr/bin/", "/bin/", "/usr/local/bin/"}) {
      const std::string path = dir + name;
      if (access(path.c_str(), X_OK) == 0) return path;
    }
  }
  return {};
}

struct Output {
  int status = -1;
  std::string text;
};

/// Runs a shell command line, capturing its stdout.
Output run(const std::string& command) {
  Output out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.text.append(buffer, n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

/// Two traces so that the page has two charts: a ramp up and down, and a
/// timed trace with a recorded row.
std::vector<trace::TraceReplay> sample_replays() {
  std::vector<trace::TraceReplay> replays;
  for (int variant = 0; variant < 2; ++variant) {
    trace::Trace trace;
    trace.name = variant == 0 ? "ramp" : "timed";
    trace.format = "test";
    std::vector<std::uint32_t> blocks;
    std::int64_t time = 0;
    const auto at = [&] { return variant == 0 ? std::int64_t{-1} : (time += 7); };
    if (variant == 1) {
      trace.has_segments = true;
      trace.events.push_back({trace::Op::segment_alloc, 0, 96 * MiB, kDefaultStream, at()});
    }
    for (std::uint32_t i = 0; i < 200; ++i) {
      const std::uint64_t bytes = (i % 7 + 1) * 256 * KiB;
      trace.events.push_back({trace::Op::alloc, trace.num_blocks, bytes, kDefaultStream, at()});
      blocks.push_back(trace.num_blocks++);
    }
    for (std::uint32_t i = 0; i < 200; ++i) {
      const std::uint64_t bytes = (blocks[i] % 7 + 1) * 256 * KiB;
      trace.events.push_back({trace::Op::free, blocks[i], bytes, kDefaultStream, at()});
    }
    if (variant == 1) trace.events.push_back({trace::Op::segment_free, 0, 96 * MiB, kDefaultStream, at()});
    trace::ReplayOptions options;
    options.capacity_bytes = 1 * GiB;
    const std::vector<Mode> modes = {Mode::preallocate, Mode::growth, Mode::platform};
    auto replay = trace::replay(trace, modes, options);
    EXPECT_TRUE(replay) << replay.error().message();
    if (replay) replays.push_back(std::move(*replay));
  }
  return replays;
}

TEST(ReplayHtmlInChromium, LoadsWithoutErrorsDrawsItsChartsAndLooksDrawn) {
  const std::string chromium = find_program({"chromium", "chromium-browser", "google-chrome"});
  if (chromium.empty()) GTEST_SKIP() << "Chromium is not installed: scripts/install-deps --test installs it";
  const std::vector<trace::TraceReplay> replays = sample_replays();
  ASSERT_EQ(replays.size(), 2u);
  auto page = replay_html(replays);
  if (!page && page.error().code() == Errc::unsupported) GTEST_SKIP() << page.error().message();
  ASSERT_TRUE(page) << page.error().message();

  char dir_template[] = "/tmp/tidepool-html-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const fs::path dir = dir_template;
  const fs::path html = dir / "report.html";
  ASSERT_TRUE(write_file(html.string(), *page));

  // As root Chromium needs --no-sandbox; a private profile keeps runs apart.
  const std::string browser = "timeout 120 " + chromium + " --headless --no-sandbox --disable-gpu " +
                              "--disable-dev-shm-usage --no-first-run --user-data-dir=" +
                              (dir / "profile").string() + " ";
  const Output dom = run(browser + "--dump-dom file://" + html.string() + " 2>/dev/null");
  ASSERT_EQ(dom.status, 0) << "chromium --dump-dom failed";
  // Two charts per trace: bytes over time, reserved / live over time.
  EXPECT_NE(dom.text.find("data-charts-expected=\"4\""), std::string::npos) << "the page script did not run";
  EXPECT_NE(dom.text.find("data-charts-rendered=\"4\""), std::string::npos) << "Chart.js did not draw every chart";
  EXPECT_EQ(dom.text.find("data-script-errors=\""), std::string::npos) << "the page had script errors";

  const fs::path png = dir / "report.png";
  const Output shot = run(browser + "--hide-scrollbars --window-size=1280,1600 --screenshot=" + png.string() +
                          " file://" + html.string() + " >/dev/null 2>&1");
  ASSERT_EQ(shot.status, 0) << "chromium --screenshot failed";
  ASSERT_TRUE(fs::exists(png));
  const std::string python = find_program({"python3"});
  if (python.empty()) GTEST_SKIP() << "python3 is missing: the screenshot was taken but not checked";
  const Output check = run(python + " " + TIDEPOOL_TEST_DATA + "/../report/html/check_screenshot.py " +
                           png.string() + " 32 3");
  EXPECT_EQ(check.status, 0) << "the screenshot looks blank: " << check.text;

  fs::remove_all(dir);
}

}  // namespace
}  // namespace tidepool::report
