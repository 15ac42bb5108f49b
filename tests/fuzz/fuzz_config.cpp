// libFuzzer target for the TOML job config loader (src/train/config.cpp): any text must either
// parse into a JobConfig that passes its own validation or end in a ConfigError that names
// the source. Nothing else may escape, and nothing may crash.
#include <cstdint>
#include <string>
#include <string_view>

#include "desloc/core/error.hpp"
#include "desloc/train/config.hpp"
#include "fuzz_common.hpp"

namespace {
constexpr const char* kSource = "fuzz.toml";
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  desloc::train::JobConfig config;
  try {
    config = desloc::train::parse_config(text, kSource);
  } catch (const desloc::ConfigError& e) {
    // config.hpp promises "<file>:<line>:<column>: " (or at least the file) in front.
    if (!e.message().starts_with(kSource))
      desloc::fuzz::oracle_failure("fuzz_config", "error without the file name: " + e.message());
    return 0;
  }
  // An accepted config is used right away by every command: exercise what they call first.
  config.model.validate();
  config.optim.validate();
  if (config.seq_len() <= 0 || config.seq_len() > config.model.context)
    desloc::fuzz::oracle_failure("fuzz_config", "accepted a sequence length outside the context");
  if (config.site_names().size() != static_cast<std::size_t>(config.sync.sites))
    desloc::fuzz::oracle_failure("fuzz_config", "site names disagree with sync.workers");
  (void)config.hash();
  return 0;
}
