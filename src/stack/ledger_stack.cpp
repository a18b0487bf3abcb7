// The cross-process ledger in the stack: which ledger and which quota (the
// one resolution), the device decorator over the process's account, and the
// pool's trim as the process's answer to others.
#include "stack/ledger_stack.hpp"

#include <string>
#include <utility>

#include "tidepool/ledger.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

const LedgerDevice* find_ledger_device(const Device& device) {
  for (const Device* current = &device; current != nullptr;) {
    if (const auto* ledger = dynamic_cast<const LedgerDevice*>(current)) return ledger;
    const auto* adaptor = dynamic_cast<const DeviceAdaptor*>(current);
    current = adaptor != nullptr ? &adaptor->upstream() : nullptr;
  }
  return nullptr;
}

LedgerDevice* find_ledger_device(Device& device) {
  return const_cast<LedgerDevice*>(find_ledger_device(std::as_const(device)));
}

namespace {

/// Owns a pool whose trim answers the ledger's requests. The pool holds the
/// device chain, so the LedgerDevice (and its account) outlives this
/// object; the hooks are
/// cleared first in the destructor, so none runs on a destroyed pool. A
/// sleep or wake through it writes the process's asleep bytes into the
/// ledger at once.
class LedgerTrimmedAllocator final : public Allocator, public Sleepable {
 public:
  LedgerTrimmedAllocator(std::unique_ptr<Allocator> pool, LedgerAccount& ledger, bool answers_trim)
      : pool_(std::move(pool)), ledger_(ledger) {
    Allocator& pool_ref = *pool_;
    TrimHooks hooks;
    if (answers_trim) hooks.trim = [&pool_ref] { return pool_ref.trim(); };
    hooks.cached_free_bytes = [&pool_ref] {
      const Stats stats = pool_ref.stats();
      return stats.bytes_reserved > stats.bytes_in_use
                 ? static_cast<std::size_t>(stats.bytes_reserved - stats.bytes_in_use)
                 : std::size_t{0};
    };
    hooks.asleep_bytes = [&pool_ref] { return static_cast<std::size_t>(pool_ref.stats().bytes_asleep); };
    ledger_.set_trim_hooks(std::move(hooks));
  }
  ~LedgerTrimmedAllocator() override { ledger_.clear_trim_hooks(); }
  LedgerTrimmedAllocator(const LedgerTrimmedAllocator&) = delete;
  LedgerTrimmedAllocator& operator=(const LedgerTrimmedAllocator&) = delete;

  std::string_view name() const override { return pool_->name(); }
  Expected<void*> allocate(std::size_t bytes, Stream stream) override {
    // One relaxed load when no one asks: the cached path stays as fast.
    if (ledger_.trim_requested()) ledger_.answer_trim_requests();
    return pool_->allocate(bytes, stream);
  }
  Status deallocate(void* ptr, Stream stream) override { return pool_->deallocate(ptr, stream); }
  Stats stats() const override { return pool_->stats(); }
  std::size_t trim() override { return pool_->trim(); }
  std::string dump() const override { return pool_->dump(); }
  Device& device() const override { return pool_->device(); }
  Sleepable* sleepable() noexcept override { return pool_->sleepable() != nullptr ? this : nullptr; }

  Status tag_begin(std::string_view name) override { return pool_->sleepable()->tag_begin(name); }
  Status tag_end() override { return pool_->sleepable()->tag_end(); }
  Status sleep(std::string_view name, SleepKeep keep) override {
    Status slept = pool_->sleepable()->sleep(name, keep);
    ledger_.refresh_reports();
    return slept;
  }
  Status wake(std::string_view name) override {
    Status woken = pool_->sleepable()->wake(name);
    ledger_.refresh_reports();
    return woken;
  }
  std::vector<TagStats> tag_stats() const override { return pool_->sleepable()->tag_stats(); }

 private:
  std::unique_ptr<Allocator> pool_;
  LedgerAccount& ledger_;
};

}  // namespace

LedgerDeviceFacts LedgerDeviceFacts::of(const Device& device, int index) {
  return LedgerDeviceFacts{device.id(), device.mem_info().total_bytes, index};
}

Expected<LedgerOptions> resolve_ledger(const Config& config, const LedgerDeviceFacts& device) {
  LedgerOptions options;
  options.mode = config.ledger_mode.value;
  if (const std::string& name = config.ledger_name.value; !name.empty())
    options.segment_name = device.index == 0 ? name : name + "-" + std::to_string(device.index);
  else
    options.segment_name = ledger_segment_name(device.id, options.mode);
  options.wake_wait = config.wake_wait.value;
  if (config.quota.value) {
    options.quota_bytes = config.quota.value->resolve(device.total_bytes);
    if (options.quota_bytes == 0)
      return Error(Errc::invalid_argument, config.quota.quoted() + " is 0 bytes of the " +
                                               format_bytes(device.total_bytes) + " device; allowed: a larger quota");
  }
  return options;
}

Expected<LedgerOptions> resolve_ledger(const Config& config) {
  if (!config.ledger_name.value.empty() && !config.quota.value) return resolve_ledger(config, LedgerDeviceFacts{});
  Config bare = config;
  bare.ledger.value = false;  // the device alone: with the ledger on, building it would register this process
  auto device = make_device(bare);
  if (!device) return std::move(device).error();
  return resolve_ledger(config, LedgerDeviceFacts::of(**device));
}

Expected<std::shared_ptr<Device>> make_ledger_device(const Config& config,
                                                     std::shared_ptr<Device> device) {
  if (!device) return Error(Errc::invalid_argument, "make_ledger_device: no device");
  Expected<LedgerOptions> options = resolve_ledger(config, LedgerDeviceFacts::of(*device));
  if (!options) return std::move(options).error();
  auto ledger = LedgerDevice::create(std::move(device), *options);
  if (!ledger) {
    // Name the setting (TIDEPOOL_QUOTA, its key or the scheduler's limit): the quota
    // is what the user can change. An out_of_memory keeps its report, its
    // advice worded in the config's names.
    if (ledger.error().code() == Errc::out_of_memory) return ledger.error().worded(config.oom_words());
    if (!config.quota.value) return std::move(ledger).error();
    return Error(ledger.error().code(), config.quota.quoted() + " (" +
                                            format_bytes(options->quota_bytes) + "): " + ledger.error().message());
  }
  return std::shared_ptr<Device>(std::move(*ledger));
}

std::unique_ptr<Allocator> with_ledger_trim_hooks(Mode mode, std::unique_ptr<Allocator> pool) {
  LedgerDevice* ledger = find_ledger_device(pool->device());
  if (ledger == nullptr) return pool;
  // A preallocated pool gives its region back only when its owner calls trim()
  // (it would preallocate it again at the next allocation): it reports, it does
  // not answer.
  const bool answers_trim = mode != Mode::preallocate;
  return std::make_unique<LedgerTrimmedAllocator>(std::move(pool), ledger->account(), answers_trim);
}

}  // namespace tidepool
