// Agreement on the checkpoint step a restarted multi-process job resumes from: each rank's
// offer travels in a fixed-size block through the site group, then the WAN group, and every
// rank intersects the same S x R offers.
#include "desloc/train/resume_agreement.hpp"

#include "desloc/transport/job_gather.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::train {
namespace {

// Offer block (little-endian, kOfferBytes bytes, the same size on every rank):
//   u32 magic "DSRB" | u32 n_valid | u32 n_rejected | u32 reserved | u64 history run id
//   | i64[K] valid steps, newest first | u64[K] their run ids
//   | i64[K] rejected steps, newest first | u8[K] 1 where written by another config
//   | char[K][kResumeReasonBytes] rejection reasons, NUL-padded
constexpr std::uint32_t kOfferMagic = 0x42525344;  // "DSRB"
constexpr std::size_t K = kResumeOfferSteps;
constexpr std::size_t kOfferHeaderBytes = 24;
constexpr std::size_t kValidAt = kOfferHeaderBytes;
constexpr std::size_t kRunIdsAt = kValidAt + K * 8;
constexpr std::size_t kRejectedAt = kRunIdsAt + K * 8;
constexpr std::size_t kForeignAt = kRejectedAt + K * 8;
constexpr std::size_t kReasonsAt = kForeignAt + K;
constexpr std::size_t kOfferBytes = kReasonsAt + K * kResumeReasonBytes;
constexpr std::size_t kMaxPassedOverLines = 8;
constexpr std::size_t kMaxNamesPerLine = 6;

struct Rejection {
  std::int64_t step = 0;
  std::string reason;
  bool foreign = false;  // intact, but written by a job of another config
};
struct Offer {
  std::uint32_t n_valid = 0;
  std::uint64_t history_run_id = 0;    // of the rank's metrics.jsonl; 0 = unknown
  std::vector<std::int64_t> valid;     // newest first
  std::vector<std::uint64_t> run_ids;  // of each valid step; 0 = unknown
  std::vector<Rejection> rejected;     // newest first
  std::uint64_t run_id_at(std::int64_t step) const {
    for (std::size_t i = 0; i < valid.size(); ++i)
      if (valid[i] == step) return run_ids[i];
    return 0;
  }
};

template <class T>
void put(std::vector<std::byte>& block, std::size_t at, T value) {
  std::memcpy(block.data() + at, &value, sizeof(T));
}
template <class T>
T get(std::span<const std::byte> block, std::size_t at) {
  T value;
  std::memcpy(&value, block.data() + at, sizeof(T));
  return value;
}

// The reason without the leading "'<path>' ", which the receiver cannot use.
std::string short_reason(const RejectedCheckpoint& r) {
  const std::string quoted = "'" + r.path + "' ";
  std::string reason = r.reason.starts_with(quoted) ? r.reason.substr(quoted.size()) : r.reason;
  if (reason.size() > kResumeReasonBytes) reason = reason.substr(0, kResumeReasonBytes - 3) + "...";
  return reason;
}

std::vector<std::byte> encode_offer(const CheckpointScan& scan, std::uint64_t history_run_id) {
  std::vector<std::pair<std::int64_t, std::uint64_t>> steps;  // (step, run id)
  for (const auto& v : scan.valid) steps.emplace_back(v.step, v.run_id);
  std::sort(steps.begin(), steps.end(), std::greater<>());
  steps.erase(std::unique(steps.begin(), steps.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              steps.end());
  if (steps.size() > K) steps.resize(K);
  std::vector<std::int64_t> valid;
  for (const auto& [step, run] : steps) valid.push_back(step);
  // A step that has both a valid and a rejected file (two spellings of one step) is valid.
  std::vector<const RejectedCheckpoint*> rejected;
  for (const auto& r : scan.rejected)
    if (std::find(valid.begin(), valid.end(), r.step) == valid.end() &&
        std::none_of(rejected.begin(), rejected.end(),
                     [&](const RejectedCheckpoint* o) { return o->step == r.step; }))
      rejected.push_back(&r);
  std::sort(
      rejected.begin(), rejected.end(),
      [](const RejectedCheckpoint* a, const RejectedCheckpoint* b) { return a->step > b->step; });
  if (rejected.size() > K) rejected.resize(K);

  std::vector<std::byte> block(kOfferBytes);
  put<std::uint32_t>(block, 0, kOfferMagic);
  put<std::uint32_t>(block, 4, static_cast<std::uint32_t>(valid.size()));
  put<std::uint32_t>(block, 8, static_cast<std::uint32_t>(rejected.size()));
  put<std::uint64_t>(block, 16, history_run_id);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    put<std::int64_t>(block, kValidAt + 8 * i, steps[i].first);
    put<std::uint64_t>(block, kRunIdsAt + 8 * i, steps[i].second);
  }
  for (std::size_t i = 0; i < rejected.size(); ++i) {
    put<std::int64_t>(block, kRejectedAt + 8 * i, rejected[i]->step);
    put<std::uint8_t>(block, kForeignAt + i, rejected[i]->foreign ? 1 : 0);
    const std::string reason = short_reason(*rejected[i]);
    std::memcpy(block.data() + kReasonsAt + kResumeReasonBytes * i, reason.data(), reason.size());
  }
  return block;
}

Offer decode_offer(std::span<const std::byte> block, const std::string& from) {
  auto bad = [&](const std::string& what) {
    return DataError(fmt::format(
        "resume agreement: the checkpoint offer from {} is malformed ({}); are all ranks "
        "running the same desloc build?",
        from, what));
  };
  if (get<std::uint32_t>(block, 0) != kOfferMagic) throw bad("wrong magic");
  Offer offer;
  offer.n_valid = get<std::uint32_t>(block, 4);
  offer.history_run_id = get<std::uint64_t>(block, 16);
  const auto n_rejected = get<std::uint32_t>(block, 8);
  if (offer.n_valid > K || n_rejected > K)
    throw bad(fmt::format("{} valid and {} rejected steps; at most {} each", offer.n_valid,
                          n_rejected, K));
  for (std::size_t i = 0; i < offer.n_valid; ++i) {
    const auto step = get<std::int64_t>(block, kValidAt + 8 * i);
    if (step < 0 || (!offer.valid.empty() && step >= offer.valid.back()))
      throw bad("valid steps are not distinct, non-negative and newest first");
    offer.valid.push_back(step);
    offer.run_ids.push_back(get<std::uint64_t>(block, kRunIdsAt + 8 * i));
  }
  for (std::size_t i = 0; i < n_rejected; ++i) {
    const char* reason =
        reinterpret_cast<const char*>(block.data() + kReasonsAt + kResumeReasonBytes * i);
    offer.rejected.push_back({get<std::int64_t>(block, kRejectedAt + 8 * i),
                              std::string(reason, strnlen(reason, kResumeReasonBytes)),
                              get<std::uint8_t>(block, kForeignAt + i) != 0});
  }
  return offer;
}

// Why `offer` (of rank `name`) lacks `step`.
std::string why_missing(const Offer& offer, std::int64_t step, const std::string& name) {
  for (const Rejection& r : offer.rejected)
    if (r.step == step) return fmt::format("{} has it but rejected it ({})", name, r.reason);
  if (offer.n_valid == K && step < offer.valid.back())
    return fmt::format("{} did not offer it (older than its {} newest valid checkpoints)", name, K);
  if (offer.valid.empty()) return fmt::format("{} has no valid checkpoint at all", name);
  return fmt::format("{} has no checkpoint at step {}", name, step);
}

// The site name of WAN rank s.
std::string site_name_of(const ResumeAgreementOptions& options, int s) {
  return static_cast<std::size_t>(s) < options.site_names.size()
             ? options.site_names[static_cast<std::size_t>(s)]
             : fmt::format("site {}", s);
}

// Phase 1 (the blocks of this site, in site-group rank order) and phase 2 (every site's
// blocks, in WAN-ring order) of both agreements (transport::gather_job: sites of unequal rank
// counts each send their own). With no ring: this process alone.
transport::JobBlocks gather_agreement(std::span<const std::byte> mine,
                                      transport::Collective* site_group,
                                      std::span<transport::Collective* const> rings) {
  if (rings.empty()) {
    transport::JobBlocks alone;
    alone.ranks = {1};
    alone.block = mine.size();
    alone.bytes.assign(mine.begin(), mine.end());
    return alone;
  }
  return transport::gather_job(mine, site_group, rings, {-1, transport::kLabelControl, 0});
}

// Start intent block (24 bytes): u32 magic "DSSU" | u8 resume | u8 force | u16 reserved
// | u32 checkpoints | u32 metrics records | u64 proposed run id.
constexpr std::uint32_t kIntentMagic = 0x55535344;  // "DSSU"
constexpr std::size_t kIntentBytes = 24;

std::string describe_results(std::uint32_t checkpoints, std::uint32_t records) {
  return fmt::format("{} checkpoint{}, {} metrics record{}", checkpoints,
                     checkpoints == 1 ? "" : "s", records, records == 1 ? "" : "s");
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kMaxNamesPerLine; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > kMaxNamesPerLine)
    out += fmt::format(" and {} more", names.size() - kMaxNamesPerLine);
  return out;
}

// Refuses, on every rank alike (each sees the same offers), a resume that would continue
// another job's checkpoints: a rank whose every checkpoint another config wrote (its directory
// replaced by another run's), or ranks whose checkpoints at the agreed step, or whose metrics,
// belong to different runs (one site's directory copied from another run of the same config).
// Returns the one run id the offers name (0 when none records one).
std::uint64_t agreed_run(const std::vector<Offer>& offers, const std::vector<std::string>& names,
                         std::optional<std::int64_t> step) {
  std::vector<std::string> foreign;
  for (std::size_t i = 0; i < offers.size(); ++i) {
    if (!offers[i].valid.empty()) continue;
    const auto it = std::find_if(offers[i].rejected.begin(), offers[i].rejected.end(),
                                 [](const Rejection& r) { return r.foreign; });
    if (it != offers[i].rejected.end())
      foreign.push_back(fmt::format("{} (its step {} {})", names[i], it->step, it->reason));
  }
  if (!foreign.empty())
    throw ConfigError(fmt::format(
        "--resume: {} {} no checkpoint of this job's config, so the job cannot continue: put "
        "back the rank's own checkpoints, or start the whole job afresh (without --resume, with "
        "--force to overwrite)",
        join_names(foreign), foreign.size() == 1 ? "holds" : "hold"));
  if (!step) return 0;
  std::map<std::uint64_t, std::vector<std::string>> runs;  // run id -> whose
  for (std::size_t i = 0; i < offers.size(); ++i) {
    if (const std::uint64_t id = offers[i].run_id_at(*step); id != 0)
      runs[id].push_back(fmt::format("{}'s checkpoint", names[i]));
    if (const std::uint64_t id = offers[i].history_run_id; id != 0)
      runs[id].push_back(fmt::format("{}'s metrics", names[i]));
  }
  if (runs.size() <= 1) return runs.empty() ? 0 : runs.begin()->first;
  std::string which;
  for (const auto& [id, whose] : runs)
    which += fmt::format("{}run {:016x}: {}", which.empty() ? "" : "; ", id, join_names(whose));
  throw ConfigError(fmt::format(
      "--resume: the ranks' checkpoints at step {} and their metrics belong to different runs "
      "({}). A directory copied from another run would mix two histories; put back each rank's "
      "own train.out_dir",
      *step, which));
}

}  // namespace

std::uint64_t new_run_id() {
  std::random_device device;
  std::uint64_t id = 0;
  while (id == 0) id = (std::uint64_t{device()} << 32) ^ device();
  return id;
}

void check_fresh_start(const StartIntent& intent, const std::string& dir) {
  if (intent.resume || intent.force || !intent.holds_results()) return;
  throw ConfigError(fmt::format(
      "'{}' already holds a run ({}); continue it with --resume, overwrite it with --force, or "
      "choose a new train.out_dir (--out-dir)",
      dir, describe_results(intent.checkpoints, intent.metrics_records)));
}

std::uint64_t agree_on_start(const StartIntent& mine, transport::Collective* site_group,
                             std::span<transport::Collective* const> rings,
                             const ResumeAgreementOptions& options) {
  std::vector<std::byte> block(kIntentBytes);
  put<std::uint32_t>(block, 0, kIntentMagic);
  put<std::uint8_t>(block, 4, mine.resume ? 1 : 0);
  put<std::uint8_t>(block, 5, mine.force ? 1 : 0);
  put<std::uint32_t>(block, 8, mine.checkpoints);
  put<std::uint32_t>(block, 12, mine.metrics_records);
  put<std::uint64_t>(block, 16, mine.run_id);
  const transport::JobBlocks all = gather_agreement(block, site_group, rings);
  std::vector<std::string> resuming, fresh, clobbering;
  for (int s = 0; s < static_cast<int>(all.ranks.size()); ++s)
    for (int r = 0; r < all.ranks[std::size_t(s)]; ++r) {
      const std::string name = fmt::format("{}/{}", site_name_of(options, s), r);
      const std::span<const std::byte> b = all.at(s, r);
      if (get<std::uint32_t>(b, 0) != kIntentMagic)
        throw DataError(fmt::format(
            "start agreement: the block from {} is malformed; are all ranks running the same "
            "desloc build?",
            name));
      const StartIntent it{get<std::uint8_t>(b, 4) != 0, get<std::uint8_t>(b, 5) != 0,
                           get<std::uint32_t>(b, 8), get<std::uint32_t>(b, 12),
                           get<std::uint64_t>(b, 16)};
      (it.resume ? resuming : fresh).push_back(name);
      if (!it.resume && !it.force && it.holds_results())
        clobbering.push_back(
            fmt::format("{} ({})", name, describe_results(it.checkpoints, it.metrics_records)));
    }
  if (!resuming.empty() && !fresh.empty())
    throw ConfigError(fmt::format(
        "the ranks disagree on --resume: {} {} given it, {} {} not; give --resume to every "
        "rank of the job (to continue its checkpoints) or to none (to start afresh)",
        join_names(resuming), resuming.size() == 1 ? "was" : "were", join_names(fresh),
        fresh.size() == 1 ? "was" : "were"));
  if (!clobbering.empty())
    throw ConfigError(fmt::format(
        "train.out_dir already holds another run's results on {}; continue it with --resume, "
        "overwrite it with --force, or choose a new train.out_dir",
        join_names(clobbering)));
  // A fresh run's id: the first rank's draw, which every rank reads from the same blocks.
  return get<std::uint64_t>(all.at(0, 0), 16);
}

ResumeChoice agree_on_resume_step(const CheckpointScan& mine, transport::Collective* site_group,
                                  std::span<transport::Collective* const> rings,
                                  const ResumeAgreementOptions& options) {
  const std::vector<std::byte> my_block = encode_offer(mine, options.history_run_id);
  const transport::JobBlocks all = gather_agreement(my_block, site_group, rings);

  std::vector<Offer> offers;
  std::vector<std::string> names;
  for (int s = 0; s < static_cast<int>(all.ranks.size()); ++s)
    for (int r = 0; r < all.ranks[std::size_t(s)]; ++r) {
      names.push_back(fmt::format("{}/{}", site_name_of(options, s), r));
      offers.push_back(decode_offer(all.at(s, r), names.back()));
    }

  // The newest step in every offer, and every newer step some rank offered.
  std::set<std::int64_t> common(offers[0].valid.begin(), offers[0].valid.end());
  std::map<std::int64_t, int, std::greater<>> holders;
  for (const Offer& o : offers) {
    std::set<std::int64_t> keep;
    for (std::int64_t step : o.valid) {
      if (common.contains(step)) keep.insert(step);
      ++holders[step];
    }
    common = std::move(keep);
  }
  ResumeChoice choice;
  if (!common.empty()) choice.step = *common.rbegin();
  if (!holders.empty()) choice.newest = holders.begin()->first;
  int lacked = 0;  // newer steps some rank holds and another has no file of at all
  for (const auto& held_by : holders) {
    const auto step = held_by.first;  // a named copy: clang cannot capture a structured binding
    if (choice.step && step <= *choice.step) break;
    const bool someone_lacks = std::any_of(offers.begin(), offers.end(), [&](const Offer& o) {
      const bool held = std::binary_search(o.valid.begin(), o.valid.end(), step, std::greater<>());
      // Another config's file at that step is no torn write of this job: its own is missing.
      const bool torn = std::any_of(o.rejected.begin(), o.rejected.end(), [&](const Rejection& rj) {
        return rj.step == step && !rj.foreign;
      });
      const bool beyond_offer = o.n_valid == K && step < o.valid.back();
      return !held && !torn && !beyond_offer;
    });
    lacked += someone_lacks ? 1 : 0;
  }
  // One lacking step is what a job killed while its ranks wrote a checkpoint leaves behind.
  choice.diverged = lacked >= 2;

  std::size_t newer = 0;
  for (const auto& [step, count] : holders) {
    if (choice.step && step <= *choice.step) break;
    if (++newer > kMaxPassedOverLines) continue;
    std::string line = fmt::format("step {}: held by {} of {} ranks;", step, count, offers.size());
    const char* sep = " ";
    std::size_t named = 0;
    for (std::size_t i = 0; i < offers.size(); ++i)
      if (!std::binary_search(offers[i].valid.begin(), offers[i].valid.end(), step,
                              std::greater<>()) &&
          named++ < kMaxNamesPerLine) {
        line += sep + why_missing(offers[i], step, names[i]);
        sep = "; ";
      }
    if (named > kMaxNamesPerLine)
      line += fmt::format("; and {} more ranks lack it", named - kMaxNamesPerLine);
    choice.passed_over.push_back(std::move(line));
  }
  if (newer > kMaxPassedOverLines)
    choice.passed_over.push_back(
        fmt::format("... and {} older passed-over steps", newer - kMaxPassedOverLines));

  choice.run_id = agreed_run(offers, names, choice.step);

  if (options.log) {
    const std::string who = options.who.empty() ? std::string("resume") : options.who;
    if (choice.step)
      log::info("{}: resuming from checkpoint step {}, the newest all {} ranks hold intact", who,
                *choice.step, offers.size());
    else
      log::warn("{}: no checkpoint step is held intact by all {} ranks", who, offers.size());
    for (const std::string& line : choice.passed_over) log::info("{}: passed over {}", who, line);
  }
  return choice;
}

}  // namespace desloc::train
