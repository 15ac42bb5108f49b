// The records of UcxCollective's transfers (ucx_collective.cpp): the tag layout, one posted
// send or receive and UCX's callbacks that complete it, the units of a ring schedule and an
// operation's state.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "desloc/transport/chunk_header.hpp"
#include "desloc/transport/collective.hpp"

namespace desloc::transport::ucx {

using Clock = std::chrono::steady_clock;

// Tag (64 bits) = op kind (4) | op sequence (28) | ring step (12) | chunk index (20). Every rank
// receives only from its ring predecessor, so the tag needs no source field.
constexpr int kChunkBits = 20;
constexpr int kStepBits = 12;
constexpr int kSeqBits = 28;
constexpr std::size_t kMaxChunks = std::size_t{1} << kChunkBits;
constexpr int kMaxSteps = 1 << kStepBits;
constexpr ucp_tag_t kFullTagMask = ~ucp_tag_t{0};

inline ucp_tag_t make_tag(CollectiveOp op, std::uint32_t seq, int step, std::size_t chunk) {
  return (static_cast<ucp_tag_t>(op) << (kSeqBits + kStepBits + kChunkBits)) |
         (static_cast<ucp_tag_t>(seq & ((1u << kSeqBits) - 1)) << (kStepBits + kChunkBits)) |
         (static_cast<ucp_tag_t>(step) << kChunkBits) | static_cast<ucp_tag_t>(chunk);
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

constexpr std::size_t kHeaderBytes = sizeof(ChunkHeader);

inline std::uint32_t payload_crc(const std::byte* p, std::size_t n) {
  return transport::payload_crc({p, n});
}

// One posted send or receive. UCX's completion callback writes status/length here and frees
// its request; nothing is thrown from the callback.
struct Transfer {
  void* request = nullptr;  // UCX request while in flight
  ucs_status_t status = UCS_INPROGRESS;
  bool is_recv = false;
  std::vector<std::byte> staging;      // header + payload, with chunk headers
  ucp_tag_recv_info_t info{};          // recv: the matched message's length and tag
  Clock::time_point posted{}, done{};  // send: when posted, and when UCX took it (or failed it)
  bool pending() const { return status == UCS_INPROGRESS; }
};

// UCX's completion callbacks (user_data is the Transfer): they record the status (and a
// receive's matched length and tag), free the request and throw nothing.
void on_send_done(void* request, ucs_status_t status, void* user_data);
void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data);

// A received chunk: where it lands, whether it is summed in (via scratch) or stored, whether
// it travels on to the successor at step + 1, and which earlier send of ours must finish
// before its bytes may be overwritten.
struct RecvUnit {
  int step = 0;
  std::size_t chunk = 0;
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
  bool reduce = false;
  bool combine = false;  // reduce with the operation's EncodedCombine instead of a float sum
  int segment = 0;       // with combine: the segment the chunk belongs to
  bool forward = false;
  int guard_send_step = -1;  // wait for our send (guard_send_step, chunk) before posting
};

struct SendUnit {
  int step = 0;
  std::size_t chunk = 0;
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
};

struct OpState {
  CollectiveOp op{};
  std::uint32_t seq = 0;
  Clock::time_point start;
  // Moved out by the waits when this process stalls (UcxWorker::wait_until), which track the
  // operation's last look at the clock in `looked`.
  mutable Clock::time_point deadline;
  mutable Clock::time_point looked;
  int root = -1;                    // broadcast only
  const std::byte* base = nullptr;  // the operation's buffer, for chunk offsets
  OpLabel label;
};

}  // namespace desloc::transport::ucx
