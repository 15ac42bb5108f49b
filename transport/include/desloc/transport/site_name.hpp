// What a site may be called: one rule for the job config and the coordinator's admission. A
// site name becomes part of file names (ranks/<site>-<rank>) and of every message about it.
#pragma once

#include <cstddef>
#include <string_view>

namespace desloc::transport {

inline constexpr std::size_t kMaxSiteNameChars = 32;
// The rule in words, for error messages.
inline constexpr std::string_view kSiteNameRule =
    "1-32 characters of [A-Za-z0-9_-], starting with a letter";

bool valid_site_name(std::string_view name);

}  // namespace desloc::transport
