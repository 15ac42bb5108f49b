// Whole-job restart: every rank of a multi-process job offers the checkpoint steps it holds
// intact, and all of them agree on the newest step that every rank has, and say why newer
// steps were passed over.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "desloc/train/checkpoint.hpp"
#include "desloc/transport/collective.hpp"

namespace desloc::train {

// A rank offers at most this many of its newest valid steps, and at most this many of its
// newest rejected steps (with the first kResumeReasonBytes bytes of each reason). A rank with
// more valid checkpoints offers only its 64 newest, so a step older than every rank's 64th
// newest is never chosen even when all ranks still hold it.
inline constexpr std::size_t kResumeOfferSteps = 64;
inline constexpr std::size_t kResumeReasonBytes = 96;

struct ResumeAgreementOptions {
  // Site names by site index (the WAN group's rank); a site without a name is "site <s>".
  // Ranks are named "<site>/<r>" in messages, r being the rank within the site group.
  std::vector<std::string> site_names;
  // This rank's name, prefixed to the log lines (e.g. "east/1").
  std::string who;
  // log::info the chosen step and, for each newer step some rank holds, who lacks it.
  bool log = true;
  // The run this rank's metrics.jsonl records (recorded_run_id), 0 if none: a resume joins the
  // checkpoints to the history they continue.
  std::uint64_t history_run_id = 0;
};

// What a rank of a networked job brings to the start of a run, before it writes anything.
struct StartIntent {
  bool resume = false;                // given --resume
  bool force = false;                 // given --force
  std::uint32_t checkpoints = 0;      // step_*.ckpt entries in its checkpoint directory
  std::uint32_t metrics_records = 0;  // non-empty lines in its metrics.jsonl
  std::uint64_t run_id = 0;           // its draw of a fresh run's id (new_run_id())
  bool holds_results() const { return checkpoints > 0 || metrics_records > 0; }
};

// A random 64-bit run id, never 0 (0 stands for "unknown" in checkpoints and metrics).
std::uint64_t new_run_id();

// Called first by every rank of a networked job, --resume or not: every rank's intent travels
// through the site group, then the rank's WAN rings (the same all-gathers as the resume
// agreement, 24 bytes a rank), so every rank sees every rank's and takes the same decision.
// Throws ConfigError, on every rank alike, naming the ranks:
//   - when some ranks were given --resume and others were not (a rank that started fresh would
//     overwrite its results while its peers resumed: the run would mix two runs);
//   - when a rank without --resume and without --force holds another run's results (its
//     checkpoints and metrics would be overwritten).
// Returns the run id of a fresh start: the first rank's (site 0, rank 0) draw, on every rank.
std::uint64_t agree_on_start(const StartIntent& mine, transport::Collective* site_group,
                             std::span<transport::Collective* const> rings,
                             const ResumeAgreementOptions& options);

// The same refusal for one process (`desloc train`): ConfigError naming `dir` and its contents
// when intent holds results, is not a resume and is not forced.
void check_fresh_start(const StartIntent& intent, const std::string& dir);

struct ResumeChoice {
  // The newest step every rank offered as valid; nullopt when they share none. Identical on
  // every rank.
  std::optional<std::int64_t> step;
  // One line per newer step some rank holds (newest first, at most 8, then a count): which
  // ranks lack it (at most 6 named, then a count) and why, e.g. "step 400: east/1 has it corrupt
  // ('...' is corrupt: payload CRC32C mismatch)". Identical on every rank.
  std::vector<std::string> passed_over;
  // At least two newer steps are held intact by some ranks and absent (not even a corrupt
  // file) on others: the ranks' runs went apart (a site was dropped and stopped writing), and
  // resuming at `step` would discard the newer work. One such step is what a job killed while
  // its ranks wrote a checkpoint leaves, and a step some rank holds only corrupt (a torn
  // write) is the designed case for rolling back: neither counts.
  bool diverged = false;
  std::optional<std::int64_t> newest;  // the newest step any rank holds intact
  std::uint64_t run_id = 0;            // the run every rank's checkpoint at `step` belongs to
};

// Called by every rank of the job with its own scan (scan_checkpoints of its checkpoint dir).
// All-gathers inside the site group (nullptr when R = 1), then over the rank's WAN rings
// (transport::gather_job: the sites swap their rank counts, which may differ, then their
// ranks' offers), so each rank sees every rank's offer and decides alone, deterministically.
// Each operation is bounded by its group's CollectiveOptions::deadline (a
// TimeoutError names the awaited peer). Throws DataError if a peer's offer is malformed, and
// ConfigError (on every rank alike) when a rank's checkpoints were all written by another
// config, or when the checkpoints at the chosen step or the ranks' metrics name different runs.
// `mine` is scanned with this job's config hash (scan_checkpoints), so another config's files
// are rejected as `foreign`: they count as missing, not torn, for `diverged`.
ResumeChoice agree_on_resume_step(const CheckpointScan& mine, transport::Collective* site_group,
                                  std::span<transport::Collective* const> rings,
                                  const ResumeAgreementOptions& options);

}  // namespace desloc::train
