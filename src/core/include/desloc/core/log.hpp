// Minimal leveled logging to stderr, safe to call from several threads.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace desloc::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
void write(Level level, std::string_view message);

// Every line also goes to `sink` while one is set (nullptr removes it), e.g. so that a test can
// check what a component logged. It runs under the log's lock: it must not log.
using Sink = std::function<void(Level, std::string_view)>;
void set_sink(Sink sink);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace desloc::log
