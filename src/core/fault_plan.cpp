// The fault suite's injected faults (fault_plan.hpp).
#include "desloc/core/fault_plan.hpp"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "desloc/core/error.hpp"

namespace desloc {
namespace {

std::vector<std::string> fields(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    const std::size_t colon = text.find(':', at);
    out.push_back(text.substr(at, colon == std::string::npos ? colon : colon - at));
    if (colon == std::string::npos) return out;
    at = colon + 1;
  }
}

// A whole decimal number >= 1, or nullopt.
std::optional<std::int64_t> count(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1) return std::nullopt;
  return v;
}

// The variable's value, or nullopt where it is unset or empty.
std::optional<std::string> variable(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return std::nullopt;
  return std::string(env);
}

[[noreturn]] void malformed(const char* name, const std::string& text, const char* form) {
  throw ConfigError(std::string("$") + name + " = '" + text + "': expected " + form);
}

std::optional<FaultPlan::Poison> read_poison() {
  constexpr const char* kName = "DESLOC_INJECT_POISON";
  const auto text = variable(kName);
  if (!text) return std::nullopt;
  const auto f = fields(*text);
  const auto step = f.size() >= 2 ? count(f[1]) : std::nullopt;
  if (f.size() < 2 || f.size() > 3 || f[0].empty() || !step ||
      (f.size() == 3 && f[2] != "nan" && f[2] != "huge"))
    malformed(kName, *text, "SITE:STEP[:nan|huge], STEP >= 1");
  return FaultPlan::Poison{f[0], *step, f.size() == 3 && f[2] == "huge"};
}

std::optional<FaultPlan::Replan> read_replan() {
  constexpr const char* kName = "DESLOC_INJECT_REPLAN";
  const auto text = variable(kName);
  if (!text) return std::nullopt;
  const auto f = fields(*text);
  const auto step = f.size() == 2 ? count(f[0]) : std::nullopt;
  const auto kx = f.size() == 2 ? count(f[1]) : std::nullopt;
  if (!step || !kx) malformed(kName, *text, "STEP:KX, both >= 1");
  return FaultPlan::Replan{*step, *kx};
}

std::optional<FaultPlan::Crash> read_crash() {
  constexpr const char* kName = "DESLOC_INJECT_CRASH";
  const auto text = variable(kName);
  if (!text) return std::nullopt;
  const auto f = fields(*text);
  constexpr const char* kForm = "SITE:STEP:x|u|v or SITE:membership";
  if (f.empty() || f[0].empty()) malformed(kName, *text, kForm);
  FaultPlan::Crash c;
  c.site = f[0];
  if (f.size() == 2 && f[1] == "membership") {
    c.at_membership = true;
    return c;
  }
  const auto step = f.size() == 3 ? count(f[1]) : std::nullopt;
  if (!step || (f[2] != "x" && f[2] != "u" && f[2] != "v")) malformed(kName, *text, kForm);
  c.step = *step;
  c.state = f[2][0];
  return c;
}

}  // namespace

FaultPlan FaultPlan::from_environment() {
  FaultPlan plan;
  plan.poison = read_poison();
  plan.replan = read_replan();
  plan.crash = read_crash();
  return plan;
}

}  // namespace desloc
