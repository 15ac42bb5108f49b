// TOML -> JobConfig. A Binder walks each section once, either reading values (with type and
// range checks that report file:line:column) or describing defaults for documentation.
#include "desloc/train/config.hpp"
#include "desloc/transport/site_name.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/model/param_layout.hpp"
#include "desloc/transport/ring_order.hpp"

namespace desloc::train {
namespace {

// "file:line:column", or just the name for a value that no file holds (a command-line flag).
std::string where(const std::string& file, const toml::source_region& r) {
  if (r.begin.line == 0) return file;
  return fmt::format("{}:{}:{}", file, r.begin.line, r.begin.column);
}

// One section ([model], [optim], ...). In read mode it pulls each key out of the table; in
// describe mode it appends "key = default  # doc" lines. Either way, each key is declared
// exactly once, in the bind_* functions below.
class Binder {
 public:
  Binder(std::string file, std::string section, const toml::table* table, std::ostream* describe)
      : file_(std::move(file)), section_(std::move(section)), table_(table), describe_(describe) {}

  void integer(const char* key, int& out, const char* doc, std::int64_t min = INT32_MIN,
               std::int64_t max = INT32_MAX) {
    std::int64_t v = out;
    integer64(key, v, doc, min, max);
    out = static_cast<int>(v);
  }
  void integer64(const char* key, std::int64_t& out, const char* doc, std::int64_t min = INT64_MIN,
                 std::int64_t max = INT64_MAX) {
    if (describe(key, fmt::format("{}", out), doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_integer()) type_error(key, *n, "an integer");
      const std::int64_t v = n->as_integer()->get();
      if (v < min || v > max) range_error(key, *n, fmt::format("{}", v), min, max);
      out = v;
    }
  }
  void unsigned64(const char* key, std::uint64_t& out, const char* doc) {
    std::int64_t v = static_cast<std::int64_t>(out);
    integer64(key, v, doc, 0);
    out = static_cast<std::uint64_t>(v);
  }
  void real(const char* key, float& out, const char* doc, double min = -1e300, double max = 1e300,
            bool min_exclusive = false) {
    if (describe(key, fmt::format("{}", out), doc)) return;
    if (const toml::node* n = take(key)) {
      double v;
      if (n->is_floating_point())
        v = n->as_floating_point()->get();
      else if (n->is_integer())
        v = static_cast<double>(n->as_integer()->get());
      else
        type_error(key, *n, "a number");
      // The bounds hold for the float that is stored: 1e-50 is > 0 but becomes 0.0f.
      const double stored = static_cast<float>(v);
      if (!(v >= min && v <= max) || (min_exclusive && (v == min || stored == min))) {
        throw ConfigError(fmt::format("{}: {}.{} = {} is out of range: must be {} {} and <= {}",
                                      where(file_, n->source()), section_, key, v,
                                      min_exclusive ? ">" : ">=", min, max));
      }
      out = static_cast<float>(v);
    }
  }
  void boolean(const char* key, bool& out, const char* doc) {
    if (describe(key, out ? "true" : "false", doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_boolean()) type_error(key, *n, "a boolean (true or false)");
      out = n->as_boolean()->get();
    }
  }
  void string(const char* key, std::string& out, const char* doc,
              std::initializer_list<const char*> choices = {}) {
    if (describe(key, fmt::format("\"{}\"", out), doc)) return;
    if (const toml::node* n = take(key)) {
      if (!n->is_string()) type_error(key, *n, "a string");
      std::string v = n->as_string()->get();
      if (choices.size() > 0) {
        bool ok = false;
        std::string list;
        for (const char* c : choices) {
          ok = ok || v == c;
          list += (list.empty() ? "\"" : ", \"") + std::string(c) + "\"";
        }
        if (!ok)
          throw ConfigError(fmt::format("{}: {}.{} = \"{}\" is not one of {}",
                                        where(file_, n->source()), section_, key, v, list));
      }
      out = std::move(v);
    }
  }

  void string_lists(const char* key, std::vector<std::vector<std::string>>& out, const char* doc) {
    if (describe(key, "[]", doc)) return;
    if (const toml::node* n = take(key)) {
      const toml::array* a = n->as_array();
      if (a == nullptr) type_error(key, *n, "an array of arrays of strings");
      out.clear();
      for (const toml::node& e : *a) {
        const toml::array* inner = e.as_array();
        if (inner == nullptr) type_error(key, e, "an array of arrays of strings");
        out.emplace_back();
        for (const toml::node& s : *inner) {
          if (!s.is_string()) type_error(key, s, "an array of arrays of strings");
          out.back().push_back(s.as_string()->get());
        }
      }
    }
  }

  // An array of inline tables { after = t, kx = k, ku = k, kv = k } (ku and kv optional).
  void period_switches(const char* key, std::vector<sync::PeriodSwitch>& out, const char* doc) {
    if (describe(key, "[]", doc)) return;
    const toml::node* n = take(key);
    if (n == nullptr) return;
    constexpr const char* kShape = "an array of tables such as { after = 96, kx = 64 }";
    const toml::array* a = n->as_array();
    if (a == nullptr) type_error(key, *n, kShape);
    out.clear();
    for (const toml::node& e : *a) {
      const toml::table* t = e.as_table();
      if (t == nullptr) type_error(key, e, kShape);
      sync::PeriodSwitch sw;
      for (auto&& [k, v] : *t) {
        const std::string name(k.str());
        std::int64_t* field = name == "after" ? &sw.after
                              : name == "kx"  ? &sw.kx
                              : name == "ku"  ? &sw.ku
                              : name == "kv"  ? &sw.kv
                                              : nullptr;
        if (field == nullptr)
          throw ConfigError(fmt::format("{}: {}.{}[{}] has an unknown key '{}' (after, kx, ku, kv)",
                                        where(file_, k.source()), section_, key, out.size() + 1,
                                        name));
        if (!v.is_integer()) type_error(key, v, "an integer (after, kx, ku, kv)");
        *field = v.as_integer()->get();
        if (*field < (name == "after" || name == "kx" ? 1 : 0) || *field > INT64_MAX / 6)
          throw ConfigError(fmt::format("{}: {}.{}[{}].{} = {} is out of range [{}, {}]",
                                        where(file_, v.source()), section_, key, out.size() + 1,
                                        name, *field, name == "after" || name == "kx" ? 1 : 0,
                                        INT64_MAX / 6));
      }
      if (sw.after == 0 || sw.kx == 0)
        throw ConfigError(fmt::format("{}: {}.{}[{}] needs both 'after' and 'kx'",
                                      where(file_, e.source()), section_, key, out.size() + 1));
      out.push_back(sw);
    }
  }

  void strings(const char* key, std::vector<std::string>& out, const char* doc) {
    if (describe(key, fmt::format("[{}]", fmt::join(out, ", ")), doc)) return;
    if (const toml::node* n = take(key)) {
      const toml::array* a = n->as_array();
      if (a == nullptr) type_error(key, *n, "an array of strings");
      out.clear();
      for (const toml::node& e : *a) {
        if (!e.is_string()) type_error(key, e, "an array of strings");
        out.push_back(e.as_string()->get());
      }
    }
  }

  // The next key is documented as a comment: it is valid only in some combinations (e.g.
  // desloc-only periods), so the defaults document must not set it.
  void comment_next() { comment_next_ = true; }

  bool has(const char* key) const { return table_ != nullptr && table_->get(key) != nullptr; }

  // Location of a key that was read, for cross-field errors.
  std::string location_of(const char* key) const {
    if (table_ == nullptr) return file_;
    if (const toml::node* n = table_->get(key)) return where(file_, n->source());
    return file_;
  }

  void reject_unknown_keys() const {
    if (table_ == nullptr) return;
    for (auto&& [k, v] : *table_) {
      if (!used_.contains(std::string(k.str())))
        throw ConfigError(fmt::format(
            "{}: unknown key '{}.{}' (see `desloc config --defaults` for the valid keys)",
            where(file_, k.source()), section_, k.str()));
    }
  }

 private:
  bool describe(const char* key, const std::string& value, const char* doc) {
    if (describe_ == nullptr) return false;
    *describe_ << fmt::format("{}{:<18} = {:<18} # {}\n", comment_next_ ? "# " : "", key, value,
                              doc);
    comment_next_ = false;
    return true;
  }
  const toml::node* take(const char* key) {
    used_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }
  [[noreturn]] void type_error(const char* key, const toml::node& n, const char* expected) const {
    throw ConfigError(
        fmt::format("{}: {}.{} must be {}, got {}", where(file_, n.source()), section_, key,
                    expected, toml::impl::node_type_friendly_names[static_cast<int>(n.type())]));
  }
  [[noreturn]] void range_error(const char* key, const toml::node& n, const std::string& v,
                                std::int64_t min, std::int64_t max) const {
    throw ConfigError(fmt::format("{}: {}.{} = {} is out of range [{}, {}]",
                                  where(file_, n.source()), section_, key, v, min, max));
  }

  std::string file_;
  std::string section_;
  const toml::table* table_;
  std::ostream* describe_;
  std::set<std::string> used_;
  bool comment_next_ = false;
};

void bind_model(Binder& b, model::GptConfig& m) {
  b.integer("vocab", m.vocab, "vocabulary size (256 = byte-level tokenizer)", 1, 65536);
  b.integer("context", m.context, "maximum sequence length T (learned position embeddings)", 1);
  b.integer("layers", m.layers, "transformer blocks L", 1);
  b.integer("heads", m.heads, "attention heads; must divide d_model", 1);
  b.integer("d_model", m.d_model, "embedding width C", 1);
}
void bind_optim(Binder& b, optim::OptimizerConfig& o, optim::ClipConfig& c) {
  b.string("name", o.name, "local optimizer: \"adamw\" or \"adopt\"", {"adamw", "adopt"});
  b.real("beta1", o.beta1, "first-moment decay (u)", 0.0, 0.999999);
  b.real("beta2", o.beta2, "second-moment decay (v)", 0.0, 0.999999);
  b.real("eps", o.eps, "denominator epsilon", 0.0, 1.0, true);
  b.real("weight_decay", o.weight_decay, "decoupled weight decay on matrices and embeddings", 0.0,
         10.0);
  b.boolean("bias_correction", o.bias_correction, "AdamW bias correction");
  b.string("clip", c.mode, "gradient clipping: \"coord\" (to [-rho, rho]), \"norm\" or \"none\"",
           {"coord", "norm", "none"});
  b.real("clip_value", c.value, "rho for coord clipping, max global norm for norm clipping", 0.0,
         1e30, true);
}
void bind_schedule(Binder& b, optim::ScheduleConfig& s) {
  b.string("kind", s.kind,
           "\"cosine\" (warmup + cosine), \"wsd\" (warmup-stable-decay) or \"constant\"",
           {"cosine", "wsd", "constant"});
  b.real("lr", s.lr, "peak learning rate", 0.0, 10.0, true);
  b.integer("warmup", s.warmup, "linear warmup steps", 0);
  b.real("min_lr_ratio", s.min_lr_ratio, "final learning rate as a fraction of lr", 0.0, 1.0);
  b.real("decay_fraction", s.decay_fraction, "wsd: fraction of steps in the final decay", 0.0, 1.0,
         true);
}
void bind_data(Binder& b, DataConfig& d) {
  b.string("dir", d.dir, "dataset directory written by `desloc prepare`");
  b.integer("batch", d.batch, "sequences per step per rank (B)", 1);
  b.integer("seq_len", d.seq_len, "tokens per sequence T (0 = model.context)", 0);
  b.unsigned64("seed", d.seed, "data-order seed");
}
void bind_train(Binder& b, RunConfig& r) {
  b.integer64("steps", r.steps, "optimizer steps (and the LR schedule's length)", 1);
  b.integer("eval_every", r.eval_every,
            "steps between validation evaluations (0 = at the end only)", 0);
  b.integer("eval_batches", r.eval_batches, "validation batches per evaluation", 1);
  b.integer("checkpoint_every", r.checkpoint_every,
            "steps between checkpoints (0 = at the end only)", 0);
  b.integer("log_every", r.log_every, "steps between log lines when stderr is not a TTY", 1);
  b.string("out_dir", r.out_dir, "where metrics.jsonl and checkpoints are written");
  b.unsigned64("seed", r.seed, "parameter initialisation seed");
  b.string("backend", r.backend, "\"cpu\" or \"cuda\"", {"cpu", "cuda"});
  b.integer("threads", r.threads, "CPU threads for the model (0 = all cores)", 0, 1024);
}

void bind_sync(Binder& b, sync::SyncConfig& s) {
  std::string method(to_string(s.method));
  b.string("method", method,
           "\"none\", \"ddp\", \"favg\" (FAVG+OPT), \"favg_reset\", \"local_adam\" or \"desloc\"",
           {"none", "ddp", "favg", "favg_reset", "local_adam", "desloc"});
  s.method = parse_sync_method(method).value_or(s.method);  // the list above checked it
  b.integer("workers", s.workers, "in-process virtual workers (sites) M", 1, 4096);
  // At most INT64_MAX / 6, so that the default Kv = 6 * kx cannot overflow.
  b.integer64("kx", s.kx, "parameter-average period Kx (the K of favg, favg_reset, local_adam)", 1,
              INT64_MAX / 6);
  b.comment_next();
  b.integer64("ku", s.ku, "desloc: first-moment period Ku (0 = 3 * kx)", 0);
  b.comment_next();
  b.integer64("kv", s.kv, "desloc: second-moment period Kv (0 = 6 * kx)", 0);
  b.comment_next();
  b.integer64("region_kx", s.region_kx,
              "with job.regions: x's average inside a region every region_kx steps (divides kx)", 0,
              INT64_MAX / 6);
  b.comment_next();
  b.integer64("region_ku", s.region_ku,
              "with job.regions, desloc: u's inside a region (0 = 3 * region_kx; divides ku)", 0);
  b.comment_next();
  b.integer64("region_kv", s.region_kv,
              "with job.regions, desloc: v's inside a region (0 = 6 * region_kx; divides kv)", 0);
  b.integer64("phase_x", s.phase_x, "x is averaged at steps t with (t - phase_x) mod kx == 0", 0);
  b.comment_next();
  b.integer64("phase_u", s.phase_u, "desloc: phase of the u average", 0);
  b.comment_next();
  b.integer64("phase_v", s.phase_v, "desloc: phase of the v average", 0);
  b.string("outer", s.outer, "outer optimizer on the parameter average: \"none\" or \"nesterov\"",
           {"none", "nesterov"});
  b.real("outer_lr", s.outer_lr, "outer Nesterov learning rate", 0.0, 10.0, true);
  b.real("outer_momentum", s.outer_momentum, "outer Nesterov momentum", 0.0, 0.999999);
  b.integer64("join_step", s.join_step,
              "elastic join: from this step on, grow to join_workers (0 = never)", 0);
  b.integer("join_workers", s.join_workers, "elastic join: worker count after the join", 0, 4096);
  b.string("overlap", s.overlap,
           "\"none\": averages block the step; \"step\": the averages of x, u and v run during "
           "the step's forward and backward pass (the same numbers); \"delayed\": an average "
           "started at step t is folded in at t + delay, keeping the progress made meanwhile; "
           "\"delayed_naive\": the same, replacing the state by the stale mean (comparison only)",
           {"none", "step", "delayed", "delayed_naive"});
  b.comment_next();
  b.integer64("delay", s.delay,
              "overlap = \"delayed\": steps tau from an average's start to its "
              "fold, smaller than every averaged state's period",
              0);
  b.comment_next();
  b.integer64("delay_u", s.delay_u, "overlap = \"delayed\": tau of u (0 = delay)", 0);
  b.comment_next();
  b.integer64("delay_v", s.delay_v, "overlap = \"delayed\": tau of v (0 = delay)", 0);
  b.integer("fragments", s.fragments,
            "cut each state's average into this many fragments, staggered over its period (a "
            "steady stream instead of one burst; the same bytes)",
            1, 1 << 20);
  b.comment_next();
  b.integer("fragments_u", s.fragments_u,
            "desloc: fragments of u (0 = fragments; fragments * ku / kx gives u a fragment on "
            "every step x has one)",
            0, 1 << 20);
  b.comment_next();
  b.integer("fragments_v", s.fragments_v, "desloc: fragments of v (0 = fragments)", 0, 1 << 20);
  for (auto [key, value, doc] :
       {std::tuple{"codec_x", &s.codec_x,
                   "codec of the parameter average: \"fp32\" (the state itself) or \"bf16\", "
                   "\"int8\", \"int4\", \"int2\" (its difference from the last mean, with one "
                   "float scale per codec_block values for the integers)"},
        std::tuple{"codec_u", &s.codec_u, "codec of the first-moment average (as codec_x)"},
        std::tuple{"codec_v", &s.codec_v,
                   "codec of the second-moment average (as codec_x), or \"sqrt-bf16\", "
                   "\"sqrt-int8\", \"sqrt-int4\", \"sqrt-int2\": that codec on sqrt(v), "
                   "the mean being the square of the sites' mean sqrt(v)"}}) {
    b.comment_next();
    if (std::string_view(key) == "codec_v")
      b.string(key, *value, doc,
               {"fp32", "bf16", "int8", "int4", "int2", "sqrt-bf16", "sqrt-int8", "sqrt-int4",
                "sqrt-int2"});
    else
      b.string(key, *value, doc, {"fp32", "bf16", "int8", "int4", "int2"});
  }
  b.comment_next();
  b.integer("codec_block", s.codec_block,
            "values per scale of the integer codecs, a multiple of 4 (fewer: more precise, more "
            "bytes)",
            4, 1 << 20);
  b.comment_next();
  b.boolean("error_feedback", s.error_feedback,
            "keep, per compressed state, what quantisation dropped and add it to the next "
            "payload");
  b.comment_next();
  b.period_switches("switches", s.switches,
                    "new periods from a parameter average on, e.g. [{ after = 96, kx = 64 }]: "
                    "after step 96, x every 64 steps (ku, kv: 3 and 6 kx unless given) counted "
                    "from 96; what a re-plan records, for `desloc train` to replay");
  b.boolean("replan", s.replan,
            "networked jobs: re-plan kx, ku and kv while training when the wide-area rate "
            "drifts from the one the periods were chosen at; every site switches at the same "
            "parameter average");
  b.real("replan_target", s.replan_target,
         "overhead (wide-area seconds per compute second) the re-planned periods aim for; 0 = "
         "the overhead the first averages measured",
         0.0, 100.0);
  b.real("replan_drift", s.replan_drift,
         "a rate this many times slower or faster than the plan's triggers a re-plan", 1.0, 1e6,
         true);
  b.integer("replan_syncs", s.replan_syncs,
            "... once it held for this many parameter averages in a row", 1, 1000);
}

void bind_job(Binder& b, JobSection& j) {
  b.strings("sites", j.sites,
            "site names in wide-area ring order; [] = site0..site{M-1} from sync.workers");
  b.comment_next();
  b.string_lists(
      "regions", j.regions,
      "hierarchical DES-LOC: the sites in regions, e.g. [[\"A\", \"B\"], [\"C\", \"D\"]], "
      "each in its ring order; with sync.region_kx");
  b.integer("ranks_per_site", j.ranks_per_site,
            "ranks (processes) per site R; they all-reduce gradients every step", 1, 1024);
  b.string("coordinator", j.coordinator, "host:port of `desloc coordinator` (launch picks a port)");
  b.string("token_file", j.token_file,
           "file holding the job's shared secret (else token, else $DESLOC_JOB_TOKEN)");
  b.string("token", j.token, "the shared secret inline (prefer token_file)");
  b.integer("rendezvous_timeout_s", j.rendezvous_timeout_s, "deadline for every rank to register",
            1, 86400);
  b.integer("heartbeat_ms", j.heartbeat_ms, "rank -> coordinator heartbeat period", 10, 60000);
  b.integer("heartbeat_timeout_ms", j.heartbeat_timeout_ms,
            "silence after which a rank is listed missing", 50, 600000);
  b.string("on_site_failure", j.on_site_failure,
           "\"continue\": drop a failed site and go on in a new epoch; \"stop\": end the job",
           {"continue", "stop"});
  b.integer("min_sites", j.min_sites, "fewer live sites than this end the job", 1, 4096);
  b.real("straggler_ratio", j.straggler_ratio,
         "a failure that lost no site drops the site on the slow link: the TCP data unsent to "
         "or from it (or its send wait) is this many times any other link's (at least 1 s; "
         "0 = never drop a live site)",
         0.0, 1000.0);
  b.integer("coordinator_timeout_s", j.coordinator_timeout_s,
            "a rank that loses the coordinator trains on and reconnects for this long (0 = fail "
            "at once); a restarted coordinator rebuilds the membership from the ranks",
            0, 86400);
  b.integer("recovery_timeout_s", j.recovery_timeout_s,
            "a survivor must report for the next membership epoch within this", 1, 86400);
  b.boolean("tls", j.tls, "TLS on the control connections (coordinator <-> ranks)");
  b.string("tls_cert", j.tls_cert, "coordinator's PEM certificate chain (with tls)");
  b.string("tls_key", j.tls_key, "coordinator's PEM private key (with tls)");
  b.string("tls_ca", j.tls_ca,
           "PEM CA the ranks trust for the coordinator's certificate (\"\" = system CAs)");
}
void bind_transport(Binder& b, TransportSection& t) {
  b.string("tls", t.tls, "wide-area UCX_TLS (only tcp crosses network namespaces)");
  b.string("net_devices", t.net_devices, "wide-area UCX_NET_DEVICES (e.g. \"lo\", \"eth0\")");
  b.string("site_tls", t.site_tls, "intra-site UCX_TLS");
  b.string("site_net_devices", t.site_net_devices, "intra-site UCX_NET_DEVICES");
  b.integer64("chunk_bytes", t.chunk_bytes, "pipelining unit of the ring collectives", 4,
              std::int64_t{1} << 30);
  b.integer("inflight_chunks", t.inflight_chunks, "receives posted ahead per ring", 1, 1024);
  b.string("rndv_thresh", t.rndv_thresh,
           "UCX_RNDV_THRESH (\"inf\" = eager only, measured faster on links with latency; \"\" = "
           "UCX default)");
  b.integer("spin_iterations", t.spin_iterations,
            "progress polls before sleeping on the UCX event fd, in the site group", 0, 1 << 30);
  b.integer("wan_spin_iterations", t.wan_spin_iterations,
            "the same in the wide-area groups (0: sleep as soon as UCX has nothing to do)", 0,
            1 << 30);
  b.integer("wan_linger_us", t.wan_linger_us,
            "wide-area groups: then sleep this long and take what arrived, while that brings "
            "work, before sleeping on the event fd (one wake-up per linger, not per few packets; "
            "adds up to this latency per wait; 0 = off)",
            0, 1000000);
  b.real("deadline_s", t.deadline_s, "every collective must finish within this", 0.0, 1e6, true);
  b.boolean("chunk_headers", t.chunk_headers, "CRC32C and context header on every wide-area chunk");
  b.integer("lanes", t.lanes,
            "wide-area rings: 2 = also the reversed ring, using both link directions (3+ sites)", 1,
            2);
  b.real("lane_share", t.lane_share,
         "with 2 lanes, the part of each shard on the ring (the rest: the reversed ring); 0.5 = "
         "even, `desloc plan` weighs it by the rings' capacity",
         0.0, 1.0, true);
  if (t.lane_share >= 1.0f)
    throw ConfigError(
        fmt::format("{}: transport.lane_share = {} leaves the reversed ring nothing: "
                    "must be > 0 and < 1 (or lanes = 1)",
                    b.location_of("lane_share"), t.lane_share));
}

// sync.overlap = "delayed": each tau at least 1 and below its state's period (one average of
// a state in flight at a time), and nothing that acts on an average at once.
void check_delays(const Binder& b, const sync::SyncConfig& s) {
  for (const char* key : {"delay", "delay_u", "delay_v"})
    if (b.has(key) && !s.delays())
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but overlap = \"{}\" has no delay; use overlap = \"delayed\" "
          "or remove it",
          b.location_of(key), key, s.overlap));
  if (!s.delays()) return;
  if (s.delay < 1)
    throw ConfigError(fmt::format("{}: sync.overlap = \"{}\" needs sync.delay >= 1 (got {})",
                                  b.location_of(b.has("delay") ? "delay" : "overlap"), s.overlap,
                                  s.delay));
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"delay_u", "delay_v"})
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" averages u and v with x; use sync.delay",
          b.location_of(key), key, to_string(s.method)));
  struct Rule {
    const char* key;
    std::int64_t tau;
    std::int64_t period;
    const char* period_key;
    bool averaged;
  };
  const bool moments = desloc || s.method == SyncMethod::kLocalAdam;
  for (const Rule& r : {Rule{"delay", s.delay, s.kx, "kx", true},
                        Rule{"delay_u", s.effective_delay_u(), desloc ? s.effective_ku() : s.kx,
                             desloc ? "ku" : "kx", moments},
                        Rule{"delay_v", s.effective_delay_v(), desloc ? s.effective_kv() : s.kx,
                             desloc ? "kv" : "kx", moments}}) {
    if (!r.averaged || r.tau < r.period) continue;
    const char* key = b.has(r.key) ? r.key : "delay";
    throw ConfigError(fmt::format(
        "{}: sync.{} = {} must be smaller than the period {} = {} of the state it delays (a "
        "state's next average starts before its last one is folded in)",
        b.location_of(key), key, r.tau, r.period_key, r.period));
  }
  if (s.outer != "none")
    throw ConfigError(fmt::format(
        "{}: sync.outer = \"{}\" steps on the parameter average at once; it cannot be combined "
        "with overlap = \"{}\"",
        b.location_of("outer"), s.outer, s.overlap));
  if (s.method == SyncMethod::kFavgReset)
    throw ConfigError(fmt::format(
        "{}: sync.overlap = \"{}\" with method = \"favg_reset\": the reset of u and v belongs "
        "to the parameter average's step, which a delay moves; use favg, local_adam or desloc",
        b.location_of("overlap"), s.overlap));
  if (s.join_step > 0)
    throw ConfigError(fmt::format(
        "{}: sync.join_step with overlap = \"{}\" is not supported (a joining worker has no "
        "share of the averages in flight)",
        b.location_of("join_step"), s.overlap));
}

// sync.fragments: a state average to split, at most one fragment of a state due per step, no
// step of the average that acts on the whole buffer at once, and no more fragments than
// parameters.
void check_fragments(const Binder& b, const sync::SyncConfig& s, const model::GptConfig& model) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"fragments_u", "fragments_v"})
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" averages u and v with x; use sync.fragments",
          b.location_of(key), key, to_string(s.method)));
  const SyncSchedule sched = s.schedule();
  const int most = std::max({s.fragments, sched.parts_u(), sched.parts_v()});
  if (most <= 1) return;
  const char* key = s.fragments == most       ? "fragments"
                    : sched.parts_u() == most ? "fragments_u"
                                              : "fragments_v";
  const std::string at = b.location_of(b.has(key) ? key : "fragments");
  if (!s.averages_params())
    throw ConfigError(fmt::format(
        "{}: sync.{} = {} splits the averages of x, u and v, but method = \"{}\" has none; "
        "remove it",
        at, key, most, to_string(s.method)));
  struct Rule {
    const char* key;
    int parts;
    const char* period_key;
    std::int64_t period;
  };
  for (const Rule& r :
       {Rule{"fragments", s.fragments, "kx", s.kx},
        Rule{desloc && s.fragments_u > 0 ? "fragments_u" : "fragments", sched.parts_u(),
             desloc ? "ku" : "kx", desloc ? s.effective_ku() : s.kx},
        Rule{desloc && s.fragments_v > 0 ? "fragments_v" : "fragments", sched.parts_v(),
             desloc ? "kv" : "kx", desloc ? s.effective_kv() : s.kx}})
    if (r.parts > r.period)
      throw ConfigError(fmt::format(
          "{}: sync.{} = {} exceeds the period {} = {}: the fragments are staggered one step "
          "apart at most, so at most {} fit",
          b.location_of(b.has(r.key) ? r.key : "fragments"), r.key, r.parts, r.period_key, r.period,
          r.period));
  if (s.outer != "none")
    throw ConfigError(fmt::format(
        "{}: sync.fragments with outer = \"{}\" is not supported (the outer step acts on the "
        "whole parameter average)",
        at, s.outer));
  if (s.method == SyncMethod::kFavgReset)
    throw ConfigError(fmt::format(
        "{}: sync.fragments with method = \"favg_reset\" is not supported (its reset of u and "
        "v acts on the whole buffers at the parameter average)",
        at));
  if (s.join_step > 0)
    throw ConfigError(fmt::format(
        "{}: sync.fragments with join_step is not supported (a joining worker starts from a "
        "whole average)",
        at));
  const double params = model::parameter_count(model);
  if (static_cast<double>(most) > params)
    throw ConfigError(fmt::format("{}: sync.{} = {} exceeds the model's {} parameters", at, key,
                                  most, static_cast<long long>(params)));
}

// sync.codec_*: only on a state the method averages across sites, with error feedback only
// behind a codec, and not where something else owns the average's reference.
void check_codecs(const Binder& b, const sync::SyncConfig& s) {
  const bool moments = s.method == SyncMethod::kDesloc || s.method == SyncMethod::kLocalAdam;
  const sync::CompressionConfig c = s.compression();
  struct Rule {
    const char* key;
    bool compressed;
    bool averaged;
  };
  for (const Rule& r : {Rule{"codec_x", c.compresses(optim::StateKind::kX), s.averages_params()},
                        Rule{"codec_u", c.compresses(optim::StateKind::kU), moments},
                        Rule{"codec_v", c.compresses(optim::StateKind::kV), moments}})
    if (r.compressed && !r.averaged)
      throw ConfigError(fmt::format(
          "{}: sync.{} compresses a state that method = \"{}\" never averages across sites; "
          "remove it{}",
          b.location_of(r.key), r.key, to_string(s.method),
          s.averages_params() ? " (only desloc and local_adam average u and v)" : ""));
  if (b.has("codec_block") && s.codec_block % 4 != 0)
    throw ConfigError(fmt::format(
        "{}: sync.codec_block = {} must be a multiple of 4 (the packed integers of a block "
        "start on a byte boundary)",
        b.location_of("codec_block"), s.codec_block));
  if (s.error_feedback && !c.any())
    throw ConfigError(fmt::format(
        "{}: sync.error_feedback = true without a codec: an fp32 average drops nothing to feed "
        "back; set codec_x, codec_u or codec_v",
        b.location_of("error_feedback")));
  if (!c.any()) return;
  const char* key = c.compresses(optim::StateKind::kX)   ? "codec_x"
                    : c.compresses(optim::StateKind::kU) ? "codec_u"
                                                         : "codec_v";
  if (s.outer != "none")
    throw ConfigError(fmt::format(
        "{}: sync.{} with outer = \"{}\" is not supported (the outer step keeps its own "
        "reference of the parameter average)",
        b.location_of(key), key, s.outer));
  if (s.method == SyncMethod::kFavgReset)
    throw ConfigError(fmt::format(
        "{}: sync.{} with method = \"favg_reset\" is not supported (its reset of u and v "
        "moves them away from the shared reference); use favg",
        b.location_of(key), key));
  if (s.join_step > 0)
    throw ConfigError(fmt::format(
        "{}: sync.{} with join_step is not supported (a joining worker holds no reference)",
        b.location_of(key), key));
}

// Cross-key rules of [sync]; each error points at the offending key.
void check_sync(const Binder& b, const sync::SyncConfig& s) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  for (const char* key : {"ku", "kv", "phase_u", "phase_v"}) {
    if (b.has(key) && !desloc)
      throw ConfigError(fmt::format(
          "{}: sync.{} is set, but method = \"{}\" has no separate {} average; remove it "
          "or use method = \"desloc\"",
          b.location_of(key), key, to_string(s.method), key[0] == 'k' ? key + 1 : key + 6));
  }
  for (const char* key : {"ku", "kv"}) {
    if (b.has(key) && (key[1] == 'u' ? s.ku : s.kv) <= 0)
      throw ConfigError(
          fmt::format("{}: sync.{} must be positive (omit it for the default {} * kx)",
                      b.location_of(key), key, key[1] == 'u' ? 3 : 6));
  }
  auto phase = [&](const char* key, std::int64_t value, std::int64_t period, const char* pkey) {
    if (value >= period)
      throw ConfigError(fmt::format("{}: sync.{} = {} must be smaller than its period {} = {}",
                                    b.location_of(key), key, value, pkey, period));
  };
  phase("phase_x", s.phase_x, s.kx, "kx");
  phase("phase_u", s.phase_u, s.effective_ku(), "ku");
  phase("phase_v", s.phase_v, s.effective_kv(), "kv");
  if (s.outer != "none" && !s.averages_params())
    throw ConfigError(fmt::format(
        "{}: sync.outer = \"{}\" needs a parameter average, but method = \"{}\" has none",
        b.location_of("outer"), s.outer, to_string(s.method)));
  if (s.overlaps() && !s.averages_params())
    throw ConfigError(fmt::format(
        "{}: sync.overlap = \"{}\" overlaps averages of x, u and v with compute, but method = "
        "\"{}\" has none{}",
        b.location_of("overlap"), s.overlap, to_string(s.method),
        s.method == SyncMethod::kDdp ? " (DDP's gradient average needs the step's gradient)" : ""));
  check_delays(b, s);
  if (s.join_step > 0 && s.join_workers <= s.workers)
    throw ConfigError(fmt::format(
        "{}: sync.join_workers = {} must exceed sync.workers = {} when join_step is set",
        b.location_of("join_workers"), s.join_workers, s.workers));
}

// job.regions and sync.region_*: every site of the job in exactly one region, periods that
// divide the job-wide ones, and only the modes the two levels are built for so far.
void check_regions(const Binder& b, const toml::table& root, const std::string& file,
                   const JobConfig& job) {
  const sync::SyncConfig& s = job.sync;
  const auto sync_at = [&](const char* key) {
    const auto* n = root.at_path(std::string("sync.") + key).node();
    return n != nullptr ? where(file, n->source()) : file;
  };
  const auto& regions = job.job.regions;
  if (regions.empty()) {
    for (const char* key : {"region_kx", "region_ku", "region_kv"})
      if (root.at_path(std::string("sync.") + key).node() != nullptr)
        throw ConfigError(
            fmt::format("{}: sync.{} is set, but job.regions is not: name the "
                        "regions, or remove it",
                        sync_at(key), key));
    return;
  }
  const std::string at = b.location_of("regions");
  const std::vector<std::string> sites = job.site_names();
  std::map<std::string, std::size_t> region_of;
  for (std::size_t g = 0; g < regions.size(); ++g) {
    if (regions[g].empty())
      throw ConfigError(fmt::format("{}: job.regions: region {} is empty", at, g + 1));
    for (const std::string& site : regions[g]) {
      if (std::find(sites.begin(), sites.end(), site) == sites.end())
        throw ConfigError(
            fmt::format("{}: job.regions names '{}', which is not a site of the job "
                        "(job.sites: {})",
                        at, site, fmt::join(sites, ", ")));
      if (const auto [it, fresh] = region_of.emplace(site, g); !fresh)
        throw ConfigError(fmt::format("{}: job.regions puts '{}' in region {} and in region {}", at,
                                      site, it->second + 1, g + 1));
    }
  }
  for (const std::string& site : sites)
    if (!region_of.contains(site))
      throw ConfigError(fmt::format("{}: job.regions leaves site '{}' in no region", at, site));
  if (!s.regional())
    throw ConfigError(
        fmt::format("{}: job.regions is set, but sync.region_kx is not: give the "
                    "period of the averages inside a region",
                    at));
  const bool desloc = s.method == SyncMethod::kDesloc;
  if (s.method != SyncMethod::kFavg && s.method != SyncMethod::kLocalAdam && !desloc)
    throw ConfigError(
        fmt::format("{}: job.regions needs sync.method = \"desloc\", \"local_adam\" "
                    "or \"favg\" (got \"{}\")",
                    at, to_string(s.method)));
  for (const char* key : {"region_ku", "region_kv"})
    if (root.at_path(std::string("sync.") + key).node() != nullptr && !desloc)
      throw ConfigError(
          fmt::format("{}: sync.{} is set, but method = \"{}\" averages u and v "
                      "with x; use sync.region_kx",
                      sync_at(key), key, to_string(s.method)));
  struct Level {
    const char* key;
    std::int64_t region, global, phase;
    const char* global_key;
    const char* phase_key;
  };
  for (const Level& l :
       {Level{"region_kx", s.region_kx, s.kx, s.phase_x, "kx", "phase_x"},
        Level{"region_ku", s.effective_region_ku(), s.effective_ku(), s.phase_u, "ku", "phase_u"},
        Level{"region_kv", s.effective_region_kv(), s.effective_kv(), s.phase_v, "kv",
              "phase_v"}}) {
    if (!desloc && l.key != std::string("region_kx")) continue;
    if (l.region >= l.global || l.global % l.region != 0)
      throw ConfigError(fmt::format(
          "{}: sync.{} = {} must divide sync.{} = {} and be shorter: a job-wide average must "
          "fall on a step the regions average too",
          sync_at(l.key), l.key, l.region, l.global_key, l.global));
    if (l.phase >= l.region)
      throw ConfigError(fmt::format("{}: sync.{} = {} must be smaller than sync.{} = {}",
                                    sync_at(l.phase_key), l.phase_key, l.phase, l.key, l.region));
  }
  // Built so far: blocking or step-overlapped fp32 averages of whole states.
  const auto refuse = [&](const char* key, const std::string& value) {
    throw ConfigError(
        fmt::format("{}: sync.{} = {} with job.regions is not supported yet "
                    "(regions average whole fp32 states, blocking or with "
                    "overlap = \"step\")",
                    sync_at(key), key, value));
  };
  if (s.delays()) refuse("overlap", "\"" + s.overlap + "\"");
  if (s.fragments > 1) refuse("fragments", std::to_string(s.fragments));
  if (s.fragments_u > 0) refuse("fragments_u", std::to_string(s.fragments_u));
  if (s.fragments_v > 0) refuse("fragments_v", std::to_string(s.fragments_v));
  for (const auto& [key, codec] : {std::pair{"codec_x", s.codec_x}, std::pair{"codec_u", s.codec_u},
                                   std::pair{"codec_v", s.codec_v}})
    if (codec != "fp32") refuse(key, "\"" + codec + "\"");
  if (s.outer != "none") refuse("outer", "\"" + s.outer + "\"");
  if (s.join_step > 0) refuse("join_step", std::to_string(s.join_step));
  if (!s.switches.empty()) refuse("switches", "[...]");
  if (s.replan) refuse("replan", "true");
}

// sync.switches and sync.replan: switches at parameter averages, in order, with periods the
// mode can run; re-planning only where there is a parameter average to switch at.
void check_switches(const Binder& b, const sync::SyncConfig& s) {
  const bool desloc = s.method == SyncMethod::kDesloc;
  const auto refuse_fragments = [&](const char* key) {
    if (s.fragments > 1)
      throw ConfigError(
          fmt::format("{}: sync.{} with sync.fragments = {} is not supported yet "
                      "(a switch keeps whole-state averages)",
                      b.location_of(key), key, s.fragments));
  };
  if (s.replan) {
    if (!s.averages_params())
      throw ConfigError(
          fmt::format("{}: sync.replan re-plans the periods of the parameter "
                      "average, but method = \"{}\" has none",
                      b.location_of("replan"), to_string(s.method)));
    refuse_fragments("replan");
  }
  if (s.switches.empty()) return;
  const std::string at = b.location_of("switches");
  if (!s.averages_params())
    throw ConfigError(
        fmt::format("{}: sync.switches changes the periods of the parameter "
                    "average, but method = \"{}\" has none",
                    at, to_string(s.method)));
  refuse_fragments("switches");
  if (s.switches.size() > sync::kMaxPeriodSwitches)
    throw ConfigError(fmt::format("{}: sync.switches has {} entries, at most {}", at,
                                  s.switches.size(), sync::kMaxPeriodSwitches));
  sync::SyncConfig base = s;
  base.switches.clear();
  sync::SyncPolicy policy(base);
  const std::array<std::int64_t, 3> tau = s.effective_delays();
  for (std::size_t i = 0; i < s.switches.size(); ++i) {
    const sync::PeriodSwitch& sw = s.switches[i];
    if (!desloc && (sw.ku != 0 || sw.kv != 0))
      throw ConfigError(
          fmt::format("{}: sync.switches[{}] sets ku or kv, but method = \"{}\" "
                      "averages u and v with x",
                      at, i + 1, to_string(s.method)));
    try {
      policy.add_switch(sw);
    } catch (const Error& e) {
      throw ConfigError(fmt::format("{}: sync.switches[{}]: {}", at, i + 1, e.message()));
    }
    const SyncSchedule& after = policy.schedule_at(sw.after + 1);
    for (const auto& [name, period, delay] :
         {std::tuple{"kx", after.kx, tau[0]}, std::tuple{"ku", after.ku, tau[1]},
          std::tuple{"kv", after.kv, tau[2]}})
      if (delay >= period)
        throw ConfigError(
            fmt::format("{}: sync.switches[{}] makes {} = {}, not longer than "
                        "its delay {}",
                        at, i + 1, name, period, delay));
  }
}

struct Section {
  const char* name;
  std::function<void(Binder&, JobConfig&)> bind;
};
const std::vector<Section>& sections() {
  static const std::vector<Section> s = {
      {"model", [](Binder& b, JobConfig& j) { bind_model(b, j.model); }},
      {"optim", [](Binder& b, JobConfig& j) { bind_optim(b, j.optim, j.clip); }},
      {"schedule", [](Binder& b, JobConfig& j) { bind_schedule(b, j.schedule); }},
      {"data", [](Binder& b, JobConfig& j) { bind_data(b, j.data); }},
      {"train", [](Binder& b, JobConfig& j) { bind_train(b, j.train); }},
      {"sync", [](Binder& b, JobConfig& j) { bind_sync(b, j.sync); }},
      {"job", [](Binder& b, JobConfig& j) { bind_job(b, j.job); }},
      {"transport", [](Binder& b, JobConfig& j) { bind_transport(b, j.transport); }},
  };
  return s;
}

// Binds each override of `section` through the section's own declarations, so a flag meets
// the checks its key meets in a file; messages name the flag.
void apply_overrides(const Section& sec, const std::vector<KeyOverride>& overrides,
                     JobConfig& job) {
  for (const KeyOverride& o : overrides) {
    if (o.section != sec.name) continue;
    toml::table table;
    std::visit([&](const auto& v) { table.insert(o.key, v); }, o.value);
    Binder b(o.flag, sec.name, &table, nullptr);
    sec.bind(b, job);
    b.reject_unknown_keys();
  }
}

JobConfig from_table(const toml::table& root, const std::string& file,
                     const std::vector<KeyOverride>& overrides) {
  for (const KeyOverride& o : overrides)
    if (std::none_of(sections().begin(), sections().end(),
                     [&](const Section& s) { return o.section == s.name; }))
      throw ConfigError(fmt::format("{}: overrides unknown table '{}'", o.flag, o.section));
  JobConfig job;
  job.source = file;
  std::set<std::string> known;
  std::string heads_at = file;
  for (const auto& sec : sections()) {
    known.insert(sec.name);
    const toml::node* node = root.get(sec.name);
    if (node != nullptr && !node->is_table())
      throw ConfigError(fmt::format("{}: '{}' must be a table ([{}])", where(file, node->source()),
                                    sec.name, sec.name));
    Binder b(file, sec.name, node ? node->as_table() : nullptr, nullptr);
    sec.bind(b, job);
    b.reject_unknown_keys();
    apply_overrides(sec, overrides, job);
    if (std::string(sec.name) == "model") heads_at = b.location_of("heads");
    if (std::string(sec.name) == "sync") {
      check_sync(b, job.sync);
      check_fragments(b, job.sync, job.model);
      check_codecs(b, job.sync);
      check_switches(b, job.sync);
    }
    if (std::string(sec.name) == "job" && !job.job.sites.empty()) {
      std::set<std::string> seen;
      for (const auto& site : job.job.sites) {
        if (!transport::valid_site_name(site))
          throw ConfigError(fmt::format("{}: job.sites: '{}' is not a valid site name ({})",
                                        b.location_of("sites"), site, transport::kSiteNameRule));
        if (!seen.insert(site).second)
          throw ConfigError(
              fmt::format("{}: job.sites names '{}' twice", b.location_of("sites"), site));
      }
      const auto* workers = root.at_path("sync.workers").node();
      const int m = static_cast<int>(job.job.sites.size());
      if (workers != nullptr && job.sync.workers != m)
        throw ConfigError(fmt::format(
            "{}: sync.workers = {} but job.sites names {} site(s); a site is a worker, so drop "
            "sync.workers or make them agree",
            where(file, workers->source()), job.sync.workers, m));
      job.sync.workers = m;
      if (job.sync.join_step > 0 && job.sync.join_workers <= m)
        throw ConfigError(fmt::format("{}: sync.join_workers = {} must exceed the {} sites", file,
                                      job.sync.join_workers, m));
    }
    if (std::string(sec.name) == "job") {
      check_regions(b, root, file, job);
      // Below 1.5 the longest wait would barely stand out of the others (below 1 every failure
      // would name one).
      if (job.job.straggler_ratio > 0.0f && job.job.straggler_ratio < 1.5f)
        throw ConfigError(fmt::format("{}: job.straggler_ratio = {} must be 0 (off) or >= 1.5",
                                      b.location_of("straggler_ratio"), job.job.straggler_ratio));
    }
  }
  for (auto&& [k, v] : root) {
    if (!known.contains(std::string(k.str())))
      throw ConfigError(
          fmt::format("{}: unknown table or key '{}' (valid tables: model, optim, schedule, data, "
                      "train, sync, job, transport)",
                      where(file, k.source()), k.str()));
  }
  if (job.model.d_model % job.model.heads != 0)
    throw ConfigError(fmt::format("{}: model.heads = {} does not divide model.d_model = {}",
                                  heads_at, job.model.heads, job.model.d_model));
  if (job.seq_len() > job.model.context)
    throw ConfigError(fmt::format("{}: data.seq_len = {} exceeds model.context = {}", file,
                                  job.data.seq_len, job.model.context));
  job.model.validate();
  job.optim.validate();
  job.clip.validate();
  job.schedule.validate();
  return job;
}

}  // namespace

JobConfig parse_config(std::string_view text, const std::string& source_name,
                       const std::vector<KeyOverride>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(
        fmt::format("{}: TOML syntax error: {}", where(source_name, e.source()), e.description()));
  }
  return from_table(root, source_name, overrides);
}

JobConfig load_config(const std::string& path, const std::vector<KeyOverride>& overrides) {
  // A directory reads as an empty document, which would silently mean "all defaults".
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> tomls;
    for (std::filesystem::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".toml") tomls.push_back(it->path().string());
    std::sort(tomls.begin(), tomls.end());
    throw ConfigError(fmt::format("{}: is a directory, not a config file; pass a TOML file{}", path,
                                  tomls.empty()
                                      ? std::string(" (e.g. configs/quickstart.toml)")
                                      : fmt::format(" such as {}", fmt::join(tomls, " or "))));
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& r = e.source();
    if (r.begin.line == 0)
      throw ConfigError(fmt::format("{}: cannot read config: {}", path, e.description()));
    throw ConfigError(fmt::format("{}: TOML syntax error: {}", where(path, r), e.description()));
  }
  return from_table(root, path, overrides);
}

std::string default_config_toml() {
  std::ostringstream out;
  JobConfig job;
  out << "# desloc job configuration: every key, its default and its meaning.\n";
  for (const auto& sec : sections()) {
    out << "\n[" << sec.name << "]\n";
    Binder b("", sec.name, nullptr, &out);
    sec.bind(b, job);
  }
  return out.str();
}

std::string JobConfig::canonical() const {
  // Fixed-format text of every trajectory-shaping value; {:a} prints floats exactly.
  std::string text = fmt::format("model:{},{},{},{},{};", model.vocab, model.context, model.layers,
                                 model.heads, model.d_model);
  text += fmt::format("optim:{},{:a},{:a},{:a},{:a},{};clip:{},{:a};", optim.name, optim.beta1,
                      optim.beta2, optim.eps, optim.weight_decay, optim.bias_correction, clip.mode,
                      clip.value);
  text += fmt::format("schedule:{},{:a},{},{:a},{:a};", schedule.kind, schedule.lr, schedule.warmup,
                      schedule.min_lr_ratio, schedule.decay_fraction);
  text += fmt::format("data:{},{},{};train:{},{},{};", data.batch, seq_len(), data.seed,
                      train.steps, train.seed, train.backend);
  text += fmt::format("sync:{},{},{},{},{},{},{},{},{},{:a},{:a},{},{}", to_string(sync.method),
                      sync.workers, sync.kx, sync.effective_ku(), sync.effective_kv(), sync.phase_x,
                      sync.phase_u, sync.phase_v, sync.outer, sync.outer_lr, sync.outer_momentum,
                      sync.join_step, sync.join_workers);
  // Sites and ranks shape the data partition and the order of every sum.
  // So do the lanes: the second half of each shard sums in the reversed ring's order.
  text += fmt::format(";job:{},{},{}", fmt::join(site_names(), ","), job.ranks_per_site,
                      transport::effective_lanes(transport.lanes, sync.workers));
  // Regions decide which sites each average sums (one level keeps earlier fingerprints).
  if (!job.regions.empty()) {
    for (const auto& region : job.regions)
      text += fmt::format(";region:{}", fmt::join(region, ","));
    text += fmt::format(";region_k:{},{},{}", sync.region_kx, sync.effective_region_ku(),
                        sync.effective_region_kv());
  }
  // Configured period switches (none keeps earlier fingerprints). A re-plan's switches are not
  // config: the checkpoints carry them.
  for (const sync::PeriodSwitch& sw : sync.switches)
    text += fmt::format(";switch:{},{},{},{}", sw.after, sw.kx, sw.ku, sw.kv);
  // And where the lanes split each shard (an even split keeps the fingerprint of earlier jobs).
  if (transport::effective_lanes(transport.lanes, sync.workers) == 2 &&
      transport.lane_share != 0.5f)
    text += fmt::format(",{:a}", transport.lane_share);
  return text;
}

std::vector<std::string> JobConfig::site_names() const {
  if (!job.sites.empty()) return job.sites;
  std::vector<std::string> names;
  for (int w = 0; w < sync.workers; ++w) names.push_back(fmt::format("site{}", w));
  return names;
}

std::uint64_t JobConfig::hash() const { return fnv1a64(canonical()); }

std::uint64_t JobConfig::hash(std::string_view tokenizer) const {
  if (tokenizer.empty() || tokenizer == "byte") return hash();
  return fnv1a64(canonical() + ";tokenizer:" + std::string(tokenizer));
}

}  // namespace desloc::train
