// What the UCX library linked into this build is, for `desloc --version` and reports.
#pragma once

#include <string>

namespace desloc::transport {

// The UCX version string reported by the library at run time, e.g. "1.13.1".
std::string ucx_version();

}  // namespace desloc::transport
