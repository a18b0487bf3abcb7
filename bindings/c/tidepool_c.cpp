// The C ABI (include/tidepool/tidepool.h) over the config layer's stack. No
// exception leaves: each entry point catches and turns it into a code and
// the thread's last error.
#include "tidepool/tidepool.h"

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "c_stats.hpp"
#include "settings.hpp"
#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/sleep.hpp"

struct tidepool_allocator {
  tidepool::bindings::Stack stack;
  std::string name;  // the pool's name, NUL-terminated for tidepool_allocator_name
};

namespace {

using tidepool::Errc;
using tidepool::Error;

thread_local std::string last_error;

int status_of(Errc code) {
  switch (code) {
    case Errc::out_of_memory: return TIDEPOOL_ERROR_OUT_OF_MEMORY;
    case Errc::invalid_argument: return TIDEPOOL_ERROR_INVALID_ARGUMENT;
    case Errc::invalid_pointer: return TIDEPOOL_ERROR_INVALID_POINTER;
    case Errc::double_free: return TIDEPOOL_ERROR_DOUBLE_FREE;
    case Errc::unsupported: return TIDEPOOL_ERROR_UNSUPPORTED;
    case Errc::device_error: return TIDEPOOL_ERROR_DEVICE;
    case Errc::limit_reached: return TIDEPOOL_ERROR_LIMIT_REACHED;
    case Errc::corrupt_data: return TIDEPOOL_ERROR_CORRUPT_DATA;
    case Errc::io_error: return TIDEPOOL_ERROR_IO;
  }
  return TIDEPOOL_ERROR_INTERNAL;
}

int fail(const Error& error) {
  last_error = error.message();
  return status_of(error.code());
}

int fail(int status, std::string message) {
  last_error = std::move(message);
  return status;
}

/// Runs `body` (returning a status); exceptions become TIDEPOOL_ERROR_INTERNAL
/// (or out_of_memory for std::bad_alloc) with their message.
template <class Body>
int guarded(const char* function, Body&& body) noexcept {
  try {
    last_error.clear();
    return body();
  } catch (const tidepool::Exception& error) {
    return fail(error.error());
  } catch (const std::bad_alloc&) {
    return fail(TIDEPOOL_ERROR_OUT_OF_MEMORY, std::string(function) + ": out of host memory");
  } catch (const std::exception& error) {
    return fail(TIDEPOOL_ERROR_INTERNAL, std::string(function) + ": " + error.what());
  } catch (...) {
    return fail(TIDEPOOL_ERROR_INTERNAL, std::string(function) + ": unknown exception");
  }
}

int null_argument(const char* function, const char* argument) {
  return fail(TIDEPOOL_ERROR_INVALID_ARGUMENT,
              std::string(function) + ": " + argument + " is NULL");
}

/// The OOM advice names the settings as the config does: by key for a
/// config string, by variable for the environment.
int create_from(const tidepool::Expected<tidepool::Config>& config, tidepool_allocator** out) {
  if (!config) return fail(config.error());
  auto stack = tidepool::bindings::make_stack(*config);
  if (!stack) return fail(stack.error());
  std::string name(stack->allocator->name());
  *out = new tidepool_allocator{std::move(*stack), std::move(name)};
  return TIDEPOOL_OK;
}

/// The allocator's tags, or an error naming the function when its pool has none.
tidepool::Expected<tidepool::Sleepable*> tags_of(const char* function, const tidepool_allocator* allocator) {
  tidepool::Sleepable* tags = allocator->stack.allocator->sleepable();
  if (tags != nullptr) return tags;
  return Error(Errc::unsupported, std::string(function) + ": the '" + allocator->name +
                                      "' pool has no tags; tags, sleep and wake need mode=expandable");
}

/// Runs `body(tags)` for a non-null allocator (and, when `tag_argument`, a
/// non-null tag) whose pool has tags.
template <class Body>
int with_tags(const char* function, const tidepool_allocator* allocator, const char* tag, bool tag_argument,
              Body&& body) {
  return guarded(function, [&]() -> int {
    if (allocator == nullptr) return null_argument(function, "allocator");
    if (tag_argument && tag == nullptr) return null_argument(function, "tag");
    auto tags = tags_of(function, allocator);
    if (!tags) return fail(tags.error());
    tidepool::Status status = body(**tags);
    if (!status) return fail(status.error().worded(allocator->stack.words));
    return TIDEPOOL_OK;
  });
}

}  // namespace

extern "C" {

const char* tidepool_version(void) { return TIDEPOOL_VERSION; }

const char* tidepool_status_name(int status) {
  switch (status) {
    case TIDEPOOL_OK: return "ok";
    case TIDEPOOL_ERROR_INTERNAL: return "internal";
    default:
      if (status >= TIDEPOOL_ERROR_OUT_OF_MEMORY && status <= TIDEPOOL_ERROR_IO)
        return tidepool::errc_name(static_cast<Errc>(status - 1));
      return "unknown";
  }
}

const char* tidepool_last_error(void) { return last_error.c_str(); }

int tidepool_create(const char* config, tidepool_allocator** out) {
  return guarded("tidepool_create", [&]() -> int {
    if (out == nullptr) return null_argument("tidepool_create", "out");
    auto settings = tidepool::parse_config_string(config ? config : "");
    if (!settings) return fail(settings.error());
    return create_from(tidepool::Config::from_keys(*settings), out);
  });
}

int tidepool_create_from_env(tidepool_allocator** out) {
  return guarded("tidepool_create_from_env", [&]() -> int {
    if (out == nullptr) return null_argument("tidepool_create_from_env", "out");
    return create_from(tidepool::Config::from_env(), out);
  });
}

void tidepool_destroy(tidepool_allocator* allocator) {
  (void)guarded("tidepool_destroy", [&]() -> int {
    delete allocator;
    return TIDEPOOL_OK;
  });
}

int tidepool_allocate(tidepool_allocator* allocator, size_t bytes, tidepool_stream stream,
                      void** out) {
  return guarded("tidepool_allocate", [&]() -> int {
    if (allocator == nullptr) return null_argument("tidepool_allocate", "allocator");
    if (out == nullptr) return null_argument("tidepool_allocate", "out");
    auto block = allocator->stack.allocator->allocate(bytes, stream);
    if (!block) return fail(block.error().worded(allocator->stack.words));
    *out = *block;
    return TIDEPOOL_OK;
  });
}

int tidepool_free(tidepool_allocator* allocator, void* ptr, tidepool_stream stream) {
  return guarded("tidepool_free", [&]() -> int {
    if (allocator == nullptr) return null_argument("tidepool_free", "allocator");
    auto status = allocator->stack.allocator->deallocate(ptr, stream);
    if (!status) return fail(status.error());
    return TIDEPOOL_OK;
  });
}

int tidepool_get_stats(const tidepool_allocator* allocator, tidepool_stats* out, size_t out_size) {
  return guarded("tidepool_get_stats", [&]() -> int {
    if (allocator == nullptr) return null_argument("tidepool_get_stats", "allocator");
    if (out == nullptr) return null_argument("tidepool_get_stats", "out");
    if (!tidepool::bindings::copy_stats(allocator->stack.allocator->stats(), out, out_size))
      return fail(TIDEPOOL_ERROR_INTERNAL, "tidepool_get_stats: tidepool_stats lacks counters of Stats");
    return TIDEPOOL_OK;
  });
}

int tidepool_trim(tidepool_allocator* allocator, size_t* released) {
  return guarded("tidepool_trim", [&]() -> int {
    if (allocator == nullptr) return null_argument("tidepool_trim", "allocator");
    const std::size_t bytes = allocator->stack.allocator->trim();
    if (released != nullptr) *released = bytes;
    return TIDEPOOL_OK;
  });
}

int tidepool_tag_begin(tidepool_allocator* allocator, const char* tag) {
  return with_tags("tidepool_tag_begin", allocator, tag, true,
                   [&](tidepool::Sleepable& tags) { return tags.tag_begin(tag); });
}

int tidepool_tag_end(tidepool_allocator* allocator) {
  return with_tags("tidepool_tag_end", allocator, nullptr, false,
                   [&](tidepool::Sleepable& tags) { return tags.tag_end(); });
}

int tidepool_sleep(tidepool_allocator* allocator, const char* tag, tidepool_keep keep) {
  return with_tags("tidepool_sleep", allocator, tag, true, [&](tidepool::Sleepable& tags) -> tidepool::Status {
    if (keep != TIDEPOOL_KEEP_CONTENTS && keep != TIDEPOOL_KEEP_NOTHING) {
      return Error(Errc::invalid_argument, "tidepool_sleep: keep " + std::to_string(static_cast<int>(keep)) +
                                               ": allowed: TIDEPOOL_KEEP_CONTENTS (0) or TIDEPOOL_KEEP_NOTHING (1)");
    }
    return tags.sleep(tag, keep == TIDEPOOL_KEEP_CONTENTS ? tidepool::SleepKeep::contents
                                                          : tidepool::SleepKeep::nothing);
  });
}

int tidepool_wake(tidepool_allocator* allocator, const char* tag) {
  return with_tags("tidepool_wake", allocator, tag, true, [&](tidepool::Sleepable& tags) { return tags.wake(tag); });
}

int tidepool_get_tag_stats(const tidepool_allocator* allocator, const char* tag, tidepool_tag_stats* out,
                           size_t out_size) {
  return with_tags("tidepool_get_tag_stats", allocator, tag, true, [&](tidepool::Sleepable& tags) -> tidepool::Status {
    if (out == nullptr) return Error(Errc::invalid_argument, "tidepool_get_tag_stats: out is NULL");
    for (const tidepool::TagStats& stats : tags.tag_stats()) {
      if (stats.name != tag) continue;
      const tidepool_tag_stats full{stats.asleep ? 1 : 0,
                                    static_cast<int64_t>(stats.bytes_in_use),
                                    static_cast<int64_t>(stats.bytes_asleep),
                                    static_cast<int64_t>(stats.host_bytes),
                                    static_cast<int64_t>(stats.sleeps),
                                    static_cast<int64_t>(stats.wakes)};
      std::memset(out, 0, out_size);
      std::memcpy(out, &full, out_size < sizeof full ? out_size : sizeof full);
      return {};
    }
    return Error(Errc::invalid_argument, "tidepool_get_tag_stats: no tag '" + std::string(tag).substr(0, 64) + "'");
  });
}

const char* tidepool_allocator_name(const tidepool_allocator* allocator) {
  if (allocator == nullptr) return nullptr;
  return allocator->name.c_str();
}

}  // extern "C"
