// Every key of a job config, declared once: its TOML name, its default (the struct's), its
// documentation, its range or choices and its scope (whether it shapes the trajectory).
#include <toml++/toml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "config_binder.hpp"
#include "desloc/core/sync_schedule.hpp"

namespace desloc::train {
namespace {

void bind_model(Binder& b, model::GptConfig& m) {
  b.integer("vocab", m.vocab, "vocabulary size (256 = byte-level tokenizer)", 1, 65536);
  b.integer("context", m.context, "maximum sequence length T (learned position embeddings)", 1);
  b.integer("layers", m.layers, "transformer blocks L", 1);
  b.integer("heads", m.heads, "attention heads; must divide d_model", 1);
  b.integer("d_model", m.d_model, "embedding width C", 1);
}
void bind_optim(Binder& b, optim::OptimizerConfig& o, optim::ClipConfig& c) {
  b.choice("name", o.algorithm, "local optimizer: \"adamw\" or \"adopt\"",
           {{"adamw", optim::Algorithm::kAdamW}, {"adopt", optim::Algorithm::kAdopt}});
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
  // Where the data lies is the process's business; what it holds enters hash(tokenizer).
  b.scope_next(KeyScope::kProcess);
  b.string("dir", d.dir, "dataset directory written by `desloc prepare` (or another tool)");
  // The tokenizer identity a checkpoint's hash covers names the format (external data).
  b.scope_next(KeyScope::kProcess);
  b.choice("format", d.format,
           "\"desloc\" (`desloc prepare`'s shards), \"nanogpt\" (train.bin, val.bin) or "
           "\"llmc\" (*_train*.bin, *_val*.bin), read in place",
           {{"desloc", data::TokenFormat::kDesloc},
            {"nanogpt", data::TokenFormat::kNanogpt},
            {"llmc", data::TokenFormat::kLlmc}});
  b.integer("batch", d.batch, "sequences per step per rank (B)", 1);
  b.integer("seq_len", d.seq_len, "tokens per sequence T (0 = model.context)", 0);
  b.unsigned64("seed", d.seed, "data-order seed");
}
void bind_train(Binder& b, RunConfig& r) {
  b.integer64("steps", r.steps, "optimizer steps (and the LR schedule's length)", 1);
  // Evaluations change no parameter, but a networked job's ranks evaluate together.
  b.scope_next(KeyScope::kJob);
  b.integer("eval_every", r.eval_every,
            "steps between validation evaluations (0 = at the end only)", 0);
  b.scope_next(KeyScope::kJob);
  b.integer("eval_batches", r.eval_batches, "validation batches per evaluation", 1);
  // A checkpoint folds delayed averages in early (JobConfig::entries drops it without them).
  b.integer("checkpoint_every", r.checkpoint_every,
            "steps between checkpoints (0 = at the end only)", 0);
  b.scope_next(KeyScope::kProcess);
  b.integer("log_every", r.log_every, "steps between log lines when stderr is not a TTY", 1);
  b.scope_next(KeyScope::kProcess);
  b.string("out_dir", r.out_dir, "where metrics.jsonl and checkpoints are written");
  b.unsigned64("seed", r.seed, "parameter initialisation seed");
  b.choice("backend", r.backend, "\"cpu\" or \"cuda\"",
           {{"cpu", model::Backend::kCpu}, {"cuda", model::Backend::kCuda}});
  // Sums split by thread round differently, but launch gives each rank its share of the cores:
  // a job is identified without it (README: the same job at another thread count).
  b.scope_next(KeyScope::kProcess);
  b.integer("threads", r.threads, "CPU threads for the model (0 = all cores)", 0, 1024);
}

void bind_sync(Binder& b, sync::SyncConfig& s) {
  b.choice("method", s.method,
           "\"none\", \"ddp\", \"favg\" (FAVG+OPT), \"favg_reset\", \"local_adam\" or \"desloc\"",
           {{"none", SyncMethod::kNone},
            {"ddp", SyncMethod::kDdp},
            {"favg", SyncMethod::kFavg},
            {"favg_reset", SyncMethod::kFavgReset},
            {"local_adam", SyncMethod::kLocalAdam},
            {"desloc", SyncMethod::kDesloc}});
  b.integer("workers", s.sites, "in-process virtual workers (sites) M", 1, 4096);
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
  b.choice("outer", s.outer, "outer optimizer on the parameter average: \"none\" or \"nesterov\"",
           {{"none", sync::OuterStep::kNone}, {"nesterov", sync::OuterStep::kNesterov}});
  b.real("outer_lr", s.outer_lr, "outer Nesterov learning rate", 0.0, 10.0, true);
  b.real("outer_momentum", s.outer_momentum, "outer Nesterov momentum", 0.0, 0.999999);
  b.choice("weights", s.weights,
           "each site's weight in every average: \"tokens\" (the tokens it trains on per step, "
           "[[job.site]]'s ranks x batch) or \"equal\"; sites alike weigh alike either way",
           {{"tokens", sync::SiteWeights::kTokens}, {"equal", sync::SiteWeights::kEqual}});
  b.integer64("join_step", s.join_step,
              "elastic join: from this step on, grow to join_workers (0 = never)", 0);
  b.integer("join_workers", s.join_sites, "elastic join: worker count after the join", 0, 4096);
  b.choice("overlap", s.overlap,
           "\"none\": averages block the step; \"step\": the averages of x, u and v run during "
           "the step's forward and backward pass (the same numbers); \"delayed\": an average "
           "started at step t is folded in at t + delay, keeping the progress made meanwhile; "
           "\"delayed_naive\": the same, replacing the state by the stale mean (comparison only)",
           {{"none", Overlap::kNone},
            {"step", Overlap::kStep},
            {"delayed", Overlap::kDelayed},
            {"delayed_naive", Overlap::kDelayedNaive}});
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
  b.comment_next();
  b.site_specs("site", j.site,
               "[[job.site]] tables, one per site in ring order: name, ranks, batch (sites that "
               "differ; replaces job.sites, job.ranks_per_site and data.batch)");
  // How the processes find and watch each other: each process's own settings.
  b.scope_next(KeyScope::kProcess);
  b.string("coordinator", j.coordinator, "host:port of `desloc coordinator` (launch picks a port)");
  b.scope_next(KeyScope::kProcess);
  b.string("token_file", j.token_file,
           "file holding the job's shared secret (else token, else $DESLOC_JOB_TOKEN)");
  b.scope_next(KeyScope::kProcess);
  b.string("token", j.token, "the shared secret inline (prefer token_file)");
  b.scope_next(KeyScope::kProcess);
  b.integer("rendezvous_timeout_s", j.rendezvous_timeout_s, "deadline for every rank to register",
            1, 86400);
  b.scope_next(KeyScope::kProcess);
  b.integer("heartbeat_ms", j.heartbeat_ms, "rank -> coordinator heartbeat period", 10, 60000);
  b.scope_next(KeyScope::kProcess);
  b.integer("heartbeat_timeout_ms", j.heartbeat_timeout_ms,
            "silence after which a rank is listed missing", 50, 600000);
  // What a failure does: the ranks abort their collectives on the coordinator's word only when
  // the job continues, so they must agree with it.
  b.scope_next(KeyScope::kJob);
  b.choice("on_site_failure", j.on_site_failure,
           "\"continue\": drop a failed site and go on in a new epoch; \"stop\": end the job",
           {{"continue", OnSiteFailure::kContinue}, {"stop", OnSiteFailure::kStop}});
  b.scope_next(KeyScope::kJob);
  b.integer("min_sites", j.min_sites, "fewer live sites than this end the job", 1, 4096);
  b.scope_next(KeyScope::kJob);
  b.real("straggler_ratio", j.straggler_ratio,
         "a failure that lost no site drops the site on the slow link: the TCP data unsent to "
         "or from it (or its send wait) is this many times any other link's (at least 1 s; "
         "0 = never drop a live site)",
         0.0, 1000.0);
  b.scope_next(KeyScope::kProcess);
  b.integer("coordinator_timeout_s", j.coordinator_timeout_s,
            "a rank that loses the coordinator trains on and reconnects for this long (0 = fail "
            "at once); a restarted coordinator rebuilds the membership from the ranks",
            0, 86400);
  b.scope_next(KeyScope::kProcess);
  b.integer("recovery_timeout_s", j.recovery_timeout_s,
            "a survivor must report for the next membership epoch within this", 1, 86400);
  b.scope_next(KeyScope::kJob);
  b.boolean("tls", j.tls, "TLS on the control connections (coordinator <-> ranks)");
  b.scope_next(KeyScope::kProcess);
  b.string("tls_cert", j.tls_cert, "coordinator's PEM certificate chain (with tls)");
  b.scope_next(KeyScope::kProcess);
  b.string("tls_key", j.tls_key, "coordinator's PEM private key (with tls)");
  b.scope_next(KeyScope::kProcess);
  b.string("tls_ca", j.tls_ca,
           "PEM CA the ranks trust for the coordinator's certificate (\"\" = system CAs)");
}
void bind_transport(Binder& b, TransportSection& t) {
  // The transports each process opens: its own (a site's NICs have their own names).
  b.scope_next(KeyScope::kProcess);
  b.string("tls", t.tls, "wide-area UCX_TLS (only tcp crosses network namespaces)");
  b.scope_next(KeyScope::kProcess);
  b.string("net_devices", t.net_devices, "wide-area UCX_NET_DEVICES (e.g. \"lo\", \"eth0\")");
  b.scope_next(KeyScope::kProcess);
  b.string("site_tls", t.site_tls, "intra-site UCX_TLS");
  b.scope_next(KeyScope::kProcess);
  b.string("site_net_devices", t.site_net_devices, "intra-site UCX_NET_DEVICES");
  // Both ends of a ring cut a buffer into the same chunks and frame them alike.
  b.scope_next(KeyScope::kJob);
  b.integer64("chunk_bytes", t.chunk_bytes, "pipelining unit of the ring collectives", 4,
              std::int64_t{1} << 30);
  b.scope_next(KeyScope::kProcess);
  b.integer("inflight_chunks", t.inflight_chunks, "receives posted ahead per ring", 1, 1024);
  b.scope_next(KeyScope::kProcess);
  b.string("rndv_thresh", t.rndv_thresh,
           "UCX_RNDV_THRESH (\"inf\" = eager only, measured faster on links with latency; \"\" = "
           "UCX default)");
  b.scope_next(KeyScope::kProcess);
  b.integer("spin_iterations", t.spin_iterations,
            "progress polls before sleeping on the UCX event fd, in the site group", 0, 1 << 30);
  b.scope_next(KeyScope::kProcess);
  b.integer("wan_spin_iterations", t.wan_spin_iterations,
            "the same in the wide-area groups (0: sleep as soon as UCX has nothing to do)", 0,
            1 << 30);
  b.scope_next(KeyScope::kProcess);
  b.integer("wan_linger_us", t.wan_linger_us,
            "wide-area groups: then sleep this long and take what arrived, while that brings "
            "work, before sleeping on the event fd (one wake-up per linger, not per few packets; "
            "adds up to this latency per wait; 0 = off)",
            0, 1000000);
  b.scope_next(KeyScope::kProcess);
  b.real("deadline_s", t.deadline_s, "every collective must finish within this", 0.0, 1e6, true);
  b.scope_next(KeyScope::kJob);
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

}  // namespace

const std::vector<ConfigSection>& config_sections() {
  static const std::vector<ConfigSection> s = {
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

}  // namespace desloc::train
