// The numeric flag checks: each parses the flag's text itself, so that a value CLI11 would
// convert (nan, inf, -0) is judged as the number it becomes.
#include "flag_checks.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace desloc::cli {
namespace {

CLI::Validator real_check(double min, bool exclusive, const std::string& what) {
  const std::string need =
      fmt::format("must be a finite number {} {:g} ({})", exclusive ? ">" : ">=", min, what);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = !text.empty() && end != nullptr && *end == '\0';
        if (parsed && std::isfinite(v) && (exclusive ? v > min : v >= min)) return {};
        return need + ", got " + text;
      },
      fmt::format("{} {:g}", exclusive ? ">" : ">=", min));
}

}  // namespace

CLI::Validator finite_above(double min, const std::string& what) {
  return real_check(min, true, what);
}

CLI::Validator finite_at_least(double min, const std::string& what) {
  return real_check(min, false, what);
}

CLI::Validator whole_in(std::int64_t min, std::int64_t max, const std::string& what) {
  const std::string need =
      max == INT64_MAX ? fmt::format("must be a whole number, at least {} ({})", min, what)
                       : fmt::format("must be a whole number from {} to {} ({})", min, max, what);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        const bool parsed = !text.empty() && end != nullptr && *end == '\0' && errno == 0;
        if (parsed && v >= min && v <= max) return {};
        return need + ", got " + text;
      },
      max == INT64_MAX ? fmt::format(">= {}", min) : fmt::format("{}..{}", min, max));
}

}  // namespace desloc::cli
