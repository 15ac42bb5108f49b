// Status checking for UCX calls.
#include "ucx_status.hpp"

#include "desloc/core/error.hpp"

namespace desloc::transport::ucx {

std::string status_text(ucs_status_t status) {
  return std::string(ucs_status_string(status)) + " (status " +
         std::to_string(static_cast<int>(status)) + ")";
}

void check_status(ucs_status_t status, const char* call_text, const std::string& context,
                  std::source_location loc) {
  if (status == UCS_OK) return;
  std::string what = std::string(call_text) + " failed: " + status_text(status);
  if (!context.empty()) what += " (" + context + ")";
  throw TransportError(what, loc);
}

}  // namespace desloc::transport::ucx
