// Collective: all-reduce, all-gather, broadcast and barrier over a fixed group of ranks, with
// per-operation byte accounting. Backends (UCX today, NCCL later) sit behind this interface and
// are created by their factory (e.g. ucx_collective.hpp).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/transport/ip_address.hpp"

namespace desloc::transport {

enum class CollectiveOp : std::uint8_t { kAllReduce = 0, kAllGather, kBroadcast, kBarrier };
inline constexpr std::size_t kCollectiveOpCount = 4;

constexpr std::string_view op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

// Payload bytes this rank handed to / took from the transport (protocol headers excluded).
struct OpBytes {
  std::uint64_t sent = 0;      // bytes
  std::uint64_t received = 0;  // bytes
  std::uint64_t calls = 0;     // completed operations
};

struct ByteCounters {
  std::array<OpBytes, kCollectiveOpCount> by_op{};

  OpBytes& operator[](CollectiveOp op) { return by_op[static_cast<std::size_t>(op)]; }
  const OpBytes& operator[](CollectiveOp op) const { return by_op[static_cast<std::size_t>(op)]; }
  OpBytes total() const {
    OpBytes t;
    for (const OpBytes& b : by_op) {
      t.sent += b.sent;
      t.received += b.received;
      t.calls += b.calls;
    }
    return t;
  }
};

// What the next operations are about, carried in chunk headers and checked on receipt: the
// training step, the state kind (optim::StateKind as a byte; 255 = none) and the shard.
struct OpLabel {
  std::int64_t step = -1;
  std::uint8_t state = 255;
  std::uint32_t shard = 0;
};
// OpLabel::state values that are not a state kind: a step's control exchange (payload health
// and stop requests), the header of a state transfer to a rejoining site, and none.
inline constexpr std::uint8_t kLabelControl = 253;
inline constexpr std::uint8_t kLabelTransferHeader = 254;
inline constexpr std::uint8_t kLabelNone = 255;

struct CollectiveOptions {
  // Every operation must finish within this time of its start, or it throws TimeoutError
  // naming the awaited peer. The group is unusable afterwards (rebuild it in a new epoch).
  std::chrono::milliseconds deadline{60'000};
  // Pipelining unit on the wire, in bytes (rounded down to whole elements). Larger chunks cost
  // fewer messages; smaller ones overlap reduction and transfer earlier. The WAN averager sets
  // this per link from the planner.
  std::size_t chunk_bytes = 1 << 20;
  // Receive chunks posted ahead of the one being reduced. Bounds the all-reduce's scratch
  // memory to max_inflight_chunks * chunk_bytes.
  std::size_t max_inflight_chunks = 8;
  // Names of the group's ranks for error messages, indexed by group rank (e.g. "east/0"); a
  // rank without a name is printed as "rank k".
  std::vector<std::string> peer_names;
  // Wide-area integrity: every chunk travels behind a ChunkHeader (epoch, step, state, shard,
  // offset, length, CRC32C of the payload), and the receiver checks all of it before the bytes
  // are summed or stored. A mismatch throws PeerFailure with that context; nothing is averaged
  // in silently. Costs one copy and one CRC32C per chunk on each side.
  bool chunk_headers = false;
  // The membership epoch the group was built in; carried in chunk headers.
  std::uint64_t epoch = 0;
  // Polled while an operation waits. When it returns true the operation stops waiting and
  // throws PeerFailure: the control plane has declared this epoch over (a site failed), so
  // the awaited peer may never come. Empty: wait for the deadline alone.
  std::function<bool()> should_abort;
  // Fault injection for the fault suite: the process kills itself (SIGKILL) halfway through
  // the ring of the first all-reduce labelled with this step and state (at the end of its
  // reduce-scatter, before it forwards its reduced shard), as a site that dies in the middle of
  // an average would. step < 0: off.
  OpLabel crash_in{};
};

// What a rank saw of a collective operation that failed. The rank behind a slow outbound link
// is the one whose sends wait: its peers' sends drain while they wait for its data.
struct FailureEvidence {
  std::chrono::milliseconds in_operation{0};  // from the operation's start to the failure
  std::chrono::milliseconds send_wait{0};     // the longest a send to the ring successor waited,
                                              // counting one still waiting at the failure
  // The process's TCP backlog during the operation (the longest of samples while it waited and
  // at the failure), as the time its slowest socket needs to deliver it (tcp_backlog.hpp): what
  // an eager send handed to the kernel behind a slow link.
  std::chrono::milliseconds backlog{0};
  IpAddress backlog_peer = kNoAddress;  // where that socket leads
};

// A fixed group of size() ranks; this process is rank(). Every rank must call the same
// operations in the same order with the same lengths (ranks are matched by call order). All
// calls block until this rank's part is complete. Not thread-safe: one caller thread per object.
class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = sum over ranks of data[i], summed in a fixed order per element (so the
  // result is bitwise identical on every rank). Empty spans and spans shorter than size() are
  // allowed.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // all[r * mine.size() .. (r+1) * mine.size()) = rank r's `mine`; all.size() == size() *
  // mine.size().
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // Copies root's data into every rank's data (same length on every rank).
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // A ring reduce-scatter of encoded bytes (compressed averages, issue 14). `segments` holds
  // size() segments of segment_bytes each, segment s at s * segment_bytes; each is cut into
  // pieces of piece_bytes (the last one shorter), the unit of the pipeline. As in
  // all_reduce_sum, segment k's reduction starts at rank k and passes through every next rank
  // in ring order: a rank that receives piece c of segment s calls combine(s, c, received,
  // its own piece), which must leave in its own piece what it forwards. Afterwards rank r's
  // segment (r + 1) mod size() holds the combination of every rank's; its other segments are
  // unspecified. Counted as an all-reduce in bytes(). Backends without it throw Error.
  using EncodedCombine =
      std::function<void(int segment, std::size_t piece, std::span<const std::byte> received,
                         std::span<std::byte> own)>;
  virtual void reduce_scatter_encoded(std::span<std::byte> segments, std::size_t segment_bytes,
                                      std::size_t piece_bytes, const EncodedCombine& combine);
  // Returns once every rank has entered the barrier.
  virtual void barrier() = 0;

  virtual const ByteCounters& bytes() const = 0;
  virtual void reset_bytes() = 0;

  // What this rank saw of the operation that broke the group; zeros while the group works,
  // and from backends that do not track it. The coordinator's straggler rule reads it
  // (docs/cluster.md).
  virtual FailureEvidence failure_evidence() const { return {}; }

  // Labels the operations that follow (until the next call). Backends without chunk headers
  // ignore it.
  virtual void set_label(const OpLabel& label) { (void)label; }

  // Typed conveniences for the common float case.
  void all_gather(std::span<const float> mine, std::span<float> all) {
    all_gather(std::as_bytes(mine), std::as_writable_bytes(all));
  }
  void broadcast(std::span<float> data, int root) { broadcast(std::as_writable_bytes(data), root); }
};

}  // namespace desloc::transport
