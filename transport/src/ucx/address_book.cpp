// InMemoryAddressBook: the worker-address exchange for ranks that are threads of one process.
#include "desloc/core/error.hpp"
#include "desloc/transport/ucx_collective.hpp"

namespace desloc::transport {

void InMemoryAddressBook::publish(int rank, WorkerAddress address) {
  {
    std::lock_guard lock(mutex_);
    addresses_[rank] = std::move(address);
  }
  published_.notify_all();
}

WorkerAddress InMemoryAddressBook::lookup(int rank,
                                          std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  if (!published_.wait_until(lock, deadline, [&] { return addresses_.contains(rank); })) {
    throw TimeoutError("rank " + std::to_string(rank) +
                       " did not publish its UCX worker address before the deadline: is it "
                       "running, and does it use the same address book?");
  }
  return addresses_.at(rank);
}

}  // namespace desloc::transport
