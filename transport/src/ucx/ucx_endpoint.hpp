// UcxEndpoint: RAII owner of a ucp_ep to one peer, created from the peer's worker address with
// peer error handling; a transport failure is stored (never thrown from UCX's callback).
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <memory>

#include "desloc/transport/ucx_collective.hpp"
#include "ucx_worker.hpp"

namespace desloc::transport::ucx {

class UcxEndpoint {
 public:
  // `worker` must outlive the endpoint. `peer_rank` only labels messages. With
  // detect_peer_failure, UCX reports a dead peer through error(); not every transport can.
  UcxEndpoint(UcxWorker& worker, const WorkerAddress& peer_address, int peer_rank,
              bool detect_peer_failure);
  ~UcxEndpoint();
  UcxEndpoint(UcxEndpoint&& other) noexcept = default;
  UcxEndpoint& operator=(UcxEndpoint&& other) noexcept;
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  ucp_ep_h get() const { return state_ ? state_->ep : nullptr; }
  int peer_rank() const { return peer_rank_; }
  // UCS_OK until UCX reports the connection failed.
  ucs_status_t error() const { return state_ ? state_->error : UCS_ERR_NOT_CONNECTED; }

  // Closes now. force = fail outstanding sends at once (after a timeout or peer failure);
  // otherwise flush them first, for at most `grace`. Without peer failure detection UCX cannot
  // force, so it flushes for at most `grace`. Never throws; logs what went wrong. Returns false
  // when the close is still in flight after `grace` (a cut link): the worker must then not be
  // destroyed, UCX 1.13 asserts on it.
  bool close(bool force,
             std::chrono::milliseconds grace = std::chrono::milliseconds(2000)) noexcept;

 private:
  // Heap-held so UCX's error-callback argument stays valid when the owner moves.
  struct State {
    ucp_ep_h ep = nullptr;
    ucs_status_t error = UCS_OK;
    bool peer_mode = false;  // UCP_ERR_HANDLING_MODE_PEER: required for a forced close
  };
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker* worker_ = nullptr;
  std::unique_ptr<State> state_;
  int peer_rank_ = -1;
};

}  // namespace desloc::transport::ucx
