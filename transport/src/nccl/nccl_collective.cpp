// NcclCollective: all-reduce, all-gather, broadcast and barrier through NCCL, with host spans
// staged through one device buffer on a private stream. The communicator is non-blocking
// (ncclConfig_t::blocking = 0), so every wait polls and can give up at the deadline.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "desloc/core/cuda_check.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/nccl_collective.hpp"

namespace desloc::transport {
namespace {

using Clock = std::chrono::steady_clock;
static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "ncclUniqueId size changed");

void check_nccl(ncclResult_t r, const char* call, const std::string& context) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw TransportError(std::string(call) + " failed: " + ncclGetErrorString(r) + " (" + context +
                         ")");
}
#define DESLOC_NCCL(call, ctx) check_nccl((call), #call, (ctx))

class NcclCollective final : public Collective {
 public:
  NcclCollective(int rank, int size, const NcclId& id, int device, const CollectiveOptions& o)
      : rank_(rank), size_(size), device_(device), options_(o) {
    DESLOC_CUDA_CHECK(cudaSetDevice(device_), where("selecting the device"));
    DESLOC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where("stream"));
    ncclUniqueId nid;
    std::memcpy(&nid, id.data(), sizeof nid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DESLOC_NCCL(ncclCommInitRankConfig(&comm_, size_, nid, rank_, &config), where("init"));
    settle(Clock::now() + options_.deadline,
           "creating the communicator (are all " + std::to_string(size_) + " ranks starting?)");
  }

  ~NcclCollective() override {
    if (comm_ != nullptr) {
      if (broken_)
        ncclCommAbort(comm_);
      else if (ncclCommDestroy(comm_) != ncclSuccess)
        log::warn("rank {}: ncclCommDestroy failed", rank_);
    }
    if (device_buffer_ != nullptr) cudaFree(device_buffer_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const ByteCounters& bytes() const override { return counters_; }
  void reset_bytes() override { counters_ = {}; }

  void all_reduce_sum(std::span<float> data) override {
    const std::size_t bytes = data.size_bytes();
    run(CollectiveOp::kAllReduce, data.data(), bytes, data.data(), bytes, [&](void* d) {
      return ncclAllReduce(d, d, data.size(), ncclFloat, ncclSum, comm_, stream_);
    });
    count(CollectiveOp::kAllReduce, bytes * 2 * (size_ - 1) / size_);
  }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    if (all.size() != mine.size() * static_cast<std::size_t>(size_))
      throw Error("all_gather: output holds " + std::to_string(all.size()) + " bytes but " +
                  std::to_string(size_) + " ranks x " + std::to_string(mine.size()) +
                  " bytes are gathered");
    const std::size_t block = mine.size();
    // Stage my block at its place in the device buffer; gather in place.
    run(
        CollectiveOp::kAllGather, mine.data(), block, all.data(), all.size(),
        [&](void* d) {
          auto* base = static_cast<std::byte*>(d);
          return ncclAllGather(base, base, block, ncclChar, comm_, stream_);
        },
        /*stage_at_rank=*/true);
    count(CollectiveOp::kAllGather, block * static_cast<std::size_t>(size_ - 1));
  }

  void broadcast(std::span<std::byte> data, int root) override {
    run(CollectiveOp::kBroadcast, data.data(), data.size(), data.data(), data.size(),
        [&](void* d) { return ncclBroadcast(d, d, data.size(), ncclChar, root, comm_, stream_); });
    count(CollectiveOp::kBroadcast, rank_ == root ? data.size() : 0);
  }

  void barrier() override {
    float one = 1.0f;
    all_reduce_sum(std::span<float>(&one, 1));
  }

 private:
  std::string where(const std::string& what) const {
    return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on device " +
           std::to_string(device_) + ": " + what;
  }

  // Polls the communicator until it leaves ncclInProgress; aborts it at the deadline.
  void settle(Clock::time_point deadline, const std::string& what) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      DESLOC_NCCL(ncclCommGetAsyncError(comm_, &state), where(what));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        broken_ = true;
        throw PeerFailure(where(what) + ": " + ncclGetErrorString(state) +
                          "; a peer rank probably failed");
      }
      if (options_.should_abort && options_.should_abort()) {
        broken_ = true;  // the destructor aborts the communicator
        throw PeerFailure(where(what) + ": aborted: the coordinator closed membership epoch " +
                          std::to_string(options_.epoch) + " (a peer failed)");
      }
      if (Clock::now() >= deadline) {
        broken_ = true;
        throw TimeoutError(where(what) + ": gave up at the deadline of " +
                           std::to_string(options_.deadline.count()) +
                           " ms; check that every rank of the site is alive");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  template <class Enqueue>
  void run(CollectiveOp op, const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes,
           Enqueue&& enqueue, bool stage_at_rank = false) {
    if (broken_)
      throw TransportError(where(std::string(op_name(op)) +
                                 " refused: the communicator failed earlier; rebuild it"));
    if (out_bytes == 0) return;
    const std::string what =
        std::string(op_name(op)) + " of " + std::to_string(out_bytes) + " bytes";
    const auto deadline = Clock::now() + options_.deadline;
    DESLOC_CUDA_CHECK(cudaSetDevice(device_), where(what));
    if (out_bytes > capacity_) {
      if (device_buffer_ != nullptr) cudaFree(device_buffer_);
      device_buffer_ = nullptr;
      DESLOC_CUDA_CHECK(cudaMalloc(&device_buffer_, out_bytes), where(what));
      capacity_ = out_bytes;
    }
    // all_gather stages its block at rank * block; the others at the buffer's start.
    const std::size_t offset = stage_at_rank ? static_cast<std::size_t>(rank_) * in_bytes : 0;
    auto* dev = static_cast<std::byte*>(device_buffer_);
    DESLOC_CUDA_CHECK(cudaMemcpyAsync(dev + offset, in, in_bytes, cudaMemcpyHostToDevice, stream_),
                      where(what));
    DESLOC_NCCL(enqueue(device_buffer_), where(what));
    settle(deadline, what);
    DESLOC_CUDA_CHECK(cudaMemcpyAsync(out, dev, out_bytes, cudaMemcpyDeviceToHost, stream_),
                      where(what));
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) DESLOC_CUDA_CHECK(q, where(what));
      settle(deadline, what);  // a failed or stalled peer shows up here
      if (Clock::now() >= deadline) {
        broken_ = true;
        throw TimeoutError(where(what) + ": not complete at the deadline of " +
                           std::to_string(options_.deadline.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void count(CollectiveOp op, std::size_t sent) {
    counters_[op].sent += sent;
    ++counters_[op].calls;
  }

  int rank_, size_, device_;
  CollectiveOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* device_buffer_ = nullptr;
  std::size_t capacity_ = 0;
  bool broken_ = false;
  ByteCounters counters_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool nccl_available() { return cuda_device_count() > 0; }

NcclId nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", "creating a communicator id");
  NcclId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<Collective> make_nccl_collective(int rank, int size, const NcclId& id, int device,
                                                 const CollectiveOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("make_nccl_collective: rank " + std::to_string(rank) +
                " is outside a group of size " + std::to_string(size));
  return std::make_unique<NcclCollective>(rank, size, id, device, options);
}

}  // namespace desloc::transport
