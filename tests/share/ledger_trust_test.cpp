// The ledger trusts no one (issue 14): a segment another user made under
// our name is refused naming its owner, a segment truncated under a live
// process is an error and never a SIGBUS, and a child forked after the
// allocator was made never touches its parent's entry.
#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>

#include "share/ledger_test_support.hpp"
#include "share/segment.hpp"

namespace tidepool::test {
namespace {

constexpr std::size_t kCapacity = 64 * MiB;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A uid other than ours for the squatter: 'nobody' when it exists.
uid_t spare_uid() {
  if (const passwd* nobody = getpwnam("nobody")) return nobody->pw_uid;
  return 65534;
}

// Runs `body` in a child process under `uid` (root only); its exit status.
int run_as(uid_t uid, const std::function<int()>& body) {
  Child child([&] {
    if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) return 90;
    return body();
  });
  return child.wait(10s);
}

TEST(LedgerTrust, TheSegmentNameIsPerUserAndPerGroup) {
  const std::string user = "/tidepool-u" + std::to_string(geteuid()) + "-";
  const std::string group = "/tidepool-g" + std::to_string(getegid()) + "-";
  EXPECT_EQ(ledger_segment_name("host:gpu0"), user + "host_gpu0");
  EXPECT_EQ(ledger_segment_name("host:gpu0", 0660), group + "host_gpu0");
}

TEST(LedgerTrust, ASegmentSquattedByAnotherUserIsRefusedNamingTheOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid (setresuid)";
  UniqueSegment segment("squat");
  const uid_t squatter = spare_uid();
  // The squatter makes the victim's segment first, world-writable, as a
  // valid-looking ledger would be (then it could pin the budget or truncate it).
  ASSERT_EQ(run_as(squatter, [&] {
              const int fd = shm_open(segment.name().c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
              if (fd < 0) return 1;
              const int rc = fchmod(fd, 0666) == 0 && ftruncate(fd, share::kSegmentBytes) == 0 ? 0 : 2;
              close(fd);
              return rc;
            }),
            0);
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::corrupt_data);
  const std::string& message = device.error().message();
  EXPECT_TRUE(contains(message, "mode 0666")) << message;
  EXPECT_TRUE(contains(message, "uid " + std::to_string(squatter))) << message;
  EXPECT_TRUE(contains(message, "rm /dev/shm" + segment.name())) << message;

  // Mode 0600 but owned by the squatter: refused as someone else's.
  shm_unlink(segment.name().c_str());
  ASSERT_EQ(run_as(squatter, [&] {
              LedgerSegmentOptions options;
              options.name = segment.name();
              options.device_id = "host:ledger-test";
              options.device_total_bytes = kCapacity;
              return Ledger::open_or_create(options) ? 0 : 3;
            }),
            0);
  auto joined = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(joined);
  EXPECT_EQ(joined.error().code(), Errc::corrupt_data);
  EXPECT_TRUE(contains(joined.error().message(), "belongs to uid " + std::to_string(squatter)))
      << joined.error().message();
  // So does the reader (tidepool ledger).
  auto read = Ledger::open_existing(segment.name());
  ASSERT_FALSE(read);
  EXPECT_TRUE(contains(read.error().message(), "belongs to uid " + std::to_string(squatter)));
}

TEST(LedgerTrust, AnExistingSegmentOfAnotherModeIsRefused) {
  UniqueSegment segment("mode0644");
  {
    auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
    ASSERT_TRUE(device) << device.error().message();
  }
  ASSERT_EQ(chmod(("/dev/shm" + segment.name()).c_str(), 0644), 0);
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(device);
  EXPECT_TRUE(contains(device.error().message(), "mode 0644")) << device.error().message();
  // 0660 is joined only when the group mode is asked for.
  ASSERT_EQ(chmod(("/dev/shm" + segment.name()).c_str(), 0660), 0);
  auto user = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(user);
  EXPECT_TRUE(contains(user.error().message(), "TIDEPOOL_LEDGER_MODE=group")) << user.error().message();
  LedgerOptions group = ledger_options(segment.name());
  group.mode = 0660;
  auto joined = LedgerDevice::create(make_host(kCapacity), group);
  EXPECT_TRUE(joined) << joined.error().message();
}

TEST(LedgerTrust, ASegmentTruncatedUnderALiveProcessIsAnErrorNotASigbus) {
  UniqueSegment segment("truncated");
  // In a child: before the fix, the first call after the truncation died of SIGBUS.
  Child child([&]() -> int {
    auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
    if (!device) return 10;
    auto block = (*device)->allocate(4 * MiB);
    if (!block) return 11;
    const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
    if (fd < 0 || ftruncate(fd, 0) != 0) return 12;
    close(fd);
    auto refused = (*device)->allocate(1 * MiB);
    if (refused || refused.error().code() != Errc::corrupt_data) return 13;
    if (!contains(refused.error().message(), "shrank to 0 bytes")) return 14;
    (void)(*device)->mem_info();
    if (!(*device)->free(*block, 4 * MiB)) return 15;  // the device's memory still goes back
    if ((*device)->account().trim_requested()) return 16;
    auto snapshot = (*device)->account().ledger().snapshot();
    if (snapshot) return 17;
    device->reset();  // the destructor leaves the shrunk segment alone
    return 0;
  });
  EXPECT_EQ(child.wait(20s), 0) << "-2: killed by a signal (SIGBUS)";
}

TEST(LedgerTrust, AForkedChildNeverTouchesItsParentsEntry) {
  UniqueSegment segment("fork");
  Pipe to_child;
  Pipe from_child;
  // The parent registers, allocates, forks the child, and exits; a third
  // process (this test) then takes the freed slot; the child frees and is
  // destroyed. Before the fix the child's free and destructor lowered and
  // cleared the third process's entry.
  Child parent([&]() -> int {
    auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
    if (!device) return 20;
    auto block = (*device)->allocate(4 * MiB);
    if (!block) return 21;
    std::fflush(nullptr);
    const pid_t child = fork();
    if (child == 0) {
      int status = 0;
      if (!to_child.read_line(20s)) status = 30;
      auto refused = (*device)->allocate(1 * MiB);
      if (status == 0 && (refused || refused.error().code() != Errc::unsupported ||
                          !contains(refused.error().message(), "forked")))
        status = 31;
      if (status == 0 && !(*device)->free(*block, 4 * MiB)) status = 32;
      device->reset();
      from_child.write_line("done " + std::to_string(status));
      _exit(status);
    }
    from_child.write_line("child " + std::to_string(child));
    _exit(0);  // no destructor: the entry stays until reclaimed
  });
  auto child_line = from_child.read_line(10s);
  ASSERT_TRUE(child_line);
  ASSERT_EQ(parent.wait(10s), 0);

  auto third = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_TRUE(third) << third.error().message();
  auto held = (*third)->allocate(8 * MiB);
  ASSERT_TRUE(held);
  to_child.write_line("go");
  auto done = from_child.read_line(20s);
  ASSERT_TRUE(done);
  EXPECT_EQ(*done, "done 0");
  EXPECT_EQ((*third)->account().reserved_bytes(), 8 * MiB);
  auto snapshot = (*third)->account().ledger().snapshot();
  ASSERT_TRUE(snapshot);
  ASSERT_EQ(snapshot->entries.size(), 1u);
  EXPECT_EQ(snapshot->entries[0].pid, getpid());
  EXPECT_EQ(snapshot->entries[0].reserved_bytes, 8 * MiB);
  ASSERT_TRUE((*third)->free(*held, 8 * MiB));
  const int child_pid = std::stoi(child_line->substr(6));
  wait_until([&] { return kill(child_pid, 0) != 0; }, 5s);
}

}  // namespace
}  // namespace tidepool::test
