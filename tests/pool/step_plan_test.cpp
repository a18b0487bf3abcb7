// StepPlan (pool/step_plan.hpp): what it takes for a step, how it follows
// one, and that the blocks it hands out never overlap whatever the program
// does; and the expandable pool served from it (no device call once the plan
// is laid, data intact, a second free caught).
#include "pool/step_plan.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "pool/expandable_state.hpp"
#include "pool/pool_test_support.hpp"

namespace tidepool::test {
namespace {

using pool::StepPlan;
using Phase = StepPlan::Phase;

// A program step: each block's size and how many requests after its own it
// is freed (1: before the next request).
struct Block {
  std::size_t bytes;
  std::uint32_t freed_after;
};

std::vector<Block> random_step(std::mt19937_64& rng, std::uint32_t requests) {
  std::vector<Block> step;
  std::uniform_int_distribution<std::uint32_t> size(1, 64);
  for (std::uint32_t i = 0; i < requests; ++i) {
    const std::uint32_t left = requests - i;  // freed within the step
    step.push_back({std::size_t{size(rng)} * MiB, std::uniform_int_distribution<std::uint32_t>(1, left)(rng)});
  }
  return step;
}

// Drives a StepPlan as the pool does: each request first offered to the plan
// (take), else "the arena" serves it at a fresh fake address and it is logged.
// Tracks the slab blocks live, and checks that none overlaps another.
class Driver {
 public:
  explicit Driver(StepPlan& plan) : plan_(plan) {}

  /// One step: requests in order, frees when due. `calls`: whether the arena
  /// makes device calls this step.
  /// `only_at`: the one request that makes a call, if calls.
  /// `before`: called before request i's frees and request, with i.
  void run(const std::vector<Block>& step, bool calls, Stream stream = kDefaultStream,
           std::size_t only_at = SIZE_MAX, const std::function<void(std::uint32_t)>& before = {}) {
    std::vector<std::pair<std::uint32_t, std::size_t>> due;  // (request it is freed before, block)
    for (std::uint32_t i = 0; i <= step.size(); ++i) {
      if (before) before(i);
      for (auto it = due.begin(); it != due.end();) {
        if (it->first == i) {
          release(it->second, stream);
          it = due.erase(it);
        } else {
          ++it;
        }
      }
      if (i == step.size()) break;
      due.emplace_back(i + step[i].freed_after,
                       request(step[i].bytes, stream, calls && (only_at == SIZE_MAX || only_at == i)));
    }
  }

  /// A request: the index of the block handed out.
  std::size_t request(std::size_t bytes, Stream stream, bool calls = false) {
    if (plan_.wants_slab(bytes, stream)) {
      slab_ = plan_.slab_bytes();
      plan_.opened();
    }
    if (calls) ++device_calls_;
    const std::optional<std::uint64_t> offset = plan_.take(bytes, stream);
    blocks_.push_back({offset.value_or(0), bytes, offset.has_value(), true});
    if (offset) {
      ++from_slab_;
      EXPECT_LE(*offset + bytes, slab_);
      for (const Live& other : blocks_) {
        if (&other == &blocks_.back() || !other.live || !other.in_slab) continue;
        const bool apart = *offset + bytes <= other.offset || other.offset + other.bytes <= *offset;
        EXPECT_TRUE(apart) << "a slab block at " << *offset << " overlaps one live at " << other.offset;
        if (!apart) ++overlaps_;
      }
    } else {
      plan_.record_alloc(fake(blocks_.size() - 1), bytes, stream, device_calls_);
    }
    return blocks_.size() - 1;
  }

  void release(std::size_t block, Stream stream) {
    Live& live = blocks_[block];
    ASSERT_TRUE(live.live);
    live.live = false;
    if (live.in_slab) {
      Expected<std::size_t> freed = plan_.give_back(live.offset, stream, 0x1000 + live.offset);
      ASSERT_TRUE(freed) << freed.error().message();
      EXPECT_EQ(*freed, live.bytes);
    } else {
      plan_.record_free(fake(block), stream);
    }
  }

  std::size_t from_slab() const { return from_slab_; }
  std::size_t overlaps() const { return overlaps_; }

 private:
  static const void* fake(std::size_t block) { return reinterpret_cast<const void*>(0x10000 + block * 0x100); }
  struct Live {
    std::uint64_t offset;
    std::size_t bytes;
    bool in_slab, live;
  };
  StepPlan& plan_;
  std::vector<Live> blocks_;
  std::uint64_t slab_ = 0;
  std::int64_t device_calls_ = 0;
  std::size_t from_slab_ = 0, overlaps_ = 0;
};

// Runs `step` (the pool making device calls) until the plan is found: two
// copies to learn it, a third where the repeat's first anchor came late.
void arm(Driver& driver, const StepPlan& plan, const std::vector<Block>& step) {
  for (int run = 0; run < 4 && plan.phase() == Phase::learning; ++run) driver.run(step, true);
}

// arm(), then once more: the next step opens the slab; then the plan
// follows, at the step's start.
void learn(Driver& driver, const StepPlan& plan, const std::vector<Block>& step) {
  arm(driver, plan, step);
  ASSERT_NE(plan.phase(), Phase::learning);
  driver.run(step, false);
  ASSERT_EQ(plan.phase(), Phase::following);
}

TEST(StepPlan, LearnsARepeatingStepAndServesItFromItsPlan) {
  std::mt19937_64 rng(1);
  const std::vector<Block> step = random_step(rng, 200);
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  EXPECT_EQ(plan.phase(), Phase::learning);
  driver.run(step, true);  // the second copy confirms the step
  EXPECT_EQ(plan.phase(), Phase::armed);
  std::size_t peak = 0, live = 0;  // the step's peak of live bytes, a lower bound of the plan
  std::vector<std::pair<std::uint32_t, std::size_t>> frees;
  for (std::uint32_t i = 0; i < step.size(); ++i) frees.emplace_back(i + step[i].freed_after, step[i].bytes);
  for (std::uint32_t i = 0; i < step.size(); ++i) {
    for (const auto& [at, bytes] : frees) live -= at == i ? bytes : 0;
    live += step[i].bytes;
    peak = std::max(peak, live);
  }
  EXPECT_GE(plan.slab_bytes(), peak);
  EXPECT_LE(plan.slab_bytes(), peak * 13 / 10);
  for (int i = 0; i < 5; ++i) driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_EQ(driver.from_slab(), 5 * step.size());  // every request of every step after the plan
  EXPECT_EQ(plan.served(), 5 * step.size());
}

// A pool quiet for more than kEagerRequests only logs; its next device call
// searches what was logged since. A step whose second copy makes one call,
// at its last request, is planned (a few requests into the third, where the
// repeat's first anchor puts the end of two whole copies), and followed from
// the fourth.
TEST(StepPlan, AStepFoundWhenTheCallComesLateIsFollowedFromTheNextStep) {
  std::mt19937_64 rng(5);
  const std::vector<Block> step = random_step(rng, 300);
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  driver.run(step, true, kDefaultStream, step.size() - 1);
  driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::armed);
  driver.run(step, false);
  driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_EQ(driver.from_slab(), 2 * step.size());
  // The call halfway through the second copy, and the next at the third's
  // end: that call's search finds the two copies ending early in the third
  // (their newer one holds the first call), plans them there and matches the
  // rest of the third, logged quietly, to the plan; the slab opens at the
  // fourth's start.
  StepPlan other;
  Driver again(other);
  again.run(step, true);
  again.run(step, true, kDefaultStream, step.size() / 2);
  again.run(step, false);
  EXPECT_EQ(other.phase(), Phase::learning);  // found, not yet searched
  again.run(step, true, kDefaultStream, step.size() - 1);
  EXPECT_EQ(other.phase(), Phase::armed);
  again.run(step, false);
  again.run(step, false);
  EXPECT_EQ(other.phase(), Phase::following);
  EXPECT_EQ(again.from_slab(), 2 * step.size());
  EXPECT_EQ(again.overlaps(), 0u);
}

// After a device call requests are searched as they come, so that a step
// whose newer copy ends soon after the call is planned before the next copy
// starts. A teardown (more large frees in a row than a step's end has
// between requests) ends that: a step ended, and the requests after it are
// only appended, to be searched at the next call. Here the second copy's
// call comes 20 requests before its end, so the two copies are found a few
// requests into the third (where the repeat's first anchor puts their end).
// With a teardown 10 requests before the second copy's end, those requests
// are appended and nothing is planned; the fourth copy's call finds the two
// copies and plans them, and the slab opens at the next start of the step.
TEST(StepPlan, ATeardownEndsTheSearchAsRequestsComeUntilTheNextCall) {
  std::mt19937_64 rng(7);
  const std::vector<Block> step = random_step(rng, 300);
  const auto three_copies = [&](StepPlan& plan, Driver& driver, bool teardown) {
    driver.run(step, true);
    driver.run(step, true, kDefaultStream, step.size() - 20, [&](std::uint32_t i) {
      if (teardown && i == step.size() - 10) plan.torn_down();
    });
    driver.run(step, false);
  };
  StepPlan control;
  Driver searched(control);
  three_copies(control, searched, false);
  EXPECT_EQ(control.phase(), Phase::armed);

  StepPlan plan;
  Driver driver(plan);
  three_copies(plan, driver, true);
  EXPECT_EQ(plan.phase(), Phase::learning);  // searched as they came, the third's first requests would plan it
  driver.run(step, true, kDefaultStream, 0);  // the fourth copy's first request calls
  EXPECT_NE(plan.phase(), Phase::learning);
  for (int i = 0; i < 3; ++i) driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_GE(driver.from_slab(), 2 * step.size());
  EXPECT_EQ(driver.overlaps(), 0u);
}

// A teardown ends a copy: what was logged since the last one, every block of
// it freed. The requests after it are compared with it one by one, not logged
// and searched, and a repeat that made a device call is planned at its last
// request. Here the second copy's one call comes at its 10th request, so the
// search as requests come ends long before the copy does (and no call comes
// after it): without the comparison nothing would be planned.
TEST(StepPlan, ARepeatAfterATeardownIsComparedWithTheCopyBeforeItAndPlannedAtItsEnd) {
  std::mt19937_64 rng(9);
  const std::vector<Block> step = random_step(rng, 200);  // each block freed within the step
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  plan.torn_down();
  std::string midway;
  driver.run(step, true, kDefaultStream, 10, [&](std::uint32_t i) {
    if (i == 100) midway = plan.describe();
  });
  EXPECT_NE(midway.find("comparing requests with the copy a teardown ended: 100 of 200 matched"), std::string::npos)
      << midway;
  EXPECT_EQ(plan.phase(), Phase::armed);
  driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_EQ(driver.from_slab(), step.size());
  EXPECT_EQ(driver.overlaps(), 0u);
}

// A repeat the pool served without a device call needs no plan: the next
// copy is compared in turn, and the first that makes a call is planned.
TEST(StepPlan, AQuietRepeatAfterATeardownIsNotPlannedButTheNextThatCallsIs) {
  std::mt19937_64 rng(10);
  const std::vector<Block> step = random_step(rng, 100);
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  plan.torn_down();
  for (int i = 0; i < 2; ++i) {
    driver.run(step, false);
    plan.torn_down();
  }
  EXPECT_EQ(plan.phase(), Phase::learning);
  EXPECT_EQ(plan.plans(), 0u);
  driver.run(step, true, kDefaultStream, 5);
  EXPECT_EQ(plan.phase(), Phase::armed);
  EXPECT_EQ(plan.plans(), 1u);
}

// The first request that differs from the copy ends the comparison; the log
// starts again at it, and the search finds the changed step as it would any.
// A copy on two streams is not compared with, and one with a block still
// live at the teardown is no step: its repeat is compared, not planned.
TEST(StepPlan, ARequestThatDiffersEndsTheComparisonAndOnlyAWholeCopyIsComparedWith) {
  std::mt19937_64 rng(11);
  const std::vector<Block> step = random_step(rng, 100);
  std::vector<Block> changed = step;
  changed[50].bytes += 1 * MiB;
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  plan.torn_down();
  std::string before_change, after_change;
  driver.run(changed, true, kDefaultStream, SIZE_MAX, [&](std::uint32_t i) {
    if (i == 50) before_change = plan.describe();
    if (i == 51) after_change = plan.describe();
  });
  EXPECT_NE(before_change.find("50 of 100 matched"), std::string::npos) << before_change;
  EXPECT_EQ(after_change.find("comparing"), std::string::npos) << after_change;
  EXPECT_EQ(plan.phase(), Phase::learning);
  for (int i = 0; i < 3 && plan.phase() == Phase::learning; ++i) driver.run(changed, true);
  EXPECT_NE(plan.phase(), Phase::learning);

  for (const bool two_streams : {false, true}) {
    StepPlan other;
    Driver again(other);
    again.run(step, true);
    if (two_streams) {
      again.run(step, true, 2);
    } else {
      (void)again.request(4 * MiB, kDefaultStream, true);  // lives on
    }
    other.torn_down();
    std::string midway;
    again.run(step, true, kDefaultStream, SIZE_MAX, [&](std::uint32_t i) {
      if (i == 10) midway = other.describe();
    });
    if (two_streams) {
      EXPECT_EQ(midway.find("comparing"), std::string::npos) << midway;
    } else {
      EXPECT_NE(midway.find("comparing"), std::string::npos) << midway;
      (void)again.request(4 * MiB, kDefaultStream, true);  // the repeat is whole
    }
    EXPECT_EQ(other.phase(), Phase::learning);
    EXPECT_EQ(other.plans(), 0u);
  }
}

// Between eager searches requests and frees are only appended; frees of
// blocks the log never saw (made before it started) can pile up past the
// bound on what is kept, and are logged then, in order, with what came
// before them: the late call still finds the two copies around them.
TEST(StepPlan, FreesPilingUpWhileQuietAreLoggedInOrder) {
  std::mt19937_64 rng(5);
  const std::vector<Block> step = random_step(rng, 300);
  StepPlan plan;
  Driver driver(plan);
  driver.run(step, true);
  driver.run(step, true, kDefaultStream, step.size() - 1, [&](std::uint32_t i) {
    if (i != step.size() / 2) return;
    for (std::uintptr_t k = 0; k < 40'000; ++k) {  // more than twice the events kept
      plan.record_free(reinterpret_cast<const void*>(0x7f00'0000'0000 + k * 0x1000), kDefaultStream);
    }
  });
  driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::armed);
  driver.run(step, false);
  driver.run(step, false);
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_EQ(driver.from_slab(), 2 * step.size());
}

TEST(StepPlan, AStepRepeatedWithoutADeviceCallIsNotPlanned) {
  std::mt19937_64 rng(2);
  const std::vector<Block> step = random_step(rng, 100);
  StepPlan plan;
  Driver driver(plan);
  for (int i = 0; i < 6; ++i) driver.run(step, i == 0);
  EXPECT_EQ(plan.phase(), Phase::learning);
  EXPECT_EQ(plan.plans(), 0u);
}

// Layers: each allocates the same sizes, and one block of each lives until
// the end of the step (saved for the backward pass). A layer repeats, but it
// is no step: the step (all layers, then the frees) is what gets planned.
TEST(StepPlan, APhaseWhoseBlocksLiveOnIsNoStep) {
  StepPlan plan;
  Driver driver(plan);
  const auto step = [&](bool calls) {
    std::vector<std::size_t> saved;
    for (int layer = 0; layer < 12; ++layer) {
      saved.push_back(driver.request(8 * MiB, kDefaultStream, calls));
      const std::size_t temporary = driver.request(24 * MiB, kDefaultStream, calls);
      driver.release(temporary, kDefaultStream);
    }
    const std::size_t loss = driver.request(2 * MiB, kDefaultStream, calls);
    for (std::size_t block : saved) driver.release(block, kDefaultStream);
    driver.release(loss, kDefaultStream);
  };
  step(true);
  step(true);
  ASSERT_EQ(plan.phase(), Phase::armed);
  EXPECT_EQ(plan.slab_bytes(), (12 * 8 + 24) * MiB);  // the saved blocks side by side, one temporary
  step(false);
  step(false);
  EXPECT_EQ(driver.from_slab(), 2 * 25u);
}

TEST(StepPlan, AStepOnTwoStreamsIsNotPlanned) {
  std::mt19937_64 rng(3);
  const std::vector<Block> step = random_step(rng, 50);
  StepPlan plan;
  Driver driver(plan);
  for (int i = 0; i < 3; ++i) {
    driver.run(step, true, 1);
    driver.run(step, true, 2);
  }
  EXPECT_EQ(plan.phase(), Phase::learning);
}

TEST(StepPlan, AMissLosesThePlaceUntilTheStepStartsAgain) {
  std::mt19937_64 rng(4);
  const std::vector<Block> step = random_step(rng, 40);
  StepPlan plan;
  Driver driver(plan);
  learn(driver, plan, step);
  const std::size_t before = driver.from_slab();
  std::vector<Block> changed = step;
  changed[10].bytes += 1 * MiB;  // a request the plan does not expect
  driver.run(changed, false);
  EXPECT_EQ(driver.from_slab() - before, 10u);  // those before the miss
  driver.run(step, false);  // found again at the step's start
  EXPECT_EQ(plan.phase(), Phase::following);
  EXPECT_EQ(driver.from_slab() - before, 10u + step.size());
  // A program that changed for good: the plan is given up.
  std::vector<Block> other = random_step(rng, 40);
  for (int i = 0; i < 6; ++i) driver.run(other, false);
  EXPECT_EQ(plan.phase(), Phase::retiring);
}

// The safety property: a program that strays from its plan, freeing late,
// freeing early, skipping and adding requests, never gets two live blocks that
// overlap, over many random programs.
TEST(StepPlan, BlocksHandedOutNeverOverlapWhateverTheProgramDoes) {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::vector<Block> step = random_step(rng, 30 + static_cast<std::uint32_t>(seed % 50));
    StepPlan plan;
    Driver driver(plan);
    learn(driver, plan, step);  // the plan's slab open, at the step's start
    for (int round = 0; round < 6; ++round) {
      std::vector<Block> strayed = step;
      for (Block& block : strayed) {
        const auto dice = rng() % 10;
        if (dice == 0) block.freed_after += static_cast<std::uint32_t>(rng() % 20);  // late, maybe into the next step
        if (dice == 1) block.freed_after = 1;                                      // early
      }
      if (rng() % 3 == 0) strayed.erase(strayed.begin() + static_cast<std::ptrdiff_t>(rng() % strayed.size()));
      // Frees past the step's end happen at its end here (Driver::run), so
      // "late" also means "held across the step's start".
      driver.run(strayed, false);
      driver.run(step, false);
    }
    EXPECT_EQ(driver.overlaps(), 0u);
    EXPECT_GT(driver.from_slab(), 0u);
  }
}

// Blocks that live on past the next step's start: held over the start by a
// step that frees them late, so the next copy of the step must not get their
// slots while they live.
TEST(StepPlan, ABlockStillLiveWhenItsSlotComesAgainIsNotOverlapped) {
  StepPlan plan;
  Driver driver(plan);
  std::vector<Block> step;
  for (std::size_t i = 0; i < 20; ++i) step.push_back({(4 + i) * MiB, 1});
  learn(driver, plan, step);
  // The step again, its first block kept past the step's end.
  const std::size_t held = driver.request(step[0].bytes, kDefaultStream);
  const std::size_t slab_before = driver.from_slab();
  for (std::size_t i = 1; i < step.size(); ++i) driver.release(driver.request(step[i].bytes, kDefaultStream), kDefaultStream);
  driver.run(step, false);  // the first block's slot comes while `held` lives there
  EXPECT_EQ(driver.overlaps(), 0u);
  EXPECT_LT(driver.from_slab() - slab_before, 2 * step.size() - 1);  // some went to the arena
  driver.release(held, kDefaultStream);
  const std::size_t after = driver.from_slab();
  driver.run(step, false);
  driver.run(step, false);
  EXPECT_EQ(driver.from_slab() - after, 2 * step.size());  // and the slab serves all once it is freed
}

TEST(StepPlan, ASecondFreeOrAPointerIntoABlockIsAClearError) {
  StepPlan plan;
  Driver driver(plan);
  std::vector<Block> step = {{4 * MiB, 2}, {8 * MiB, 1}};
  for (std::size_t i = 2; i < 20; ++i) step.push_back({(1 + i) * MiB, 1});
  learn(driver, plan, step);
  const std::optional<std::uint64_t> first = plan.take(4 * MiB, kDefaultStream);
  ASSERT_TRUE(first);
  Expected<std::size_t> inside = plan.give_back(*first + 256, kDefaultStream, 0x1100);
  ASSERT_FALSE(inside);
  EXPECT_EQ(inside.error().code(), Errc::invalid_pointer);
  EXPECT_NE(inside.error().message().find("no block starts"), std::string::npos);
  ASSERT_TRUE(plan.give_back(*first, kDefaultStream, 0x1000));
  Expected<std::size_t> again = plan.give_back(*first, kDefaultStream, 0x1000);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), Errc::double_free);
  EXPECT_NE(again.error().message().find("freed twice"), std::string::npos);
  // A free on another stream is waited for before the slab serves again.
  const std::optional<std::uint64_t> second = plan.take(8 * MiB, kDefaultStream);
  ASSERT_TRUE(second);
  ASSERT_TRUE(plan.give_back(*second, 7, 0x2000));
  EXPECT_EQ(plan.pending_streams(), std::vector<Stream>{7});
}

// Whether this process has a thread named `name` (/proc/self/task/*/comm).
bool has_thread_named(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) return true;
  }
  return false;
}

// The placement is made on the process's placer thread and taken at the
// step's start (slab_bytes waits for it); a plan dropped or destroyed while
// it is being placed stops its placement (ASan and TSan run this).
TEST(StepPlan, ThePlacementIsTakenAtTheStepsStartAndMayBeDroppedWhileMade) {
  std::mt19937_64 rng(5);
  const std::vector<Block> step = random_step(rng, 3000);
  std::uint64_t footprint = 0;
  for (int way = 0; way < 3; ++way) {
    StepPlan plan;
    Driver driver(plan);
    arm(driver, plan, step);
    ASSERT_EQ(plan.phase(), Phase::armed);
    EXPECT_NE(plan.describe().find("(being placed)"), std::string::npos) << plan.describe();
    EXPECT_TRUE(has_thread_named("tidepool-plan"));
    if (way == 0) {
      footprint = plan.slab_bytes();
      EXPECT_GT(footprint, 0u);
      EXPECT_EQ(plan.describe().find("(being placed)"), std::string::npos) << plan.describe();
      driver.run(step, false);
      EXPECT_EQ(plan.phase(), Phase::following);
      EXPECT_EQ(driver.from_slab(), step.size());
    } else if (way == 1) {
      plan.drop();
      EXPECT_EQ(plan.phase(), Phase::learning);
      EXPECT_EQ(plan.slab_bytes(), 0u);
    }  // way 2: destroyed while armed
  }
  // The same step is placed alike, however fast the thread was.
  StepPlan again;
  Driver driver(again);
  arm(driver, again, step);
  EXPECT_EQ(again.slab_bytes(), footprint);
}

// Which sanitizer this build runs under: GCC defines __SANITIZE_*__, clang
// answers __has_feature.
#if defined(__has_feature)
#define STEP_PLAN_TEST_HAS(feature) __has_feature(feature)
#else
#define STEP_PLAN_TEST_HAS(feature) 0
#endif

// TSan does not support a child of a multi-threaded process starting threads
// (it dies): under it the child only places its parent's step.
#if defined(__SANITIZE_THREAD__) || STEP_PLAN_TEST_HAS(thread_sanitizer)
constexpr bool kUnderTsan = true;
#else
constexpr bool kUnderTsan = false;
#endif

// ASan's allocator (clang 14's compiler-rt) takes no lock around fork: a
// child forked while another thread is inside it (the placer, placing) may
// wait forever on a lock that thread held. glibc's malloc, which the pool
// runs on outside ASan, is locked around fork by glibc itself.
#if defined(__SANITIZE_ADDRESS__) || STEP_PLAN_TEST_HAS(address_sanitizer)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif

// A child forked while its parent's thread places the step has no such
// thread: it places the step itself, alike, and starts a placer of its own
// for the next plan.
TEST(StepPlan, AChildForkedWhileTheStepIsPlacedPlacesItItself) {
  if (kUnderAsan) GTEST_SKIP() << "ASan's allocator is not fork-safe: the child can hang on its lock";
  std::mt19937_64 rng(6);
  const std::vector<Block> step = random_step(rng, 6000);
  StepPlan plan;
  Driver driver(plan);
  arm(driver, plan, step);
  ASSERT_EQ(plan.phase(), Phase::armed);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::uint64_t bytes = plan.slab_bytes();
    bool placed_alike = true;
    if (!kUnderTsan) {
      StepPlan own;
      Driver driver_of_own(own);
      arm(driver_of_own, own, step);
      placed_alike = own.phase() == Phase::armed && own.slab_bytes() == bytes;
    }
    _exit(write(fds[1], &bytes, sizeof bytes) == sizeof bytes && placed_alike ? 0 : 1);
  }
  close(fds[1]);
  std::uint64_t childs = 0;
  EXPECT_EQ(read(fds[0], &childs, sizeof childs), static_cast<ssize_t>(sizeof childs));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::uint64_t parents = plan.slab_bytes();
  EXPECT_GT(parents, 0u);
  EXPECT_EQ(childs, parents);
}

// --- the pool served from a plan ---------------------------------------------

std::unique_ptr<ExpandablePool> expandable(std::shared_ptr<Device> device) {
  auto pool = ExpandablePool::create(std::move(device));
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

// One step through `pool`: each block allocated in turn, a seed written into
// it, checked and freed when the step says.
void run_step(Allocator& pool, const std::vector<Block>& step, std::uint64_t& seed) {
  std::vector<std::pair<std::uint32_t, std::pair<void*, std::uint64_t>>> due;
  for (std::uint32_t i = 0; i <= step.size(); ++i) {
    for (auto it = due.begin(); it != due.end();) {
      if (it->first != i) {
        ++it;
        continue;
      }
      auto [ptr, block_seed] = it->second;
      EXPECT_EQ(*static_cast<std::uint64_t*>(ptr), block_seed);
      ASSERT_TRUE(pool.deallocate(ptr));
      it = due.erase(it);
    }
    if (i == step.size()) break;
    Expected<void*> ptr = pool.allocate(step[i].bytes);
    ASSERT_TRUE(ptr) << ptr.error().message();
    *static_cast<std::uint64_t*>(*ptr) = ++seed;
    due.push_back({i + step[i].freed_after, {*ptr, seed}});
  }
}

// A step whose sizes change from block to block, so that best fit leaves
// holes that later steps fill differently, on a device small enough that the
// pool steals: once the plan is laid, a step makes no device call, and every
// block keeps what was written to it.
TEST(ExpandablePoolStepPlan, ARepeatingStepIsServedFromItsPlanWithNoDeviceCall) {
  auto pool = expandable(host_device(2 * GiB));
  const auto device_calls = [&] {
    const Stats stats = pool->stats();
    return stats.num_device_allocs + stats.num_device_frees + stats.num_maps + stats.num_unmaps;
  };
  std::mt19937_64 rng(11);
  const std::vector<Block> step = random_step(rng, 120);
  std::uint64_t seed = 0;
  const auto run = [&] { run_step(*pool, step, seed); };
  for (int i = 0; i < 3; ++i) run();
  const std::string dump = pool->dump();
  EXPECT_NE(dump.find("step plan: following"), std::string::npos) << dump;
  const std::int64_t calls = device_calls();
  for (int i = 0; i < 5; ++i) run();
  EXPECT_EQ(device_calls(), calls);
  // A second free of a slab block is caught, and trim gives the slab back
  // once nothing lives in it.
  Expected<void*> ptr = pool->allocate(step[0].bytes);
  ASSERT_TRUE(ptr);
  ASSERT_TRUE(pool->deallocate(*ptr));
  Status again = pool->deallocate(*ptr);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), Errc::double_free);
  pool->trim();
  EXPECT_EQ(pool->stats().bytes_mapped, 0);
  EXPECT_NE(pool->dump().find("step plan: learning"), std::string::npos);
}

// The pool tells its plan of a teardown (more large frees in a row than it
// holds back): the same requests after it are compared with those before it.
TEST(ExpandablePoolStepPlan, ARepeatAfterATeardownIsComparedWithTheCopyBeforeIt) {
  auto pool = expandable(host_device(512 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 24; ++i) blocks.push_back(must_allocate(*pool, (4 + i % 3) * MiB));
  for (void* block : blocks) ASSERT_TRUE(pool->deallocate(block));
  for (int i = 0; i < 10; ++i) blocks[i] = must_allocate(*pool, (4 + i % 3) * MiB);
  EXPECT_NE(pool->dump().find("comparing requests with the copy a teardown ended: 10 of 24 matched"),
            std::string::npos)
      << pool->dump();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool->deallocate(blocks[i]));
}

// A program that leaves its step for small blocks that need the slab's
// memory: the plan is retired (the pool is short), its empty slab freed, and
// the blocks backed by the slab's granules, with no OOM (the slab never
// causes one the arena alone would not have had).
TEST(ExpandablePoolStepPlan, BlocksThatNeedTheSlabsMemoryGetIt) {
  auto pool = expandable(host_device(2 * GiB));
  std::mt19937_64 rng(11);
  const std::vector<Block> step = random_step(rng, 120);
  std::uint64_t seed = 0;
  const auto run = [&] { run_step(*pool, step, seed); };
  for (int i = 0; i < 4; ++i) run();
  ASSERT_NE(pool->dump().find("step plan: following"), std::string::npos) << pool->dump();
  // 512 KiB blocks (small: packed four to a granule) filling the device.
  std::vector<void*> small;
  for (std::size_t i = 0; i < 2 * GiB / (512 * KiB); ++i) {
    Expected<void*> ptr = pool->allocate(512 * KiB);
    ASSERT_TRUE(ptr) << "block " << i << ": " << ptr.error().message() << "\n" << pool->dump();
    *static_cast<std::size_t*>(*ptr) = i;
    small.push_back(*ptr);
  }
  EXPECT_NE(pool->dump().find("step plan: learning"), std::string::npos) << pool->dump();
  for (std::size_t i = 0; i < small.size(); ++i) {
    EXPECT_EQ(*static_cast<std::size_t*>(small[i]), i);
    ASSERT_TRUE(pool->deallocate(small[i]));
  }
}

}  // namespace
}  // namespace tidepool::test
