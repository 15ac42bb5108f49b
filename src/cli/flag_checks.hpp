// CLI11 checks for numeric flags whose messages say what the flag needs and what it got
// ("--link-scale: must be a finite number > 0 (...), got nan"); CLI11's own Range prints
// "0 not in range 0.000000 to 1.79e308" and lets NaN through.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace desloc::cli {

// A finite real number > min (exclusive) or >= min; NaN and infinities are refused.
CLI::Validator finite_above(double min, const std::string& what);
CLI::Validator finite_at_least(double min, const std::string& what);

// A whole number in [min, max].
CLI::Validator whole_in(std::int64_t min, std::int64_t max, const std::string& what);

}  // namespace desloc::cli
