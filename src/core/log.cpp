// Logging sink: one line per call, serialized so lines from threads never interleave.
#include "desloc/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <utility>

namespace desloc::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mutex;
Sink g_sink;  // guarded by g_mutex
constexpr const char* kTags[] = {"debug", "info", "warn", "error"};
}  // namespace

void set_level(Level l) { g_level.store(l); }
Level level() { return g_level.load(std::memory_order_relaxed); }

void write(Level l, std::string_view message) {
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "[desloc %s] %.*s\n", kTags[static_cast<int>(l)],
               static_cast<int>(message.size()), message.data());
  if (g_sink) g_sink(l, message);
}

void set_sink(Sink sink) {
  std::lock_guard lock(g_mutex);
  g_sink = std::move(sink);
}

}  // namespace desloc::log
