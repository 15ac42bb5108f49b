// The one checked helper for ucs_status_t: DESLOC_UCX_CHECK(call) throws TransportError with
// the call's text, UCX's reason and the call site.
#pragma once

#include <ucs/type/status.h>

#include <source_location>
#include <string>

namespace desloc::transport::ucx {

// Throws TransportError("<call> failed: <ucs reason> (<context>)") unless status is UCS_OK.
void check_status(ucs_status_t status, const char* call_text, const std::string& context = {},
                  std::source_location loc = std::source_location::current());

// Message text for a status, e.g. "Input/output error (UCS_ERR_IO_ERROR)".
std::string status_text(ucs_status_t status);

}  // namespace desloc::transport::ucx

#define DESLOC_UCX_CHECK(call, ...) \
  ::desloc::transport::ucx::check_status((call), #call __VA_OPT__(, ) __VA_ARGS__)
