// A multi-site job as processes: `desloc worker` (one rank), `desloc coordinator` (rendezvous,
// authentication, membership, heartbeats) and `desloc launch` (a whole job on this machine:
// the coordinator in-process and every rank as a child process).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "desloc/train/config.hpp"
#include "desloc/train/trainer.hpp"
#include "desloc/transport/auth.hpp"
#include "desloc/transport/wire.hpp"

namespace desloc::cluster {

// Environment variable that carries the job token from `desloc launch` to its ranks (never the
// command line, which other users can read).
inline constexpr const char* kTokenEnv = "DESLOC_JOB_TOKEN";

// The job's shared secret: job.token_file, else job.token, else $DESLOC_JOB_TOKEN. ConfigError
// naming all three when none is set.
transport::JobToken job_token(const train::JobConfig& cfg);

// What every process of the job must share, as the coordinator checks it: the config's keys of
// scope kTrajectory and kJob (train::KeyScope) with their values.
std::vector<transport::ConfigValue> agreement_values(const train::JobConfig& cfg);

struct RankIdentity {
  std::string site;
  int rank = 0;
};

// A rank's identity from the scheduler: Slurm (SLURM_PROCID, SLURM_NTASKS) or Open MPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE). Global ranks count the sites' ranks in
// job.sites order (rank g % R of site g / R for sites alike). nullopt when neither is set;
// ConfigError if the world size disagrees with the config's ranks.
std::optional<RankIdentity> identity_from_environment(const train::JobConfig& cfg);

// "host:port" -> parts; ConfigError naming `what` (e.g. "--coordinator") when malformed.
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& text,
                                                     const std::string& what);

struct WorkerOptions {
  RankIdentity id;
  std::string coordinator;  // host:port
  train::TrainOptions train;
};

// One rank: opens its UCX ports, registers with the coordinator, waits for the membership,
// connects its site and wide-area groups, and trains. Throws on any failure with the peer,
// key or step named; a failed peer makes it exit within transport.deadline_s.
train::TrainResult run_worker(const train::JobConfig& cfg, const WorkerOptions& opts);

// `desloc worker --profile FILE`: instead of training, measure this job's topology (latency
// and bandwidth of every directed site pair, one pair at a time and all at once, and each
// site's compute step) over the same control plane and UCX transport, and have site 0 write
// FILE (topology.toml). Returns a process exit status.
int run_profile_worker(const train::JobConfig& cfg, const WorkerOptions& opts,
                       const std::string& out_path);

// The coordinator's read-only status endpoint (transport/status_http.hpp): the dashboard at /,
// /metrics and /api/state.
struct StatusEndpoint {
  std::string http;      // "host:port" to serve it on ("" = none)
  std::string topology;  // a topology.toml whose link rates are the plan the links are held to
};

// `desloc coordinator`: serves rendezvous on `bind:port` until every rank of the job has
// registered and later disconnected. Returns a process exit status (0 when every rank reported
// the last step). SIGINT/SIGTERM stop it early.
int run_coordinator(const train::JobConfig& cfg, const std::string& bind, std::uint16_t port,
                    const StatusEndpoint& status = {});

struct LaunchOptions {
  std::string config_path;               // passed to every rank
  std::string out_dir;                   // override of train.out_dir ("" = keep)
  bool progress = true;                  // the leader's progress lines
  std::vector<std::string> worker_args;  // extra arguments for every rank (e.g. --profile F)
  StatusEndpoint status;                 // the coordinator's status endpoint, if any
};

// `desloc launch`: the whole job on this machine over loopback. Returns the exit status: 0,
// 130 after a clean Ctrl-C stop, 1 naming the rank(s) that failed.
int run_launch(const train::JobConfig& cfg, const LaunchOptions& opts);

}  // namespace desloc::cluster
