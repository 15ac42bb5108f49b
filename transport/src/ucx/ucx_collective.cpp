// UcxCollective: ring all-reduce (reduce-scatter + all-gather), all-gather, broadcast and barrier
// over UCP tag matching, chunked and pipelined; plus make_ucx_collective.
#include "desloc/transport/ucx_collective.hpp"

#include <fmt/format.h>
#include <ucp/api/ucp.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <algorithm>
#include <csignal>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/chunk_header.hpp"
#include "desloc/transport/ring_order.hpp"
#include "desloc/transport/tcp_backlog.hpp"
#include "ucx_context.hpp"
#include "ucx_endpoint.hpp"
#include "ucx_status.hpp"
#include "ucx_transfer.hpp"
#include "ucx_worker.hpp"

namespace desloc::transport::ucx {
namespace {

// A context and worker waiting for their group (open_ucx_port).
class UcxPortImpl final : public UcxPort {
 public:
  explicit UcxPortImpl(const UcxOptions& ucx)
      : ucx_(ucx),
        context_(ucx),
        worker_(context_, ucx.spin_iterations, std::chrono::microseconds(ucx.linger_us)) {}
  WorkerAddress address() const override { return worker_.address(); }

  UcxOptions ucx_;
  UcxContext context_;
  UcxWorker worker_;
};

class UcxCollective final : public Collective {
 public:
  // `port` is null when size == 1.
  UcxCollective(int rank, int size, std::unique_ptr<UcxPortImpl> port,
                const WorkerAddress& successor, const CollectiveOptions& options)
      : rank_(rank), size_(size), options_(options) {
    chunk_bytes_ =
        std::max<std::size_t>(sizeof(float), options.chunk_bytes / sizeof(float) * sizeof(float));
    window_ = std::max<std::size_t>(1, options.max_inflight_chunks);
    if (size_ == 1) return;
    const bool detect = port->ucx_.peer_failure_detection;
    context_.emplace(std::move(port->context_));
    worker_.emplace(std::move(port->worker_));
    right_.emplace(*worker_, successor, mod(rank_ + 1, size_), detect);
  }

  ~UcxCollective() override {
    if (!stuck_ && right_ &&
        !right_->close(/*force=*/!broken_.empty() || right_->error() != UCS_OK))
      stuck_ = true;
    if (stuck_) {
      // UCX 1.13 asserts (or, without assertions, frees memory still in use) when a worker
      // is destroyed with requests in flight, which a cut link leaves behind: the kernel
      // still retries the sends. Keep the context, worker, endpoint and transfer records
      // alive, never progressed again, until the process exits.
      log::warn(
          "rank {}: keeping a broken UCX group's resources until exit ({} requests, or "
          "the endpoint close, still in flight after the abort)",
          rank_, std::count_if(transfers_.begin(), transfers_.end(), [](const Transfer& t) {
            return t.pending();
          }));
      [[maybe_unused]] Resources* kept = res_.release();  // intentionally leaked
#if defined(__SANITIZE_ADDRESS__)
      __lsan_ignore_object(kept);  // a root for LeakSanitizer, with what UCX hangs off it
#endif
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const ByteCounters& bytes() const override { return counters_; }
  void reset_bytes() override { counters_ = {}; }
  void set_label(const OpLabel& label) override { label_ = label; }
  FailureEvidence failure_evidence() const override { return evidence_; }

  void all_reduce_sum(std::span<float> data) override {
    OpState op = begin(CollectiveOp::kAllReduce);
    op.base = reinterpret_cast<const std::byte*>(data.data());
    guarded(op, [&] {
      if (size_ == 1 || data.empty()) return;
      const int n = size_;
      const std::size_t chunk_elems = chunk_bytes_ / sizeof(float);
      auto* base = reinterpret_cast<std::byte*>(data.data());
      check_chunks(op, (segment(data.size(), n, 0).count + chunk_elems - 1) / chunk_elems);
      // Step g < n-1 (reduce-scatter) sends segment r-g and sums segment r-g-1 into place;
      // step g = n-1+t (all-gather) sends segment r+1-t and stores segment r-t. After step n-2
      // this rank holds the full sum of segment r+1.
      auto recv_segment = [&](int g) {
        return g < n - 1 ? mod(rank_ - g - 1, n) : mod(rank_ - (g - (n - 1)), n);
      };
      std::vector<SendUnit> first;
      const Range mine = segment(data.size(), n, rank_);
      for (std::size_t c = 0; c * chunk_elems < mine.count; ++c) {
        const std::size_t off = mine.offset + c * chunk_elems;
        first.push_back({0, c, base + off * sizeof(float),
                         std::min(chunk_elems, mine.count - c * chunk_elems) * sizeof(float)});
      }
      std::vector<RecvUnit> units;
      for (int g = 0; g < 2 * (n - 1); ++g) {
        const Range seg = segment(data.size(), n, recv_segment(g));
        for (std::size_t c = 0; c * chunk_elems < seg.count; ++c) {
          const std::size_t off = seg.offset + c * chunk_elems;
          RecvUnit u;
          u.step = g;
          u.chunk = c;
          u.dst = base + off * sizeof(float);
          u.bytes = std::min(chunk_elems, seg.count - c * chunk_elems) * sizeof(float);
          u.reduce = g < n - 1;
          u.forward = g + 1 < 2 * (n - 1);
          // All-gather step t overwrites the segment this rank sent at reduce-scatter step t.
          u.guard_send_step = g < n - 1 ? -1 : g - (n - 1);
          units.push_back(u);
        }
      }
      run_ring(op, first, units);
    });
  }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    const std::size_t block = mine.size();
    if (all.size() != block * static_cast<std::size_t>(size_)) {
      throw Error("all_gather: output holds " + std::to_string(all.size()) + " bytes but " +
                  std::to_string(size_) + " ranks x " + std::to_string(block) +
                  " bytes are gathered; size the output as size() * mine.size()");
    }
    OpState op = begin(CollectiveOp::kAllGather);
    op.base = all.data();
    guarded(op, [&] {
      std::byte* my_block = all.data() + static_cast<std::size_t>(rank_) * block;
      if (block != 0 && my_block != mine.data()) std::memmove(my_block, mine.data(), block);
      if (size_ == 1 || block == 0) return;
      gather_blocks(op, all, block);
    });
  }

  void broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size_) {
      throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this " +
                  std::to_string(size_) + "-rank group");
    }
    OpState op = begin(CollectiveOp::kBroadcast);
    op.root = root;
    op.base = data.data();
    guarded(op, [&] {
      if (size_ == 1 || data.empty()) return;
      // The payload travels root -> root+1 -> ... -> root-1, chunk by chunk.
      const int position = mod(rank_ - root, size_);
      std::vector<SendUnit> first;
      std::vector<RecvUnit> units;
      for (std::size_t c = 0; c * chunk_bytes_ < data.size(); ++c) {
        std::byte* p = data.data() + c * chunk_bytes_;
        const std::size_t bytes = std::min(chunk_bytes_, data.size() - c * chunk_bytes_);
        if (position == 0) {
          first.push_back({0, c, p, bytes});
        } else {
          RecvUnit u;
          u.step = position - 1;
          u.chunk = c;
          u.dst = p;
          u.bytes = bytes;
          u.forward = position < size_ - 1;
          units.push_back(u);
        }
      }
      check_chunks(op, (data.size() + chunk_bytes_ - 1) / chunk_bytes_);
      run_ring(op, first, units);
    });
  }

  void reduce_scatter_encoded(std::span<std::byte> segments, std::size_t segment_bytes,
                              std::size_t piece_bytes, const EncodedCombine& combine) override {
    if (segments.size() != segment_bytes * static_cast<std::size_t>(size_) || piece_bytes == 0)
      throw Error("reduce_scatter_encoded: " + std::to_string(segments.size()) + " bytes for " +
                  std::to_string(size_) + " segments of " + std::to_string(segment_bytes) +
                  " bytes in pieces of " + std::to_string(piece_bytes));
    OpState op = begin(CollectiveOp::kAllReduce);
    op.base = segments.data();
    guarded(op, [&] {
      if (size_ == 1 || segment_bytes == 0) return;
      const int n = size_;
      const std::size_t pieces = (segment_bytes + piece_bytes - 1) / piece_bytes;
      check_chunks(op, pieces);
      auto piece = [&](int seg, std::size_t c) {
        return std::pair{
            segments.data() + static_cast<std::size_t>(seg) * segment_bytes + c * piece_bytes,
            std::min(piece_bytes, segment_bytes - c * piece_bytes)};
      };
      // Step g sends segment r - g (at g = 0 this rank's own) and combines segment r - g - 1.
      std::vector<SendUnit> first;
      for (std::size_t c = 0; c < pieces; ++c) {
        const auto [p, bytes] = piece(rank_, c);
        first.push_back({0, c, p, bytes});
      }
      std::vector<RecvUnit> units;
      for (int g = 0; g < n - 1; ++g)
        for (std::size_t c = 0; c < pieces; ++c) {
          RecvUnit u;
          u.step = g;
          u.chunk = c;
          u.segment = mod(rank_ - g - 1, n);
          std::tie(u.dst, u.bytes) = piece(u.segment, c);
          u.reduce = true;
          u.combine = true;
          u.forward = g + 1 < n - 1;
          units.push_back(u);
        }
      run_ring(op, first, units, &combine);
    });
  }

  void barrier() override {
    OpState op = begin(CollectiveOp::kBarrier);
    guarded(op, [&] {
      if (size_ == 1) return;
      // An all-gather of one byte per rank: rank r finishes only after rank r-(n-1)'s token has
      // passed through every rank, i.e. after all ranks entered.
      std::vector<std::byte> tokens(static_cast<std::size_t>(size_));
      op.base = tokens.data();
      gather_blocks(op, tokens, 1);
    });
  }

 private:
  OpState begin(CollectiveOp op) {
    if (!broken_.empty()) {
      throw TransportError("rank " + std::to_string(rank_) + ": " + std::string(op_name(op)) +
                           " refused: this group failed earlier (" + broken_ +
                           "); rebuild it in a new membership epoch");
    }
    transfers_.clear();  // everything from the previous operation has completed
    OpState s;
    s.op = op;
    s.seq = seq_++;
    s.start = Clock::now();
    s.deadline = s.start + options_.deadline;
    s.looked = s.start;
    s.label = label_;
    return s;
  }

  template <class Body>
  void guarded(const OpState& op, Body&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      note_evidence(op);
      abort_inflight(e.what());
      throw;
    }
    ++counters_[op.op].calls;
  }

  void check_chunks(const OpState& op, std::size_t chunks) const {
    if (chunks > kMaxChunks) {
      throw Error(std::string(op_name(op.op)) + ": " + std::to_string(chunks) +
                  " chunks per segment exceed the tag's " + std::to_string(kMaxChunks) +
                  "; raise chunk_bytes");
    }
  }

  // Ring all-gather of `block`-byte blocks already placed at all[rank * block].
  void gather_blocks(OpState& op, std::span<std::byte> all, std::size_t block) {
    const int n = size_;
    std::vector<SendUnit> first;
    std::vector<RecvUnit> units;
    std::byte* mine = all.data() + static_cast<std::size_t>(rank_) * block;
    for (std::size_t c = 0; c * chunk_bytes_ < block; ++c) {
      first.push_back(
          {0, c, mine + c * chunk_bytes_, std::min(chunk_bytes_, block - c * chunk_bytes_)});
    }
    // Step s stores block r-s-1 and passes it on at step s+1 (until it has visited n-1 ranks).
    for (int s = 0; s < n - 1; ++s) {
      std::byte* dst = all.data() + static_cast<std::size_t>(mod(rank_ - s - 1, n)) * block;
      for (std::size_t c = 0; c * chunk_bytes_ < block; ++c) {
        RecvUnit u;
        u.step = s;
        u.chunk = c;
        u.dst = dst + c * chunk_bytes_;
        u.bytes = std::min(chunk_bytes_, block - c * chunk_bytes_);
        u.forward = s + 1 < n - 1;
        units.push_back(u);
      }
    }
    check_chunks(op, (block + chunk_bytes_ - 1) / chunk_bytes_);
    run_ring(op, first, units);
  }

  // The pipeline shared by every ring operation: post `first` sends, keep up to window_
  // receives posted ahead, and as each receive lands (in order) sum or store it, then forward
  // it to the successor at the next step. Finishes when every send has completed.
  void run_ring(const OpState& op, const std::vector<SendUnit>& first,
                const std::vector<RecvUnit>& units, const EncodedCombine* combine = nullptr) {
    if (static_cast<int>(units.size() > 0 ? units.back().step + 2 : 1) > kMaxSteps) {
      throw Error(std::string(op_name(op.op)) + ": too many ring steps for the tag layout");
    }
    std::map<std::pair<int, std::size_t>, Transfer*> sends;
    for (const SendUnit& s : first)
      sends[{s.step, s.chunk}] = &post_send(op, s.src, s.bytes, s.step, s.chunk);

    const bool any_reduce =
        std::any_of(units.begin(), units.end(), [](const RecvUnit& u) { return u.reduce; });
    // Scratch slots hold one received chunk each: chunk_bytes_, or the largest piece of an
    // encoded reduce-scatter.
    std::size_t slot_bytes = chunk_bytes_;
    for (const RecvUnit& u : units) slot_bytes = std::max(slot_bytes, u.bytes);
    const std::size_t slot = (slot_bytes + sizeof(float) - 1) / sizeof(float);  // floats
    if (any_reduce && !options_.chunk_headers && scratch_.size() < window_ * slot)
      scratch_.resize(window_ * slot);
    std::vector<Transfer*> recvs(units.size(), nullptr);
    std::size_t posted = 0;
    // Fault injection (CollectiveOptions::crash_in), decided once per operation: the unit
    // after which this rank dies, or none.
    const std::size_t crash_after =
        options_.crash_in.step >= 0 && op.op == CollectiveOp::kAllReduce &&
                op.label.step == options_.crash_in.step && op.label.state == options_.crash_in.state
            ? units.size() / 2
            : 0;
    // A unit whose guard send is still in flight is not posted yet, so that receives for the
    // earlier units keep flowing; it is waited for only when the loop reaches it.
    auto guard_of = [&](const RecvUnit& u) -> Transfer* {
      if (u.guard_send_step < 0) return nullptr;
      auto it = sends.find({u.guard_send_step, u.chunk});
      return it == sends.end() ? nullptr : it->second;
    };
    auto post_one = [&] {
      const RecvUnit& u = units[posted];
      void* dst = u.reduce ? static_cast<void*>(scratch_.data() + (posted % window_) * slot)
                           : static_cast<void*>(u.dst);
      recvs[posted] = &post_recv(op, dst, u.bytes, u.step, u.chunk);
      ++posted;
    };
    auto post_ready = [&](std::size_t limit) {
      limit = std::min(limit, units.size());
      while (posted < limit) {
        const Transfer* guard = guard_of(units[posted]);
        if (guard != nullptr && guard->pending()) break;
        post_one();
      }
    };
    post_ready(window_);

    for (std::size_t k = 0; k < units.size(); ++k) {
      const RecvUnit& u = units[k];
      if (posted == k) {
        if (Transfer* guard = guard_of(u)) wait_send(op, *guard, u.guard_send_step, u.chunk);
        post_one();
      }
      // With chunk headers the payload sits verified in the transfer's staging buffer.
      const std::byte* payload = wait_recv(op, *recvs[k], u);
      if (u.reduce && u.combine) {
        const auto* src =
            payload != nullptr
                ? payload
                : reinterpret_cast<const std::byte*>(scratch_.data() + (k % window_) * slot);
        (*combine)(u.segment, u.chunk, {src, u.bytes}, {u.dst, u.bytes});
      } else if (u.reduce) {
        auto* dst = reinterpret_cast<float*>(u.dst);
        const float* src = payload != nullptr ? reinterpret_cast<const float*>(payload)
                                              : scratch_.data() + (k % window_) * slot;
        const std::size_t count = u.bytes / sizeof(float);
        for (std::size_t i = 0; i < count; ++i) dst[i] += src[i];
      } else if (payload != nullptr && u.bytes != 0) {
        std::memcpy(u.dst, payload, u.bytes);
      }
      if (payload != nullptr) std::vector<std::byte>().swap(recvs[k]->staging);
      // Fault injection: die at the end of the reduce-scatter, before forwarding the shard it
      // completed, so its successor can never finish. (Later, an eager send of the last
      // forward may already sit in the peer's socket, and the others would finish whole.)
      if (k + 1 == crash_after) {
        log::warn(
            "rank {}: fault injection: killing this process halfway through {} #{} (step "
            "{}, state {})",
            rank_, op_name(op.op), op.seq, op.label.step, int(op.label.state));
        ::raise(SIGKILL);
      }
      if (u.forward)
        sends[{u.step + 1, u.chunk}] = &post_send(op, u.dst, u.bytes, u.step + 1, u.chunk);
      post_ready(k + 1 + window_);
    }
    for (auto& [key, t] : sends) wait_send(op, *t, key.first, key.second);
  }

  Transfer& post_send(const OpState& op, const void* src, std::size_t bytes, int step,
                      std::size_t chunk) {
    Transfer& t = transfers_.emplace_back();
    t.posted = Clock::now();
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = &on_send_done;
    params.user_data = &t;
    const void* wire = src;
    std::size_t wire_bytes = bytes;
    if (options_.chunk_headers) {
      ChunkHeader h = header_for(op, step, static_cast<const std::byte*>(src), bytes);
      h.crc = payload_crc(static_cast<const std::byte*>(src), bytes);
      t.staging.resize(kHeaderBytes + bytes);
      std::memcpy(t.staging.data(), &h, kHeaderBytes);
      if (bytes != 0) std::memcpy(t.staging.data() + kHeaderBytes, src, bytes);
      wire = t.staging.data();
      wire_bytes = t.staging.size();
    }
    ucs_status_ptr_t r = ucp_tag_send_nbx(right_->get(), wire, wire_bytes,
                                          make_tag(op.op, op.seq, step, chunk), &params);
    counters_[op.op].sent += bytes;
    if (r == nullptr) {
      t.status = UCS_OK;
      t.done = t.posted;
      std::vector<std::byte>().swap(t.staging);
    } else if (UCS_PTR_IS_ERR(r)) {
      t.status = UCS_PTR_STATUS(r);
      DESLOC_UCX_CHECK(t.status, describe(op, "sending to", right_->peer_rank(), step, chunk));
    } else {
      t.request = r;
    }
    return t;
  }

  Transfer& post_recv(const OpState& op, void* dst, std::size_t bytes, int step,
                      std::size_t chunk) {
    Transfer& t = transfers_.emplace_back();
    t.is_recv = true;
    ucp_request_param_t params{};
    // No immediate completion: UCX 1.13 does not report the length of a message matched at
    // once from the unexpected queue, and the length check needs it. The callback always does.
    params.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    params.cb.recv = &on_recv_done;
    params.user_data = &t;
    if (options_.chunk_headers) {
      t.staging.resize(kHeaderBytes + bytes);
      dst = t.staging.data();
      bytes = t.staging.size();
    }
    ucs_status_ptr_t r = ucp_tag_recv_nbx(
        worker_->get(), dst, bytes, make_tag(op.op, op.seq, step, chunk), kFullTagMask, &params);
    if (UCS_PTR_IS_ERR(r)) {
      t.status = UCS_PTR_STATUS(r);
      DESLOC_UCX_CHECK(t.status, describe(op, "receiving from", left(), step, chunk));
    } else {
      t.request = r;
    }
    return t;
  }

  // Returns the verified payload inside t.staging with chunk headers, nullptr without.
  const std::byte* wait_recv(const OpState& op, Transfer& t, const RecvUnit& u) {
    wait(op, t);
    if (t.pending()) {
      throw TimeoutError(describe(op, "waiting for", left(), u.step, u.chunk) +
                         " (ring predecessor)" + stall_hint(op, u.step) +
                         ": check that it is alive and calls the same "
                         "collectives in the same order");
    }
    if (t.status == UCS_ERR_MESSAGE_TRUNCATED) {
      throw PeerFailure(describe(op, "receiving from", left(), u.step, u.chunk) +
                        ": it sent more than the expected " + std::to_string(u.bytes) +
                        " bytes; the ranks disagree on the buffer length");
    }
    DESLOC_UCX_CHECK(t.status, describe(op, "receiving from", left(), u.step, u.chunk));
    const std::size_t expected = u.bytes + (options_.chunk_headers ? kHeaderBytes : 0);
    if (t.info.length != expected) {
      throw PeerFailure(describe(op, "receiving from", left(), u.step, u.chunk) + ": got " +
                        std::to_string(t.info.length) + " bytes, expected " +
                        std::to_string(expected) + "; the ranks disagree on the buffer length");
    }
    counters_[op.op].received += u.bytes;
    if (!options_.chunk_headers) return nullptr;
    return verify_chunk(op, t, u);
  }

  ChunkHeader header_for(const OpState& op, int ring_step, const std::byte* payload,
                         std::size_t bytes) const {
    ChunkHeader h;
    h.op = static_cast<std::uint8_t>(op.op);
    h.state = op.label.state;
    h.ring_step = static_cast<std::uint16_t>(ring_step);
    h.epoch = options_.epoch;
    h.step = op.label.step;
    h.shard = op.label.shard;
    h.length = static_cast<std::uint32_t>(bytes);
    h.offset = static_cast<std::uint64_t>(payload - op.base);
    h.seq = op.seq;
    return h;
  }

  // Checks every header field against what this rank expects at this point of the ring, and
  // the payload against its CRC32C. Nothing of a chunk that fails is used.
  const std::byte* verify_chunk(const OpState& op, const Transfer& t, const RecvUnit& u) const {
    ChunkHeader got;
    std::memcpy(&got, t.staging.data(), kHeaderBytes);
    const ChunkHeader want = header_for(op, u.step, u.dst, u.bytes);
    const std::byte* payload = t.staging.data() + kHeaderBytes;
    const std::string bad = check_chunk(want, got, {payload, u.bytes});
    if (!bad.empty())
      throw PeerFailure(describe(op, "receiving from", left(), u.step, u.chunk) + ": " + bad);
    return payload;
  }

  void wait_send(const OpState& op, Transfer& t, int step, std::size_t chunk) {
    wait(op, t);
    if (t.pending()) {
      throw TimeoutError(describe(op, "waiting for", right_->peer_rank(), step, chunk) +
                         " (ring successor) to take its data: check that it is alive and calls the "
                         "same collectives in the same order");
    }
    DESLOC_UCX_CHECK(t.status, describe(op, "sending to", right_->peer_rank(), step, chunk));
  }

  // Progresses until t completes, the deadline passes, or (for a send) UCX reports the
  // successor failed. A receive comes from the predecessor, so the successor's failure is no
  // reason to stop waiting for it: the successor may simply have finished and left.
  void wait(const OpState& op, Transfer& t) {
    auto successor_failed = [&] { return !t.is_recv && right_->error() != UCS_OK; };
    bool aborted = false;
    auto abort_requested = [&] {
      return options_.should_abort && (aborted = aborted || options_.should_abort());
    };
    worker_->wait_until(
        [&] {
          sample_backlog(op);
          return !t.pending() || successor_failed() || abort_requested();
        },
        op.deadline, op.looked);
    if (t.pending() && aborted) {
      throw PeerFailure("rank " + std::to_string(rank_) + ": " + std::string(op_name(op.op)) +
                        " #" + std::to_string(op.seq) +
                        " aborted: the coordinator closed membership epoch " +
                        std::to_string(options_.epoch) + " (a peer failed)");
    }
    if (t.pending() && successor_failed()) {
      throw PeerFailure("rank " + std::to_string(rank_) + ": " + std::string(op_name(op.op)) +
                        " #" + std::to_string(op.seq) + ": the connection to " +
                        peer_name(right_->peer_rank()) + " (ring successor) failed: " +
                        status_text(right_->error()) + "; that rank has probably exited");
    }
  }

  std::string describe(const OpState& op, const char* verb, int peer, int step,
                       std::size_t chunk) const {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - op.start);
    return "rank " + std::to_string(rank_) + ": " + std::string(op_name(op.op)) + " #" +
           std::to_string(op.seq) + " gave up after " + std::to_string(waited.count()) + " ms " +
           verb + " " + peer_name(peer) + ", ring step " + std::to_string(step) + " chunk " +
           std::to_string(chunk);
  }

  // In a ring stage every rank sends its own first chunk unconditionally, so a rank stuck at
  // step s heard everything up to s-1 and the chain breaks s+1 hops upstream. A slow link
  // stalls every rank too, where the hops say nothing: the coordinator's straggler rule finds
  // it from the ranks' TCP backlogs.
  std::string stall_hint(const OpState& op, int step) const {
    if (op.op == CollectiveOp::kBroadcast) {
      return "; the payload comes from root " + peer_name(op.root);
    }
    if (step >= size_ - 1) return {};
    return "; unless a link is slow, the stall starts at " +
           peer_name(mod(rank_ - 1 - step, size_)) + ", which has not sent its first chunk";
  }

  int left() const { return mod(rank_ - 1, size_); }

  std::string peer_name(int peer) const {
    const auto i = static_cast<std::size_t>(peer);
    if (i < options_.peer_names.size() && !options_.peer_names[i].empty())
      return "rank " + std::to_string(peer) + " (" + options_.peer_names[i] + ")";
    return "rank " + std::to_string(peer);
  }

  // The TCP backlog while an operation waits: every kBacklogEvery once it has run for
  // kBacklogAfter, the longest of the last deadline kept. At the failure itself the evidence
  // may be gone: a peer whose deadline passed first aborts, which resets its connections, and a
  // reset socket never delivers what it held (tcp_backlog leaves it out). It may also be in the
  // operation before: a rank whose part of the failed one completed went on to the next.
  static constexpr std::chrono::milliseconds kBacklogAfter{500};
  static constexpr std::chrono::milliseconds kBacklogEvery{250};
  void sample_backlog(const OpState& op) {
    const auto now = Clock::now();
    if (now - op.start < kBacklogAfter || now < next_backlog_sample_) return;
    next_backlog_sample_ = now + kBacklogEvery;
    const TcpBacklog b = tcp_backlog();
    if (b.drain >= peak_backlog_.drain || now - peak_backlog_at_ > options_.deadline) {
      peak_backlog_ = b;
      peak_backlog_at_ = now;
    }
  }

  // The straggler rule's evidence, before the abort fails what is in flight.
  void note_evidence(const OpState& op) {
    using std::chrono::duration_cast, std::chrono::milliseconds;
    const auto now = Clock::now();
    evidence_.in_operation = duration_cast<milliseconds>(now - op.start);
    for (const Transfer& t : transfers_) {
      if (t.is_recv) continue;
      const auto waited = duration_cast<milliseconds>((t.pending() ? now : t.done) - t.posted);
      evidence_.send_wait = std::max(evidence_.send_wait, waited);
    }
    TcpBacklog backlog = tcp_backlog();
    if (peak_backlog_.drain > backlog.drain && now - peak_backlog_at_ <= options_.deadline)
      backlog = peak_backlog_;
    evidence_.backlog = backlog.drain;
    evidence_.backlog_peer = backlog.drain_peer;
  }

  // After a failure: cancel our receives, force-close the endpoint (failing its sends), and let
  // UCX finish those requests so no callback outlives the buffers. The group stays unusable.
  void abort_inflight(const std::string& reason) noexcept {
    broken_ = reason.empty() ? std::string("unknown failure") : reason;
    if (!worker_) return;
    for (Transfer& t : transfers_) {
      if (t.pending() && t.is_recv && t.request != nullptr)
        ucp_request_cancel(worker_->get(), t.request);
    }
    if (right_ && !right_->close(/*force=*/true, std::chrono::milliseconds(1000))) stuck_ = true;
    try {
      const bool drained = worker_->wait_until(
          [&] {
            return std::none_of(transfers_.begin(), transfers_.end(),
                                [](const Transfer& t) { return t.pending(); });
          },
          Clock::now() + std::chrono::milliseconds(1000));
      if (!drained) {
        stuck_ = true;
        log::warn("rank {}: some UCX requests were still pending after aborting", rank_);
      }
    } catch (const std::exception& e) {
      log::warn("rank {}: draining UCX requests after a failure: {}", rank_, e.what());
    }
  }

  int rank_;
  int size_;
  CollectiveOptions options_;
  std::size_t chunk_bytes_ = 0;
  std::size_t window_ = 1;
  std::uint32_t seq_ = 0;
  OpLabel label_;
  ByteCounters counters_;
  std::string broken_;        // why the group became unusable; empty while healthy
  FailureEvidence evidence_;  // of the operation that broke the group
  TcpBacklog peak_backlog_;   // the longest sample_backlog saw within a deadline
  Clock::time_point peak_backlog_at_{};
  Clock::time_point next_backlog_sample_{};
  std::vector<float> scratch_;
  // The UCX resources live on the heap so that a group whose abort left requests in flight
  // can leak them instead of destroying them under UCX (see the destructor). Declaration order
  // is teardown order in reverse: endpoint, worker, context, then the transfer records UCX
  // callbacks may still write to while the worker is destroyed.
  struct Resources {
    std::deque<Transfer> transfers;
    std::optional<UcxContext> context;
    std::optional<UcxWorker> worker;
    std::optional<UcxEndpoint> right;
  };
  std::unique_ptr<Resources> res_ = std::make_unique<Resources>();
  std::deque<Transfer>& transfers_ = res_->transfers;
  std::optional<UcxContext>& context_ = res_->context;
  std::optional<UcxWorker>& worker_ = res_->worker;
  std::optional<UcxEndpoint>& right_ = res_->right;
  bool stuck_ = false;  // requests were still in flight after an abort
};

}  // namespace
}  // namespace desloc::transport::ucx

namespace desloc::transport {

std::unique_ptr<Collective> make_ucx_collective(int rank, int size, AddressExchange& exchange,
                                                const CollectiveOptions& options,
                                                const UcxOptions& ucx) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("make_ucx_collective: rank " + std::to_string(rank) +
                " is outside a group of size " + std::to_string(size));
  }
  if (size == 1)
    return std::make_unique<ucx::UcxCollective>(0, 1, nullptr, WorkerAddress{}, options);
  auto port = std::make_unique<ucx::UcxPortImpl>(ucx);
  exchange.publish(rank, port->address());
  const WorkerAddress successor =
      exchange.lookup((rank + 1) % size, std::chrono::steady_clock::now() + options.deadline);
  return std::make_unique<ucx::UcxCollective>(rank, size, std::move(port), successor, options);
}

std::unique_ptr<UcxPort> open_ucx_port(const UcxOptions& ucx) {
  return std::make_unique<ucx::UcxPortImpl>(ucx);
}

std::unique_ptr<Collective> connect_ucx_collective(std::unique_ptr<UcxPort> port, int rank,
                                                   int size, const WorkerAddress& successor,
                                                   const CollectiveOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("connect_ucx_collective: rank " + std::to_string(rank) +
                " is outside a group of size " + std::to_string(size));
  if (size == 1)
    return std::make_unique<ucx::UcxCollective>(0, 1, nullptr, WorkerAddress{}, options);
  auto* impl = dynamic_cast<ucx::UcxPortImpl*>(port.get());
  if (impl == nullptr)
    throw Error("connect_ucx_collective: the port was not opened by open_ucx_port");
  port.release();
  return std::make_unique<ucx::UcxCollective>(rank, size, std::unique_ptr<ucx::UcxPortImpl>(impl),
                                              successor, options);
}

}  // namespace desloc::transport
