// `desloc coordinator` and `desloc launch`: the control plane as a service, and a whole job on
// one machine (the coordinator in-process, every rank a child process, one combined view).
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "desloc/cluster/cluster.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/core/signals.hpp"
#include "desloc/topology/regions.hpp"
#include "desloc/topology/topology.hpp"
#include "desloc/transport/control_plane.hpp"
#include "desloc/transport/status_http.hpp"

namespace desloc::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Count of SIGINT/SIGTERM received. A lock-free atomic, not a volatile sig_atomic_t: the handler
// runs on whichever thread the kernel picks (the coordinator's, say), and the main thread reads
// the count; volatile orders nothing between threads (ThreadSanitizer reported the race).
std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");
extern "C" void on_signal(int) { g_signals.fetch_add(1); }

// Counts SIGINT and SIGTERM from zero for its lifetime.
class SignalCounter {
 public:
  SignalCounter() : scope_((g_signals.store(0), on_signal)) {}
  int count() const { return g_signals.load(); }

 private:
  SignalScope scope_;
};

transport::CoordinatorOptions coordinator_options(const train::JobConfig& cfg,
                                                  transport::JobToken token,
                                                  const std::string& bind) {
  transport::CoordinatorOptions o;
  o.site_names = cfg.site_names();
  o.num_sites = o.site_names.size();
  o.ranks_per_site = static_cast<std::size_t>(cfg.job.ranks_per_site);
  if (!cfg.ranks_alike())
    for (const int r : cfg.site_rank_counts()) o.site_ranks.push_back(static_cast<std::size_t>(r));
  o.token = std::move(token);
  o.config_hash = cfg.agreement_hash();
  o.config = agreement_values(cfg);
  o.bind_address = bind;
  o.heartbeat_timeout = std::chrono::milliseconds(cfg.job.heartbeat_timeout_ms);
  o.elastic = cfg.job.on_site_failure == train::OnSiteFailure::kContinue;
  o.min_sites = static_cast<std::size_t>(cfg.job.min_sites);
  o.straggler_ratio = cfg.job.straggler_ratio;
  o.recovery_timeout = std::chrono::seconds(cfg.job.recovery_timeout_s);
  o.tls = {cfg.job.tls, cfg.job.tls_cert, cfg.job.tls_key, "", ""};
  o.regions = cfg.job.regions;
  return o;
}

// "steps 120..124 of 600, slowest west/1" from the ranks' heartbeats.
// What the status endpoint shows of the job besides the coordinator's state: its sync
// settings as the plan, and the topology's link rates when one is given.
transport::JobDescription describe_job(const train::JobConfig& cfg, const std::string& topology) {
  transport::JobDescription d;
  d.sites = cfg.site_names();
  d.ranks_per_site = static_cast<std::uint32_t>(cfg.job.ranks_per_site);
  if (!cfg.ranks_alike())
    for (const int r : cfg.site_rank_counts())
      d.site_ranks.push_back(static_cast<std::uint32_t>(r));
  d.steps = cfg.train.steps;
  d.heartbeat = std::chrono::milliseconds(cfg.job.heartbeat_ms);
  const sync::SyncConfig& s = cfg.sync;
  auto add = [&d](std::string key, auto value) {
    d.plan.emplace_back(std::move(key), fmt::format("{}", value));
  };
  add("method", to_string(s.method));
  if (s.method != SyncMethod::kNone && s.method != SyncMethod::kDdp) {
    add("kx", s.kx);
    if (s.method == SyncMethod::kDesloc) {
      add("ku", s.effective_ku());
      add("kv", s.effective_kv());
    }
    add("phases (x, u, v)", fmt::format("{}, {}, {}", s.phase_x, s.phase_u, s.phase_v));
    if (!cfg.job.regions.empty()) {
      add("regions", topology::describe_regions(cfg.job.regions));
      add("region kx, ku, kv",
          fmt::format("{}, {}, {}", s.region_kx, s.effective_region_ku(), s.effective_region_kv()));
    }
    add("overlap", to_string(s.overlap));
    if (s.delays()) {
      const auto tau = s.effective_delays();
      add("delay (x, u, v)", fmt::format("{}, {}, {}", tau[0], tau[1], tau[2]));
    }
    add("fragments", s.fragments);
    add("codecs (x, u, v)", fmt::format("{}, {}, {}", s.codec_x, s.codec_u, s.codec_v));
    if (s.outer != sync::OuterStep::kNone)
      add("outer", fmt::format("{} (lr {})", to_string(s.outer), s.outer_lr));
  }
  add("lanes", cfg.transport.lane_share != 0.5f && cfg.transport.lanes == 2
                   ? fmt::format("2 ({:.3g} of each shard on the ring)", cfg.transport.lane_share)
                   : fmt::format("{}", cfg.transport.lanes));
  add("sites x ranks",
      cfg.ranks_alike()
          ? fmt::format("{} x {}", d.sites.size(), cfg.job.ranks_per_site)
          : fmt::format("{} sites of {} ranks", d.sites.size(), fmt::join(d.site_ranks, ", ")));
  if (!topology.empty()) {
    const topology::Topology t = topology::load_topology(topology);
    // Its links are compared with the job's ring links by site name: a topology of other
    // sites would give the dashboard nothing to compare, silently.
    const auto names = t.site_names();
    std::vector<std::string> missing;
    for (const std::string& s : d.sites)
      if (std::find(names.begin(), names.end(), s) == names.end()) missing.push_back(s);
    if (missing.size() == d.sites.size())
      throw ConfigError(fmt::format(
          "--topology {}: it describes sites [{}], none of the job's [{}]; give the topology "
          "`desloc profile` measured for this job",
          topology, fmt::join(names, ", "), fmt::join(d.sites, ", ")));
    if (!missing.empty())
      log::warn("--topology {}: no measurements of site(s) [{}]; their links show no planned rate",
                topology, fmt::join(missing, ", "));
    for (const topology::LinkProfile& l : t.links)
      d.planned_bytes_per_s[{l.from, l.to}] =
          l.contended_bps > 0 ? l.contended_bps : l.bandwidth_bps;
    add("topology", std::filesystem::path(topology).filename().string());
  }
  return d;
}

// The coordinator's status endpoint when asked for (--http host:port); it stops before the
// coordinator it reads.
std::unique_ptr<transport::StatusServer> start_status(const transport::Coordinator& coord,
                                                      const train::JobConfig& cfg,
                                                      const StatusEndpoint& endpoint,
                                                      std::optional<transport::JobToken> token) {
  if (endpoint.http.empty()) {
    if (!endpoint.topology.empty())
      throw ConfigError("--topology " + endpoint.topology +
                        ": it gives the status endpoint its planned link rates; add --http");
    return nullptr;
  }
  const auto [host, port] = parse_endpoint(endpoint.http, "--http");
  transport::StatusServerOptions o;
  o.bind = host;
  o.port = port;
  o.job = describe_job(cfg, endpoint.topology);
  o.token = std::move(token);
  auto server = std::make_unique<transport::StatusServer>(coord, std::move(o));
  const std::uint16_t bound = server->start();
  // An IPv6 address in a URL takes brackets, so that its colons are not the port's.
  const std::string shown = host.find(':') == std::string::npos ? host : "[" + host + "]";
  std::fprintf(stderr,
               "http: serving the dashboard, /metrics (Prometheus) and /api/state on "
               "http://%s:%u/\n",
               shown.c_str(), bound);
  std::fflush(stderr);
  return server;
}

std::string progress_line(const transport::Coordinator& c, std::int64_t total) {
  const auto ranks = c.progress();
  if (ranks.empty()) return "no rank registered yet";
  auto [lo, hi] = std::minmax_element(ranks.begin(), ranks.end(),
                                      [](const auto& a, const auto& b) { return a.step < b.step; });
  std::string line = fmt::format("steps {}..{} of {}", lo->step, hi->step, total);
  if (lo->step != hi->step) line += fmt::format(", slowest {}", lo->id.str());
  std::vector<std::string> silent;
  for (const auto& r : ranks)
    if (r.connected && r.silent > 2s)
      silent.push_back(fmt::format("{} ({} ms)", r.id.str(), r.silent.count()));
  if (!silent.empty()) line += fmt::format(", silent: {}", fmt::join(silent, ", "));
  return line;
}

std::string random_secret() {
  const auto a = transport::random_nonce();
  const auto b = transport::random_nonce();
  std::string hex;
  for (auto byte : a) hex += fmt::format("{:02x}", byte);
  for (auto byte : b) hex += fmt::format("{:02x}", byte);
  return hex;
}

struct Child {
  std::string name;  // site/rank
  pid_t pid = -1;
  int out = -1;  // read end of its stdout+stderr
  std::string pending;
  bool exited = false;
  int status = 0;  // exit code, or 128 + signal
  // Once the coordinator dropped its site: when it gets SIGTERM, and then SIGKILL.
  Clock::time_point stop_at = Clock::time_point::max();
  Clock::time_point kill_at = Clock::time_point::max();
  bool killed = false;
};

// How long a rank of a dropped site has to leave after SIGTERM before SIGKILL.
constexpr auto kTermGrace = 5s;

// Whether the rank "site/r" belongs to a site in the coordinator's departed() list.
bool site_departed(const std::string& rank_name, const std::vector<std::string>& departed) {
  const std::string site = rank_name.substr(0, rank_name.rfind('/'));
  return std::any_of(departed.begin(), departed.end(),
                     [&](const std::string& d) { return d.rfind(site + " (", 0) == 0; });
}

// Stopped by a signal (SIGSTOP, SIGTSTP) or a tracer: it would not act on SIGTERM.
bool is_stopped(pid_t pid) {
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close = std::strrchr(buf, ')');
  return n > 0 && close != nullptr && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
}

// A rank of a site the coordinator dropped normally leaves at once: it hears the next epoch
// without its site. One that does not (frozen by SIGSTOP, a hung host) would keep launch
// waiting forever. It gets SIGTERM `grace` after the drop, or as soon as every other rank has
// exited, and SIGKILL kTermGrace later, at once if it is stopped.
void stop_dropped_ranks(std::vector<Child>& children, const std::vector<std::string>& departed,
                        Clock::duration grace) {
  if (departed.empty()) return;
  const auto now = Clock::now();
  const bool others_done = std::all_of(children.begin(), children.end(), [&](const Child& c) {
    return c.exited || site_departed(c.name, departed);
  });
  for (Child& c : children) {
    if (c.exited || c.killed || !site_departed(c.name, departed)) continue;
    if (c.stop_at == Clock::time_point::max()) c.stop_at = now + grace;
    if (others_done) c.stop_at = std::min(c.stop_at, now);
    if (c.kill_at == Clock::time_point::max() && now >= c.stop_at) {
      const bool stopped = is_stopped(c.pid);
      std::fprintf(stderr,
                   "launch: stopping rank %s: the coordinator dropped its site and it is still "
                   "running%s\n",
                   c.name.c_str(), stopped ? ", stopped by a signal: killing it" : "");
      ::kill(c.pid, SIGTERM);
      c.kill_at = stopped ? now : now + kTermGrace;
    }
    if (now >= c.kill_at) {
      ::kill(c.pid, SIGKILL);
      c.killed = true;
    }
  }
}

Child spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& name,
            const std::vector<std::pair<std::string, std::string>>& env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(fmt::format("launch: pipe for {}: {}", name, std::strerror(errno)));
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A stop sent to the child between fork and exec would run launch's own counting handler
  // there and be lost, leaving a rank that waits out its rendezvous deadline. So the stop
  // signals are blocked across the fork, and the child puts back their default action before
  // it unblocks them: a stop that arrived meanwhile ends it at once.
  sigset_t stops, before;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stops, &before);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) throw Error(fmt::format("launch: fork for {}: {}", name, std::strerror(errno)));
  if (pid == 0) {
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    // Own process group: a terminal Ctrl-C reaches launch alone, which turns it into an
    // orderly stop of every rank.
    ::setpgid(0, 0);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    // Nothing of launch's but the output pipe: Asio opens its listening sockets (the
    // coordinator's and the status endpoint's) without close-on-exec, and a rank that held them
    // would keep both ports taken, and their clients waiting, after launch is gone.
    ::close_range(3, ~0U, 0);
    // A rank whose launch died (killed, OOM) is told as launch's Ctrl-C would tell it: it
    // checkpoints at the next common step and leaves, rather than training on unwatched.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(130);  // launch died before the line above
    // Its output goes to launch through a pipe: once launch is gone, a write there must fail
    // (the line is lost), not kill the rank before it checkpoints.
    ::signal(SIGPIPE, SIG_IGN);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "launch: exec %s: %s\n", exe.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  Child c;
  c.name = name;
  c.pid = pid;
  c.out = fds[0];
  return c;
}

// Forwards complete lines as "[site/rank] line"; returns false at end of file.
bool pump(Child& c) {
  char buf[4096];
  const ssize_t n = ::read(c.out, buf, sizeof buf);
  if (n <= 0) {
    if (n < 0 && errno == EINTR) return true;
    if (!c.pending.empty()) std::fprintf(stderr, "[%s] %s\n", c.name.c_str(), c.pending.c_str());
    c.pending.clear();
    ::close(c.out);
    c.out = -1;
    return false;
  }
  c.pending.append(buf, static_cast<std::size_t>(n));
  std::size_t nl;
  while ((nl = c.pending.find_first_of("\n\r")) != std::string::npos) {
    const std::string line = c.pending.substr(0, nl);
    c.pending.erase(0, nl + 1);
    if (!line.empty()) std::fprintf(stderr, "[%s] %s\n", c.name.c_str(), line.c_str());
  }
  return true;
}

// How a job that every rank left ended. It succeeded when at least job.min_sites sites (one at
// least) finished every step on every rank: a job whose every site was dropped, or whose
// survivors stopped short, did not, whatever exit statuses its ranks chose.
struct JobOutcome {
  bool ok = false;
  std::string text;
};
JobOutcome job_outcome(const train::JobConfig& cfg,
                       const std::vector<transport::RankProgress>& ranks,
                       const transport::Membership& last,
                       const std::vector<std::string>& departed) {
  const auto steps = static_cast<std::uint64_t>(cfg.train.steps);
  std::vector<std::string> finished, short_ranks;
  for (const std::string& site : cfg.site_names()) {
    int done = 0;
    for (const auto& r : ranks)
      if (r.id.site == site) {
        if (r.finished && r.step >= steps)
          ++done;
        else
          short_ranks.push_back(fmt::format("{} (step {})", r.id.str(), r.step));
      }
    if (done == cfg.site_ranks(cfg.site_index(site))) finished.push_back(site);
  }
  const std::size_t needed = static_cast<std::size_t>(std::max(cfg.job.min_sites, 1));
  const std::string without =
      departed.empty() ? std::string() : fmt::format("; dropped: {}", fmt::join(departed, "; "));
  if (finished.size() >= needed && short_ranks.empty())
    return {true, fmt::format("every rank of {} site(s) [{}] finished {} steps and left{}",
                              finished.size(), fmt::join(finished, ", "), steps, without)};
  std::string why =
      last.sites.empty()
          ? fmt::format("the job ended at membership epoch {}: {}", last.epoch, last.note)
          : fmt::format(
                "every rank left, but only {} site(s) [{}] finished all {} steps, and "
                "the job needs {} (job.min_sites)",
                finished.size(), fmt::join(finished, ", "), steps, needed);
  if (!short_ranks.empty()) why += fmt::format("; stopped short: {}", fmt::join(short_ranks, ", "));
  return {false, why + without};
}

}  // namespace

int run_coordinator(const train::JobConfig& cfg, const std::string& bind, std::uint16_t port,
                    const StatusEndpoint& endpoint) {
  const transport::JobToken token = job_token(cfg);
  transport::Coordinator coord(coordinator_options(cfg, token, bind));
  const std::uint16_t bound = coord.start(port);
  const auto status = start_status(coord, cfg, endpoint, token);
  const auto sites = cfg.site_names();
  std::printf(
      "coordinator: listening on %s:%u for %zu site(s), %d rank(s) [%s], agreement hash "
      "%016llx\n",
      bind.c_str(), bound, sites.size(), cfg.ranks_of_sites(static_cast<int>(sites.size())),
      fmt::format("{}", fmt::join(sites, ", ")).c_str(),
      static_cast<unsigned long long>(cfg.agreement_hash()));
  std::fflush(stdout);
  SignalCounter signals;
  const auto deadline = Clock::now() + std::chrono::seconds(cfg.job.rendezvous_timeout_s);
  auto last_report = Clock::now();
  auto settle_by = Clock::time_point::max();  // see below: a recovery the ranks' exit began
  for (;;) {
    std::this_thread::sleep_for(200ms);
    coord.rethrow_if_failed();
    if (signals.count() > 0) {
      log::warn("coordinator: signal received; stopping (ranks will fail at their next deadline)");
      coord.stop();
      return 130;
    }
    const bool formed = coord.membership().has_value();
    if (!formed && Clock::now() > deadline) {
      log::error(
          "coordinator: rendezvous timed out after {} s (job.rendezvous_timeout_s); not "
          "registered: {}",
          cfg.job.rendezvous_timeout_s, fmt::join(coord.unregistered(), ", "));
      coord.stop();
      return 1;
    }
    if (formed) {
      const auto ranks = coord.progress();
      const auto membership = coord.membership();
      const bool ended = membership && membership->sites.empty();
      const bool gone =
          std::none_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.connected; });
      const bool finished =
          std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.finished; });
      // Ranks that left without finishing are failures the roster is still judging: its next
      // ticks close the recovery (and end the job when no site is left). Its verdict, not
      // the half-counted ranks, says why the job ended.
      if (gone && !ended && !finished && settle_by == Clock::time_point::max())
        settle_by = Clock::now() + std::chrono::milliseconds(cfg.job.heartbeat_timeout_ms);
      if (ended || (gone && (finished || Clock::now() >= settle_by))) {
        const JobOutcome outcome = job_outcome(cfg, ranks, *membership, coord.departed());
        coord.stop();
        if (outcome.ok) {
          std::printf("coordinator: %s\n", outcome.text.c_str());
          return 0;
        }
        log::error("coordinator: {}", outcome.text);
        return 1;
      }
    }
    if (Clock::now() - last_report > 10s) {
      last_report = Clock::now();
      log::info("coordinator: {}",
                formed ? progress_line(coord, cfg.train.steps)
                       : fmt::format("{} of {} ranks registered", coord.registered(),
                                     cfg.ranks_of_sites(static_cast<int>(sites.size()))));
    }
  }
}

namespace {

// After a forwarded stop, a rank that checkpointed and exited (130), or one that the signal or
// a second Ctrl-C ended before it could (a rank still starting up), was stopped, not lost.
bool stopped_by_launch(int status, int handled_signals) {
  return handled_signals > 0 && (status == 130 || status == 128 + SIGINT ||
                                 status == 128 + SIGTERM || status == 128 + SIGKILL);
}

// One `desloc worker` per rank of the job, each told the coordinator's port and its share of
// the cores; the leader alone prints progress. Kills those already started if one fails.
std::vector<Child> spawn_ranks(const train::JobConfig& cfg, const LaunchOptions& opts,
                               std::uint16_t port, int threads,
                               const std::vector<std::pair<std::string, std::string>>& env) {
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw Error("launch: cannot find this program's path (/proc/self/exe): " + ec.message());
  const std::string config = std::filesystem::absolute(opts.config_path).string();
  const auto sites = cfg.site_names();
  std::vector<Child> children;
  try {
    for (std::size_t s = 0; s < sites.size(); ++s)
      for (int r = 0; r < cfg.site_ranks(static_cast<int>(s)); ++r) {
        std::vector<std::string> args{"worker",
                                      "--config",
                                      config,
                                      "--site",
                                      sites[s],
                                      "--rank",
                                      std::to_string(r),
                                      "--coordinator",
                                      fmt::format("127.0.0.1:{}", port),
                                      "--threads",
                                      std::to_string(threads),
                                      "--no-progress"};
        args.insert(args.end(), opts.worker_args.begin(), opts.worker_args.end());
        if (!opts.out_dir.empty()) {
          args.push_back("--out-dir");
          args.push_back(opts.out_dir);
        }
        // One progress view: the leader's lines; the other ranks speak up only for warnings
        // and errors.
        if (s != 0 || r != 0 || !opts.progress) args.push_back("--quiet");
        children.push_back(spawn(exe, args, fmt::format("{}/{}", sites[s], r), env));
      }
  } catch (...) {
    for (auto& c : children) ::kill(c.pid, SIGKILL);
    for (auto& c : children) ::waitpid(c.pid, nullptr, 0);
    throw;
  }
  return children;
}

// What launch saw of its ranks while they ran.
struct Supervision {
  int handled_signals = 0;    // SIGINT/SIGTERM forwarded (the first) or escalated (more)
  std::string first_failure;  // the first rank that failed, if one did
  Clock::time_point kill_at = Clock::time_point::max();  // SIGKILL whatever still runs then
};

// Reaps the ranks that exited since the last look, noting failures; without elasticity the
// first failure starts the others' deadline.
void reap(std::vector<Child>& children, Supervision& sv, const train::JobConfig& cfg,
          Clock::duration grace) {
  const bool elastic = cfg.job.on_site_failure == train::OnSiteFailure::kContinue;
  for (auto& c : children) {
    if (c.exited) continue;
    int st = 0;
    if (::waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
    while (c.out >= 0 && pump(c)) {
    }
    c.exited = true;
    c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (c.status == 0 || stopped_by_launch(c.status, sv.handled_signals)) continue;
    if (elastic) {
      if (sv.first_failure.empty()) sv.first_failure = c.name;
      std::fprintf(stderr,
                   "launch: rank %s failed (exit status %d); the coordinator drops its site and "
                   "the others continue (job.on_site_failure = \"continue\")\n",
                   c.name.c_str(), c.status);
    } else if (sv.first_failure.empty()) {
      sv.first_failure = c.name;
      std::fprintf(stderr,
                   "launch: rank %s failed (exit status %d); the others stop at their next "
                   "deadline (%.0f s)\n",
                   c.name.c_str(), c.status, cfg.transport.deadline_s);
      sv.kill_at = Clock::now() + grace;
    }
  }
}

// Forwards a first SIGINT/SIGTERM to every rank (they checkpoint at a common step) and turns a
// second into SIGKILL; kills whatever still runs at the deadline.
void forward_stops(std::vector<Child>& children, Supervision& sv, const SignalCounter& signals,
                   Clock::duration grace) {
  if (signals.count() > sv.handled_signals) {
    sv.handled_signals = signals.count();
    if (sv.handled_signals == 1) {
      std::fprintf(stderr,
                   "launch: stopping: every rank checkpoints at the next common sync step "
                   "(Ctrl-C again to kill)\n");
      for (auto& c : children)
        if (!c.exited) ::kill(c.pid, SIGTERM);
      sv.kill_at = std::min(sv.kill_at, Clock::now() + grace);
    } else {
      sv.kill_at = Clock::now();
    }
  }
  if (Clock::now() < sv.kill_at) return;
  for (auto& c : children)
    if (!c.exited) {
      std::fprintf(stderr, "launch: killing rank %s, still running past the deadline\n",
                   c.name.c_str());
      ::kill(c.pid, SIGKILL);
    }
  sv.kill_at = Clock::time_point::max();
}

// Relays the ranks' output and watches them until every one has exited.
Supervision supervise(std::vector<Child>& children, const transport::Coordinator& coord,
                      const train::JobConfig& cfg, const LaunchOptions& opts,
                      const SignalCounter& signals) {
  Supervision sv;
  const auto grace =
      std::chrono::milliseconds(static_cast<std::int64_t>(cfg.transport.deadline_s * 1e3)) +
      std::chrono::milliseconds(cfg.job.heartbeat_timeout_ms) + 10s;
  auto last_report = Clock::now();
  auto alive = [&] {
    return std::any_of(children.begin(), children.end(), [](const Child& c) { return !c.exited; });
  };
  while (alive()) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children)
      if (c.out >= 0) {
        fds.push_back({c.out, POLLIN, 0});
        owners.push_back(&c);
      }
    if (::poll(fds.data(), fds.size(), 200) > 0)
      for (std::size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents != 0) pump(*owners[i]);
    reap(children, sv, cfg, grace);
    forward_stops(children, sv, signals, grace);
    if (cfg.job.on_site_failure == train::OnSiteFailure::kContinue)
      stop_dropped_ranks(children, coord.departed(), grace);
    if (opts.progress && Clock::now() - last_report > 10s && coord.membership()) {
      last_report = Clock::now();
      std::fprintf(stderr, "launch: %s\n", progress_line(coord, cfg.train.steps).c_str());
    }
  }
  return sv;
}

// launch's exit status from its ranks' (docs/cluster.md, "Stopping, failing"): 0 when every
// rank finished, or when at least job.min_sites sites (one at least) finished every step and
// every other rank's site was dropped; 130 when a forwarded stop ended them; 1 otherwise.
int launch_outcome(const train::JobConfig& cfg, const std::vector<Child>& children,
                   const std::vector<std::string>& departed, const Supervision& sv) {
  std::vector<std::string> failed, unsaved;
  bool all_interrupted = sv.handled_signals > 0;
  for (const auto& c : children) {
    if (c.status != 0) failed.push_back(fmt::format("{} (exit {})", c.name, c.status));
    all_interrupted =
        all_interrupted && (c.status == 0 || stopped_by_launch(c.status, sv.handled_signals));
    if (c.status != 0 && c.status != 130) unsaved.push_back(c.name);
  }
  if (failed.empty()) {
    std::fprintf(stderr, "launch: all %zu ranks finished\n", children.size());
    return 0;
  }
  if (all_interrupted) {
    if (unsaved.empty())
      std::fprintf(stderr, "launch: stopped by signal; every rank checkpointed\n");
    else
      std::fprintf(stderr,
                   "launch: stopped by signal; %s ended before a checkpoint (still starting up, "
                   "or killed by a second Ctrl-C); the others checkpointed\n",
                   fmt::format("{}", fmt::join(unsaved, ", ")).c_str());
    return 130;
  }
  const bool elastic = cfg.job.on_site_failure == train::OnSiteFailure::kContinue;
  std::size_t finished_sites = 0;
  for (const std::string& site : cfg.site_names())
    finished_sites += std::all_of(children.begin(), children.end(), [&](const Child& c) {
      return c.name.rfind(site + "/", 0) != 0 || c.status == 0;
    });
  const std::size_t needed = static_cast<std::size_t>(std::max(cfg.job.min_sites, 1));
  const bool only_dropped_failed =
      std::all_of(children.begin(), children.end(),
                  [&](const Child& c) { return c.status == 0 || site_departed(c.name, departed); });
  if (elastic && !departed.empty() && finished_sites < needed) {
    std::fprintf(stderr,
                 "launch: job failed: %zu site(s) finished every step, and the job needs %zu "
                 "(job.min_sites); dropped: %s; exit statuses: %s\n",
                 finished_sites, needed, fmt::format("{}", fmt::join(departed, "; ")).c_str(),
                 fmt::format("{}", fmt::join(failed, ", ")).c_str());
    return 1;
  }
  if (elastic && !departed.empty() && only_dropped_failed) {
    std::fprintf(stderr, "launch: the job finished without site(s): %s\n",
                 fmt::format("{}", fmt::join(departed, "; ")).c_str());
    return 0;
  }
  std::fprintf(stderr, "launch: job failed; first failure: %s; exit statuses: %s\n",
               sv.first_failure.empty() ? "?" : sv.first_failure.c_str(),
               fmt::format("{}", fmt::join(failed, ", ")).c_str());
  return 1;
}

}  // namespace

int run_launch(const train::JobConfig& cfg, const LaunchOptions& opts) {
  const auto sites = cfg.site_names();
  const int world = cfg.ranks_of_sites(static_cast<int>(sites.size()));
  // The ranks read the token from the config when it names one; otherwise launch makes a
  // fresh secret for this job and hands it over in the environment.
  std::vector<std::pair<std::string, std::string>> env;
  transport::JobToken token = [&] {
    if (!cfg.job.token_file.empty() || !cfg.job.token.empty() || std::getenv(kTokenEnv) != nullptr)
      return job_token(cfg);
    const std::string secret = random_secret();
    env.emplace_back(kTokenEnv, secret);
    return transport::JobToken::from_string(secret, "launch");
  }();
  transport::Coordinator coord(coordinator_options(cfg, token, "127.0.0.1"));
  const std::uint16_t port = coord.start(0);
  // A token launch made up for this job protects nothing a user could present: without one of
  // the user's, the endpoint stays on loopback.
  const auto status =
      start_status(coord, cfg, opts.status, env.empty() ? std::optional(token) : std::nullopt);

  // Ranks share this machine's cores; unless the config pins train.threads, split them.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads =
      cfg.train.threads > 0 ? cfg.train.threads : std::max(1, static_cast<int>(cores) / world);
  std::fprintf(stderr,
               "launch: %zu site(s), %d processes on this machine, coordinator 127.0.0.1:%u, %d "
               "model thread(s) per rank\n",
               sites.size(), world, port, threads);
  const SignalCounter signals;  // from before the first rank starts: a stop reaches them all
  std::vector<Child> children = spawn_ranks(cfg, opts, port, threads, env);
  const Supervision sv = supervise(children, coord, cfg, opts, signals);
  const auto departed = coord.departed();
  coord.stop();
  return launch_outcome(cfg, children, departed, sv);
}

}  // namespace desloc::cluster
