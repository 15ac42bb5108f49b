// The records of a run's metrics.jsonl, one struct per "type": written by the trainer
// (to_json) and read back by `desloc report` (report/records.hpp), so that both sides use the
// same fields. Non-finite numbers are written as null and read back as NaN.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace desloc::train {

struct RunRecord {  // the first line of a fresh run
  std::string name, method;
  int workers = 1;
  std::optional<std::int64_t> kx, ku, kv;  // null when the method has no such period
  std::string outer;
  std::uint64_t parameters = 0;
  int batch = 0, seq_len = 0;
  std::int64_t steps = 0;
  std::uint64_t config_hash = 0;
  std::uint64_t run_id = 0;  // the run's identity, which its checkpoints carry too
  std::string sites;         // comma-separated
  int ranks_per_site = 1;
  std::string rank;      // "site/r", or "all" in-process
  std::string wan_link;  // "west/0->east/0": the link this rank's wire bytes crossed
  std::string to_json() const;
};

struct TrainRecord {  // after every step
  std::int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;  // written with 7 significant digits
  double tokens_per_s = 0, step_ms = 0;
  // Of step_ms, the time the step waited in the sync engine: a blocking step's control exchange
  // and averages; with overlap the wait for averages still on the wire (at their fold, or for
  // the previous batch when a new one starts) and the snapshots.
  double sync_ms = 0;
  // The process's CPU during the step (every thread: the compute's, and the communication's
  // while it ran), and the communication threads' CPU since the run started (each thread's
  // added when it ends; 0 when averages block the step, which runs them on the compute's
  // thread): what averages in flight cost the compute.
  double cpu_ms = 0, comm_cpu_ms = 0;
  // The wall time the communication threads' averages spent on the wide-area wire since the run
  // started (0 when averages block): its growth over the run's time is how busy the links
  // were, against the plan's expectation.
  double wire_ms = 0;
  // Of wire_ms, the delayed batches' control exchanges: the wait for the other sites to reach
  // the batch's step, plus a round trip. wire_ms - control_ms is the averages' transfer.
  double control_ms = 0;
  std::uint64_t tokens = 0;
  std::size_t workers = 0;
  std::string synced;                         // the states averaged: "g", "x", "xu", "xuv"...
  std::array<std::uint64_t, 4> wire{};        // bytes sent, by optim::StateKind
  std::array<std::uint64_t, 4> payload{};     // bytes averaged, by optim::StateKind
  std::vector<std::uint64_t> wire_by_worker;  // every replica's total wire bytes
  std::vector<float> loss_by_site;            // exact (round-trips a float)
  // At a networked step whose averages opened with a control exchange: each live site's wait
  // there (ring order), the compute milliseconds the slowest site took since the exchange
  // before less its own (sync::Averager::take_waits); empty otherwise.
  std::vector<double> wait_ms_by_site;
  std::uint64_t site_bytes_sent = 0;  // the site group's bytes (networked)
  // With job.regions: the wide-area bytes of the averages inside the region (`wire` holds the
  // job-wide ones); bytes_sent_by_worker counts both.
  std::uint64_t region_bytes_sent = 0;
  std::string to_json() const;
};

struct EvalRecord {
  std::int64_t step = 0;
  double val_loss = 0;  // nats per token
  double eval_s = 0;
  std::size_t workers = 0;
  double val_bpb = 0;  // bits per byte of the text the targets stand for
  std::string to_json() const;
};

struct RecoveryRecord {  // a rollback into a new membership epoch
  std::int64_t step = 0, failed_step = 0;
  std::uint64_t epoch = 0;
  int sites = 0;
  std::int64_t replayed_steps = 0;
  double recover_s = 0;
  std::uint64_t bytes_resent = 0;
  std::string to_json() const;
};

struct RejoinRecord {  // this site came back and received the state
  std::int64_t step = 0;
  std::uint64_t epoch = 0;
  int sites = 0;
  std::uint64_t state_bytes = 0;
  double transfer_s = 0;
  std::string to_json() const;
};

struct ReplanRecord {  // sync.replan: every site switched periods after this step's average
  std::int64_t step = 0;
  std::int64_t kx = 0, ku = 0, kv = 0;  // the new periods
  std::int64_t old_kx = 0;
  double state_s = 0;      // the measured wide-area average of one state
  double compute_s = 0;    // one step's compute then (the slowest site)
  double reference_s = 0;  // what the old periods were chosen at
  double bytes_per_s = 0;  // wide-area bytes a site sent per second of averaging (slowest)
  double overhead = 0;     // predicted at the new periods
  double target = 0;
  double predicted_step_s = 0;
  std::string reason;
  std::string to_json() const;
};

struct RejectionRecord {  // the payload guard left a site out of an average
  std::int64_t step = 0;
  std::string state, site, reason;
  std::string to_json() const;
};

struct JoinRecord {  // in-process elastic join
  std::int64_t step = 0;
  std::size_t workers_before = 0, workers_after = 0;
  std::string to_json() const;
};

}  // namespace desloc::train
