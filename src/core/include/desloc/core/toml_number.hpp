// A TOML number as a double: a float, or an integer (`step_ms = 88` reads as 88.0); nullopt for
// anything else. The one reader of numbers for every TOML file desloc reads (job configs and
// topologies); included only by code that links toml++.
#pragma once

#include <toml++/toml.h>

#include <optional>

namespace desloc {

inline std::optional<double> toml_number(const toml::node& n) {
  if (const auto* f = n.as_floating_point()) return f->get();
  if (const auto* i = n.as_integer()) return static_cast<double>(i->get());
  return std::nullopt;
}

}  // namespace desloc
