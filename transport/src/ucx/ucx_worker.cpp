// UcxWorker: creation, address export and the event-fd sleep used by every wait.
#include "ucx_worker.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "desloc/core/error.hpp"
#include "ucx_status.hpp"

namespace desloc::transport::ucx {

UcxWorker::UcxWorker(const UcxContext& context, int spin_iterations,
                     std::chrono::microseconds linger)
    : spin_iterations_(std::max(0, spin_iterations)),
      linger_(std::max(std::chrono::microseconds(0), linger)) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  DESLOC_UCX_CHECK(ucp_worker_create(context.get(), &params, &worker_));
  try {
    DESLOC_UCX_CHECK(ucp_worker_get_efd(worker_, &event_fd_),
                     "the worker needs UCP_FEATURE_WAKEUP to sleep instead of busy-polling");
  } catch (...) {
    destroy();
    throw;
  }
}

UcxWorker::~UcxWorker() { destroy(); }

UcxWorker::UcxWorker(UcxWorker&& other) noexcept
    : worker_(std::exchange(other.worker_, nullptr)),
      event_fd_(std::exchange(other.event_fd_, -1)),
      spin_iterations_(other.spin_iterations_),
      linger_(other.linger_) {}

UcxWorker& UcxWorker::operator=(UcxWorker&& other) noexcept {
  if (this != &other) {
    destroy();
    worker_ = std::exchange(other.worker_, nullptr);
    event_fd_ = std::exchange(other.event_fd_, -1);
    spin_iterations_ = other.spin_iterations_;
    linger_ = other.linger_;
  }
  return *this;
}

void UcxWorker::destroy() noexcept {
  // The event fd belongs to the worker; ucp_worker_destroy closes it.
  if (worker_) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  event_fd_ = -1;
}

WorkerAddress UcxWorker::address() const {
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  DESLOC_UCX_CHECK(ucp_worker_get_address(worker_, &address, &length));
  const auto* bytes = reinterpret_cast<const std::byte*>(address);
  WorkerAddress out(bytes, bytes + length);
  ucp_worker_release_address(worker_, address);
  return out;
}

void UcxWorker::sleep_for_events(Clock::time_point deadline) {
  const ucs_status_t armed = ucp_worker_arm(worker_);
  if (armed == UCS_ERR_BUSY) return;  // events pending: the caller progresses again
  DESLOC_UCX_CHECK(armed);
  const auto remaining = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  const auto timeout = std::clamp(remaining, std::chrono::milliseconds(0), kMaxSleep);
  pollfd fd{event_fd_, POLLIN, 0};
  if (::poll(&fd, 1, static_cast<int>(timeout.count())) < 0 && errno != EINTR) {
    throw TransportError(std::string("poll on the UCX worker event fd failed: ") +
                         std::strerror(errno));
  }
}

}  // namespace desloc::transport::ucx
