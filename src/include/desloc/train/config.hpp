// The job configuration: TOML tables mapped onto typed structs with defaults.
// Every tunable is declared once, in config.cpp's bind_* functions, together with its
// default and its one-line documentation; `desloc config --defaults` prints them all.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "desloc/data/token_files.hpp"
#include "desloc/model/gpt_config.hpp"
#include "desloc/model/model.hpp"
#include "desloc/optim/optimizer.hpp"
#include "desloc/sync/shard_map.hpp"
#include "desloc/sync/sync_policy.hpp"

namespace desloc::train {

struct DataConfig {
  std::string dir = "data/brown";  // directory written by `desloc prepare` (holds dataset.toml)
  // What dir holds: desloc's shards, or another tool's token files read in place
  // (data::external_dataset: nanoGPT's train.bin / val.bin, llm.c's *_train*.bin / *_val*.bin).
  data::TokenFormat format = data::TokenFormat::kDesloc;
  int batch = 16;             // sequences per step per rank (B)
  int seq_len = 0;            // tokens per sequence (T); 0 = model.context
  std::uint64_t seed = 1234;  // data order
};

struct RunConfig {
  std::int64_t steps = 600;    // optimizer steps; also the length of the LR schedule
  int eval_every = 100;        // steps between validation evaluations (0 = only at the end)
  int eval_batches = 16;       // validation batches per evaluation
  int checkpoint_every = 200;  // steps between checkpoints (0 = only at the end)
  int log_every = 10;          // steps between plain log lines (when not on a TTY)
  std::string out_dir = "runs/quickstart";  // metrics.jsonl and checkpoints go here
  std::uint64_t seed = 42;                  // parameter initialisation
  model::Backend backend = model::Backend::kCpu;
  int threads = 0;  // CPU threads (0 = all cores)
};

// [job]: the sites and ranks of a multi-site job and how its processes find each other. A
// site is one DES-LOC site; its R ranks all-reduce gradients every step, so a site trains
// with R * data.batch sequences per step.
// What a site's failure does (job.on_site_failure).
enum class OnSiteFailure : std::uint8_t {
  kContinue,  // "continue": a new membership epoch without it; the survivors roll back
  kStop,      // "stop": the job ends with an error naming it
};
constexpr std::string_view to_string(OnSiteFailure f) {
  return f == OnSiteFailure::kStop ? "stop" : "continue";
}

// One [[job.site]] table: a site as it is. job.sites, job.ranks_per_site and data.batch are
// the shorthand for sites that are alike.
struct SiteSpec {
  std::string name;
  int ranks = 1;   // its ranks, which all-reduce gradients every step
  int batch = 16;  // sequences per step per rank
  bool operator==(const SiteSpec&) const = default;
};

struct JobSection {
  std::vector<std::string> sites;  // names, in wide-area ring order; empty = site0..site{M-1}
  // [[job.site]]: each site's ranks and batch, in ring order; empty = the shorthand. Once read,
  // job.sites holds their names, ranks_per_site the most ranks and data.batch the smallest
  // batch (the validation batch).
  std::vector<SiteSpec> site;
  // Hierarchical DES-LOC: sites grouped into regions, each a list of sites in its ring order.
  // Inside a region x, u and v are also averaged every sync.region_k* steps (over the region's
  // own links); the sync.k* averages span every site. Empty: one level.
  std::vector<std::vector<std::string>> regions;
  int ranks_per_site = 1;                       // R
  std::string coordinator = "127.0.0.1:29500";  // host:port of `desloc coordinator`
  std::string token_file;                       // file holding the job's shared secret
  std::string token;                // the secret inline (token_file is better: configs get copied)
  int rendezvous_timeout_s = 60;    // every rank must register within this
  int heartbeat_ms = 500;           // rank -> coordinator liveness period
  int heartbeat_timeout_ms = 5000;  // silence after which the coordinator lists a rank missing
  // When a site fails (a rank exits, goes silent, or its link breaks): "continue" opens a new
  // membership epoch without it and the survivors roll back to their newest common snapshot;
  // "stop" ends the job with an error naming it.
  OnSiteFailure on_site_failure = OnSiteFailure::kContinue;
  int min_sites = 1;             // fewer live sites than this end the job
  float straggler_ratio = 4.0f;  // drop a live site whose TCP backlog is this x others'; 0 = never
  int recovery_timeout_s = 30;   // a survivor must report for the next epoch within this
  // A rank that loses the coordinator trains on and reconnects for this long (0 = fail).
  int coordinator_timeout_s = 300;
  // TLS on the control connections (the token still authenticates ranks).
  bool tls = false;
  std::string tls_cert;  // coordinator: PEM certificate chain
  std::string tls_key;   // coordinator: PEM private key
  std::string tls_ca;    // ranks: PEM CA that signed tls_cert; "" = the system's CAs
};

// [transport]: UCX settings for the two collectives every rank holds.
struct TransportSection {
  std::string tls = "tcp";         // wide-area UCX_TLS; between namespaces only tcp works
  std::string net_devices = "lo";  // wide-area UCX_NET_DEVICES
  std::string site_tls = "tcp";    // intra-site UCX_TLS
  std::string site_net_devices = "lo";
  std::int64_t chunk_bytes = 1 << 20;  // pipelining unit on the wire
  int inflight_chunks = 8;             // receives posted ahead per ring
  // UCX_RNDV_THRESH ("" = UCX default, "inf" = never). Eager only: on a 60 ms round trip UCX's
  // rendezvous costs a round trip per chunk (2 sites, 100 Mbit, 16 MiB: 1575 ms against 1465).
  std::string rndv_thresh = "inf";
  int spin_iterations = 64;  // site group: progress polls before sleeping on the event fd
  // Wide-area groups: a packet tens of milliseconds away never lands within a spin, and each
  // idle poll of the tcp transport is a syscall (docs/transport.md).
  int wan_spin_iterations = 0;
  // Wide-area groups: then sleep this long and progress what arrived, while each linger
  // brings work, before sleeping on the event fd (transport::UcxOptions::linger_us).
  int wan_linger_us = 0;
  float deadline_s = 60.0f;   // every collective must finish within this
  bool chunk_headers = true;  // CRC32C + context header on every wide-area chunk
  // Wide-area rings per WAN group: 2 sends half of each shard round the reversed ring too, so
  // both directions of every link carry data (from 3 sites on; see transport/ring_order.hpp).
  int lanes = 2;
  // With two lanes, the part of each shard that goes round the ring; the rest goes round the
  // reversed ring (transport::lane_block). 0.5 splits evenly; `desloc plan` chooses it from the
  // two rings' capacity when the links' directions differ.
  float lane_share = 0.5f;
};

// Whom a key concerns, which decides the identities of a job it enters (config_keys.cpp says it
// for every key).
enum class KeyScope {
  kTrajectory,  // shapes what training computes: in hash() and in agreement_hash()
  kJob,         // shapes nothing computed, but every rank must agree on it (the ranks evaluate
                // together, both ends of a ring cut the same chunks): in agreement_hash() only
  kProcess,     // each process's own (paths, threads, timeouts, secrets): in neither
};

// One key and its value as a job's identity sees it: {"sync.codec_x", "\"int8\"", kTrajectory}.
struct ConfigEntry {
  std::string key;    // "section.key"
  std::string value;  // as TOML writes it
  KeyScope scope = KeyScope::kTrajectory;
  bool operator==(const ConfigEntry&) const = default;
};

struct JobConfig {
  model::GptConfig model;
  optim::OptimizerConfig optim;
  optim::ClipConfig clip;
  optim::ScheduleConfig schedule;
  DataConfig data;
  RunConfig train;
  sync::SyncConfig sync;
  JobSection job;
  TransportSection transport;
  std::string source;  // the file it was read from, for messages

  int seq_len() const { return data.seq_len > 0 ? data.seq_len : model.context; }
  // Site s's ranks and per-rank batch ([[job.site]], else the shorthand's; a site that joins
  // in-process, past the listed ones, is like the shorthand's).
  int site_ranks(int s) const;
  int site_batch(int s) const;
  // Every site has the same ranks and batch (the shorthand, or [[job.site]] tables alike).
  bool sites_alike() const;
  // Every site has the same number of ranks (the wide-area groups pair rank r of each site).
  bool ranks_alike() const;
  // The index in site_names() of `site`; ConfigError naming the config when it is none.
  int site_index(const std::string& site) const;
  // Every site's rank count, in site_names() order.
  std::vector<int> site_rank_counts() const;
  // The first data partition of site s's ranks: the ranks of the sites before it.
  int first_rank(int s) const;
  // Ranks of sites 0..sites-1.
  int ranks_of_sites(int sites) const;
  // The wide-area shards of every state: the least common multiple of the sites' rank counts
  // (R for sites alike), so that each rank of every site owns a whole number of them, a
  // contiguous range (transport::block of the state).
  int wan_shards() const;
  // The map of those shards to each site's ranks, in ring order (sync::ShardMap): the
  // in-process averagers sum segment by segment as the networked rings do.
  sync::ShardMap wan_map() const;
  // The largest batch a site of the job uses (the model's activations are sized for it).
  int max_batch() const;
  // Tokens site s trains on per step: its ranks x batch x seq_len.
  std::uint64_t site_tokens_per_step(int s) const;
  // The weight in every average (sync::Averager::set_weights) of each site of `sites`
  // (indices into site_names(), in the averager's order): its tokens per step with
  // sync.weights = "tokens", else 1.
  std::vector<double> site_weights(std::span<const int> sites) const;
  // The same for the first `count` sites (every replica of an in-process run).
  std::vector<double> site_weights(int count) const;
  // job.sites, or site0..site{M-1} when unset.
  std::vector<std::string> site_names() const;
  // Every key and its value, in the order of the declarations, normalized so that configs that
  // train alike list alike: a default spelled out or left out, ku = 0 for 3 kx, a key the mode
  // ignores (outer_lr without the outer step, codec_block without a codec). What the
  // fingerprints digest, and what the coordinator compares to name the key two ranks disagree
  // on.
  std::vector<ConfigEntry> entries() const;
  // The entries of scope `widest` and narrower, as "key=value;" text.
  std::string canonical(KeyScope widest = KeyScope::kTrajectory) const;
  // Identity of everything that shapes the trajectory of training (KeyScope::kTrajectory).
  // A checkpoint records it, and --resume refuses a checkpoint whose hash differs.
  std::uint64_t hash() const;
  // Identity of what every rank of a networked job must share (kTrajectory and kJob): each rank
  // registers with it, and the coordinator refuses a rank whose differs.
  std::uint64_t agreement_hash() const;
  // hash() with the data's tokenizer (data::DatasetInfo::tokenizer_identity()) folded in, what
  // a checkpoint records, so that a model is never resumed, exported or sampled with another
  // vocabulary. Equal to hash() for the byte tokenizer, so byte-level checkpoints keep theirs.
  std::uint64_t hash(std::string_view tokenizer) const;
};

// A command-line flag that overrides one key (e.g. --threads for train.threads). It goes
// through the key's own declaration in config.cpp, so it meets the same type and range checks
// as the key in a file; its errors name the flag where a file's name file:line:column.
struct KeyOverride {
  std::string flag;     // "--threads"
  std::string section;  // "train"
  std::string key;      // "threads"
  std::variant<std::int64_t, double, bool, std::string> value;
};

// Parses and validates. Throws ConfigError whose message starts with
// "<file>:<line>:<column>: " and names the key, for syntax errors, unknown keys or tables,
// wrong types, and invalid values (non-positive sizes, heads not dividing d_model, ...), and
// for a path that is a directory or cannot be read. Overrides apply after the file's values.
JobConfig load_config(const std::string& path, const std::vector<KeyOverride>& overrides = {});
JobConfig parse_config(std::string_view text, const std::string& source_name,
                       const std::vector<KeyOverride>& overrides = {});

// Every key with its default and documentation, as a valid TOML document.
std::string default_config_toml();

// Which sync features go together (`desloc config --features`, docs/sync.md): a Markdown table
// of every feature against every other, each cell "works", "no" (no meaning), "not yet" (not
// built) or "with N" (works only with feature N on too), with the reasons, and how each
// feature is turned on. parse_config refuses exactly the pairs it refuses.
std::string sync_feature_table();
// The table's features, in its order, and the reason a pair of them is refused: nullopt when
// the pair works, "two values of <key>" for a pair no config can set at once.
std::vector<std::string> sync_feature_names();
std::optional<std::string> sync_feature_conflict(const std::string& a, const std::string& b);
// The feature with which a refused pair works after all (nullopt: none).
std::optional<std::string> sync_feature_unless(const std::string& a, const std::string& b);

}  // namespace desloc::train
