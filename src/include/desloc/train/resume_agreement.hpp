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
};

struct ResumeChoice {
  // The newest step every rank offered as valid; nullopt when they share none. Identical on
  // every rank.
  std::optional<std::int64_t> step;
  // One line per newer step some rank holds (newest first, at most 8, then a count): which
  // ranks lack it (at most 6 named, then a count) and why, e.g. "step 400: east/1 has it corrupt
  // ('...' is corrupt: payload CRC32C mismatch)". Identical on every rank.
  std::vector<std::string> passed_over;
};

// Called by every rank of the job with its own scan (scan_checkpoints of its checkpoint dir).
// Two all-gathers: the R ranks of the site group (nullptr when R = 1), then the sites of
// the WAN group (rank r of every site; nullptr when there is one site), carrying every rank's
// offer, so each rank sees all S x R offers and decides alone, deterministically. One more
// 4-byte all-gather on the WAN group first checks that every site has the same R (ConfigError
// otherwise). Each operation is bounded by its group's CollectiveOptions::deadline (a
// TimeoutError names the awaited peer). Throws DataError if a peer's offer is malformed.
ResumeChoice agree_on_resume_step(const CheckpointScan& mine, transport::Collective* site_group,
                                  transport::Collective* wan_group,
                                  const ResumeAgreementOptions& options);

}  // namespace desloc::train
