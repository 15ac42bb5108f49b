// UcxEndpoint: creation from a worker address, error capture and a bounded close.
#include "ucx_endpoint.hpp"

#include <string>

#include "desloc/core/log.hpp"
#include "ucx_status.hpp"

namespace desloc::transport::ucx {

UcxEndpoint::UcxEndpoint(UcxWorker& worker, const WorkerAddress& peer_address, int peer_rank,
                         bool detect_peer_failure)
    : worker_(&worker), state_(std::make_unique<State>()), peer_rank_(peer_rank) {
  state_->peer_mode = detect_peer_failure;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  params.err_mode = detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (detect_peer_failure) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_handler.cb = &UcxEndpoint::on_error;
    params.err_handler.arg = state_.get();
  }
  // Unreachable: the peer's worker is gone (its process exited), or no transport of this
  // worker reaches it. A TransportError, so that an elastic job recovers without that peer.
  DESLOC_UCX_CHECK(ucp_ep_create(worker.get(), &params, &state_->ep),
                   "endpoint to rank " + std::to_string(peer_rank) +
                       ": its process may have exited, or the transports of this group "
                       "(transport.tls, or transport.site_tls inside a site) do not reach it");
}

void UcxEndpoint::on_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  static_cast<State*>(arg)->error = status;
}

UcxEndpoint::~UcxEndpoint() { close(/*force=*/state_ && state_->error != UCS_OK); }

UcxEndpoint& UcxEndpoint::operator=(UcxEndpoint&& other) noexcept {
  if (this != &other) {
    close(false);
    worker_ = other.worker_;
    state_ = std::move(other.state_);
    peer_rank_ = other.peer_rank_;
  }
  return *this;
}

bool UcxEndpoint::close(bool force, std::chrono::milliseconds grace) noexcept {
  if (!state_ || !state_->ep) return true;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = force && state_->peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(state_->ep, &params);
  state_->ep = nullptr;
  if (request == nullptr) return true;
  if (UCS_PTR_IS_ERR(request)) {
    log::warn("closing the UCX endpoint to rank {} failed: {}", peer_rank_,
              status_text(UCS_PTR_STATUS(request)));
    return true;
  }
  try {
    const bool done =
        worker_->wait_until([&] { return ucp_request_check_status(request) != UCS_INPROGRESS; },
                            UcxWorker::Clock::now() + grace);
    if (!done) {
      // Not freed: UCX still owns it and releases it with the worker.
      log::warn("closing the UCX endpoint to rank {} did not finish within {} ms", peer_rank_,
                grace.count());
      return false;
    }
  } catch (const std::exception& e) {
    log::warn("closing the UCX endpoint to rank {}: {}", peer_rank_, e.what());
    return false;
  }
  const ucs_status_t status = ucp_request_check_status(request);
  ucp_request_free(request);
  // A peer that already left makes a flush fail; that is expected at shutdown.
  if (status != UCS_OK && status != UCS_ERR_CANCELED && status != UCS_ERR_CONNECTION_RESET &&
      status != UCS_ERR_ENDPOINT_TIMEOUT) {
    log::debug("closing the UCX endpoint to rank {}: {}", peer_rank_, status_text(status));
  }
  return true;
}

}  // namespace desloc::transport::ucx
