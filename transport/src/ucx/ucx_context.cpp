// UcxContext: ucp_init with per-context UCX settings (TLS, devices, rendezvous threshold).
#include "ucx_context.hpp"

#include <utility>

#include "ucx_status.hpp"

namespace desloc::transport::ucx {
namespace {

// Owns a ucp_config_t for the duration of ucp_init.
struct ConfigHolder {
  ucp_config_t* config = nullptr;
  ~ConfigHolder() {
    if (config) ucp_config_release(config);
  }
};

void set_if(ucp_config_t* config, const char* name, const std::string& value) {
  if (value.empty()) return;
  DESLOC_UCX_CHECK(ucp_config_modify(config, name, value.c_str()),
                   std::string("UCX_") + name + "=" + value + ": check the [transport] settings");
}

}  // namespace

UcxContext::UcxContext(const UcxOptions& options) {
  ConfigHolder holder;
  DESLOC_UCX_CHECK(ucp_config_read(nullptr, nullptr, &holder.config));
  set_if(holder.config, "TLS", options.tls);
  set_if(holder.config, "NET_DEVICES", options.net_devices);
  set_if(holder.config, "RNDV_THRESH", options.rndv_thresh);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  DESLOC_UCX_CHECK(ucp_init(&params, holder.config, &context_),
                   "UCX_TLS=" + options.tls + " UCX_NET_DEVICES=" + options.net_devices +
                       ": are these transports and devices present? see `ucx_info -d`");
}

UcxContext::~UcxContext() {
  if (context_) ucp_cleanup(context_);
}

UcxContext::UcxContext(UcxContext&& other) noexcept
    : context_(std::exchange(other.context_, nullptr)) {}

UcxContext& UcxContext::operator=(UcxContext&& other) noexcept {
  if (this != &other) {
    if (context_) ucp_cleanup(context_);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

}  // namespace desloc::transport::ucx
