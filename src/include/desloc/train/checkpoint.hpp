// Training checkpoints: everything needed to continue bit-exactly (for every site: params
// x, optimizer states u and v, data-loader position; the step counters; the outer optimizer's
// reference and momentum) plus the config hash that produced it.
//
// File layout (little-endian):
//   char[8] magic "DSLCCKP1" | u32 version | u32 reserved | u64 payload bytes | u32 CRC32C(payload)
//   payload: u64 config_hash | i64 step | u64 tokens_seen | u64 n | u32 sites
//            | sites x { i64 optim_t | u64 loader.epoch | u64 loader.cursor
//                          | f32[n] x | f32[n] u | f32[n] v }
//            | u64 outer_n | f32[outer_n] outer_ref | f32[outer_n] outer_momentum
//            | (version 4) u64 ref_n[3] | u64 ef_n[3] | f32[ref_n[k]] for x, u, v
//                          | sites x f32[ef_n[k]] for x, u, v: the compressed states'
//                          shared references and error feedback (each n or 0)
//            | (version 5) i32 vocab, context, layers, heads, d_model | char[16] tokenizer
//                          | u64 tokenizer_hash | char[512] tokenizer_file: what export and
//                          sample need to rebuild the model without the config (NUL-padded)
//            | (version 7) u64 run_id: the run that wrote it (TrainingRun's run id)
//            | (version 6) u64 switch_n | 32 x { i64 after, kx, ku, kv }: the period switches
//                          in force (sync.switches and re-plans; entries past switch_n are 0)
//            | char[64] writer, NUL-padded (version >= 3; version 2 files end before it)
// Written atomically (temporary file, fsync, rename); a reader rejects any mismatch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "desloc/data/loader.hpp"
#include "desloc/model/gpt_config.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::train {

inline constexpr char kCheckpointMagic[8] = {'D', 'S', 'L', 'C', 'C', 'K', 'P', '1'};
// 3: the writer's name; 4: the compressed states' references and error feedback; 5: the
// model's sizes and its tokenizer; 6: the period switches; 7: the run id.
inline constexpr std::uint32_t kCheckpointVersion = 7;

// What a checkpoint says about the model it holds (version 5): enough to export or sample it.
struct CheckpointModel {
  model::GptConfig model;
  std::string tokenizer = "byte";    // "byte" | "sentencepiece"
  std::uint64_t tokenizer_hash = 0;  // data::tokenizer_hash() of the model file; 0 for byte
  // The tokenizer model's absolute path when the checkpoint was written (at most 511 bytes;
  // a longer one is not kept, and the reader must be told where the file is).
  std::string tokenizer_file;
};

struct SiteState {
  std::int64_t optim_t = 0;  // the optimizer's step counter (bias correction, ADOPT warm start)
  data::LoaderState loader;
  std::vector<float> params, u, v;
  std::array<std::vector<float>, 3> codec_feedback;  // x, u, v: error feedback (or empty)
};

struct Checkpoint {
  std::uint64_t config_hash = 0;
  std::int64_t step = 0;          // optimizer steps completed
  std::uint64_t tokens_seen = 0;  // per site
  std::vector<SiteState> sites;
  std::vector<float> outer_ref, outer_momentum;  // empty unless sync.outer is set
  std::array<std::vector<float>, 3> codec_ref;   // x, u, v: compressed states' references
  // Who wrote it: a rank's "site/r", or "in-process" for `desloc train` (at most 63 bytes
  // are kept); empty for a version 2 file.
  std::string writer;
  // The model's sizes and tokenizer; nullopt for a file written before version 5.
  std::optional<CheckpointModel> model;
  // The period switches in force at `step`, in order (none before version 6).
  std::vector<sync::PeriodSwitch> switches;
  // The run it belongs to: drawn when a run starts afresh, kept through resumes, the same on
  // every rank. 0: unknown (a file written before version 7).
  std::uint64_t run_id = 0;
};

void save_checkpoint(const std::string& path, const Checkpoint& ck);
// Throws DataError naming the path: missing, wrong magic/version, truncated or oversized,
// CRC mismatch, or inconsistent buffer sizes.
Checkpoint load_checkpoint(const std::string& path);

// "<dir>/step_00000120.ckpt"
std::string checkpoint_path(const std::string& dir, std::int64_t step);

// The newest checkpoint in dir that loads cleanly. Corrupt or partial ones are reported
// (log::warn naming the file and the reason) and skipped. nullopt if there is none.
struct FoundCheckpoint {
  std::string path;
  Checkpoint checkpoint;
};
// `writer`: when not empty, a file written by someone else is skipped (as scan_checkpoints).
std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                      const std::string& writer = "");

// A checkpoint file that passed every check load_checkpoint makes (header, size, CRC32C,
// buffer layout) and whose step matches its name.
struct CheckpointInfo {
  std::int64_t step = 0;
  std::uint64_t config_hash = 0;
  std::uint64_t file_bytes = 0;  // bytes
  std::string path;
  std::string writer;                    // Checkpoint::writer
  std::optional<CheckpointModel> model;  // Checkpoint::model
  std::uint64_t run_id = 0;              // Checkpoint::run_id
};
// A "step_<N>.ckpt" file that failed validation, and why (the DataError's message).
struct RejectedCheckpoint {
  std::int64_t step = 0;  // from the file name
  std::string path;
  std::string reason;
  // Intact, but written by a job of another config: not a torn write to roll back past, but
  // another job's file (resume_agreement treats the two differently).
  bool foreign = false;
};
struct CheckpointScan {
  std::vector<CheckpointInfo> valid;         // newest step first
  std::vector<RejectedCheckpoint> rejected;  // newest step first
};

// Checks a checkpoint file without loading it: streams it in 1 MiB blocks (CRC32C over the
// payload), so memory stays flat whatever the model size. Throws the DataError load_checkpoint
// would throw, naming the path and the reason.
CheckpointInfo validate_checkpoint(const std::string& path);

// Every "step_<N>.ckpt" in dir, validated one at a time, newest first: the one set of rules
// for every resume. A file is rejected (log::warn naming it and the reason) when it fails
// validate_checkpoint (also when it is a directory), holds another step than its name says,
// or (when `writer` is not empty) was written by someone else, e.g. another rank's checkpoint
// copied over this one's, or (when `config_hash` is not 0) was written by a job of another
// config (then marked `foreign`). Other files (temporaries of an interrupted write, user files)
// are ignored. An absent directory yields an empty scan.
CheckpointScan scan_checkpoints(const std::string& dir, const std::string& writer = "",
                                std::uint64_t config_hash = 0);
std::vector<CheckpointInfo> list_valid_checkpoints(const std::string& dir);

}  // namespace desloc::train
