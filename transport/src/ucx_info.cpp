// UCX version query.
#include "desloc/transport/ucx_info.hpp"

#include <ucp/api/ucp.h>

namespace desloc::transport {

std::string ucx_version() { return ucp_get_version_string(); }

}  // namespace desloc::transport
