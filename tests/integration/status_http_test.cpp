// The coordinator's status endpoint during a real `desloc launch` job (issue 17): /metrics in
// the Prometheus text format passes `promtool check metrics` and is scraped by a real
// Prometheus server started here on loopback, which then answers a query; /api/state is JSON;
// the endpoint refuses anything but reads, and bad clients (slow, oversized, garbage) neither
// hold it up nor disturb the job. dashboard_test.cpp loads `/` in a real browser.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster_env.hpp"
#include "http_env.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {

// West and east, DES-LOC with Kx = 4, steps enough to outlast the test (it stops the job).
std::string endless_two_site_job(const fs::path& out) {
  std::string toml = tiny_job_toml(out);
  toml.replace(toml.find("steps = 20"), 10, "steps = 100000");
  return toml + "[sync]\nmethod = \"desloc\"\nkx = 4\n[job]\nsites = [\"west\", \"east\"]\n";
}

TEST(StatusHttp, PrometheusScrapesARunningJob) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/prometheus", "prometheus");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/promtool", "prometheus");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("status_http");
  const auto cfg = write_text(dir / "job.toml", endless_two_site_job(dir / "out"));
  const auto topology = write_topology(dir / "topology.toml", {"west", "east"}, 800.0);
  Process job = Process::start({DESLOC_CLI, "launch", "--config", cfg.string(), "--http",
                                "127.0.0.1:0", "--topology", topology.string(), "--quiet"},
                               dir / "launch.log");
  const int port = http_port(job);
  ASSERT_NE(port, 0) << job.output();
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  auto get = [&](const std::string& path, const std::string& flags = "") {
    return run_command("curl -s -S --max-time 10 " + flags + " '" + base + path + "'");
  };

  // The membership forms and the ranks report steps, losses and syncs (a heartbeat may carry a
  // step just before its loss, so wait for both).
  const std::string loss_line = "desloc_rank_loss{site=\"west\",rank=\"0\"} ";
  auto loss_of = [&](const std::string& m) {
    const auto at = m.find(loss_line);
    return at == std::string::npos ? 0.0 : std::atof(m.c_str() + at + loss_line.size());
  };
  std::string metrics;
  ASSERT_TRUE(eventually(
      [&] {
        metrics = get("/metrics").output;
        return contains(metrics, "desloc_membership_epoch 1") &&
               contains(metrics, "desloc_rank_step{site=\"east\",rank=\"0\"}") &&
               !contains(metrics, "desloc_rank_step{site=\"east\",rank=\"0\"} 0\n") &&
               loss_of(metrics) > 0.0 &&
               contains(metrics,
                        "desloc_link_achieved_bytes_per_second{from=\"west\",to=\"east\"}");
      },
      60))
      << metrics << job.output();
  // The heartbeats carry each rank's loss, tokens/s and wide-area bytes.
  const double loss = loss_of(metrics);
  EXPECT_GT(loss, 1.0) << metrics;
  EXPECT_LT(loss, 6.0) << metrics;
  EXPECT_TRUE(contains(metrics, "# TYPE desloc_rank_wan_bytes_sent_total counter")) << metrics;
  EXPECT_TRUE(contains(metrics, "desloc_rank_tokens_per_second{site=\"east\",rank=\"0\"} "))
      << metrics;
  for (const char* line :
       {"desloc_up 1", "desloc_ranks_expected 2", "desloc_ranks_registered 2",
        "desloc_site_live{site=\"west\"} 1", "desloc_rank_missing{site=\"west\",rank=\"0\"} 0",
        "# TYPE desloc_rank_step gauge"})
    EXPECT_TRUE(contains(metrics, line)) << line << "\n" << metrics;
  // Per link: bytes, the achieved rate of the last syncs and the planned one (800 Mbit/s in
  // the topology); the syncs' durations as a histogram per rank.
  auto value_of = [&](const std::string& series) {
    const auto at = metrics.find(series + " ");
    return at == std::string::npos ? -1.0 : std::atof(metrics.c_str() + at + series.size() + 1);
  };
  EXPECT_GT(value_of("desloc_link_bytes_sent_total{from=\"west\",to=\"east\"}"), 0.0) << metrics;
  EXPECT_GT(value_of("desloc_link_achieved_bytes_per_second{from=\"east\",to=\"west\"}"), 0.0)
      << metrics;
  EXPECT_EQ(value_of("desloc_link_planned_bytes_per_second{from=\"west\",to=\"east\"}"), 1e8)
      << metrics;
  EXPECT_TRUE(contains(metrics, "# TYPE desloc_sync_duration_seconds histogram")) << metrics;
  EXPECT_GT(value_of("desloc_sync_duration_seconds_count{site=\"west\",rank=\"0\"}"), 0.0)
      << metrics;
  EXPECT_EQ(value_of("desloc_payload_guard_rejections_total{site=\"west\",rank=\"0\"}"), 0.0);
  EXPECT_EQ(value_of("desloc_recoveries_total"), 0.0);
  EXPECT_EQ(value_of("desloc_rank_heartbeats_missed{site=\"east\",rank=\"0\"}"), 0.0);
  EXPECT_EQ(value_of("desloc_rank_kx{site=\"east\",rank=\"0\"}"), 4.0);
  EXPECT_EQ(value_of("desloc_rank_replans_total{site=\"east\",rank=\"0\"}"), 0.0);
  // Each site's waits for the slowest at its averages, summed (absent: -1).
  EXPECT_GE(value_of("desloc_rank_wait_seconds_total{site=\"west\",rank=\"0\"}"), 0.0) << metrics;
  write_text(dir / "metrics.txt", metrics);
  const auto check =
      run_command("promtool check metrics < '" + (dir / "metrics.txt").string() + "'");
  EXPECT_EQ(check.exit_code, 0) << check.output;

  // /api/state: the same, as JSON.
  const auto state = nlohmann::json::parse(get("/api/state").output);
  EXPECT_EQ(state["epoch"], 1);
  EXPECT_EQ(state["ring"], nlohmann::json::array({"west", "east"}));
  ASSERT_EQ(state["ranks"].size(), 2u);
  EXPECT_GT(state["ranks"][0]["step"].get<int>(), 0);
  EXPECT_EQ(state["plan"]["kx"], "4");
  EXPECT_EQ(state["ranks"][0]["kx"], 4);  // the period in force, as the rank reports it
  EXPECT_EQ(state["ranks"][0]["replans"], 0);
  EXPECT_GE(state["ranks"][0]["wait_s"].get<double>(), 0.0);
  EXPECT_GE(state["ranks"][0]["last_wait_s"].get<double>(), 0.0);
  EXPECT_EQ(state["site_state"]["east"], "live");
  ASSERT_EQ(state["epochs"].size(), 1u);
  EXPECT_EQ(state["epochs"][0]["ring"], nlohmann::json::array({"west", "east"}));
  EXPECT_FALSE(state["losses"]["west"].empty()) << state.dump();
  ASSERT_EQ(state["links"].size(), 2u) << state.dump();
  EXPECT_EQ(state["links"][0]["planned_bytes_per_s"], 1e8);
  // The dashboard is one self-contained page.
  const std::string page = get("/").output;
  EXPECT_TRUE(contains(page, "<title>desloc job</title>")) << page.substr(0, 200);
  EXPECT_FALSE(contains(page, "src=\"http")) << "the page must need nothing but the coordinator";

  // Read-only: anything but GET/HEAD is refused; unknown paths are 404.
  EXPECT_EQ(get("/metrics", "-o /dev/null -w '%{http_code}' -X POST").output, "405");
  EXPECT_EQ(get("/nope", "-o /dev/null -w '%{http_code}'").output, "404");

  // A real Prometheus scrapes it every second and answers a query about the job.
  const int prom_port = free_port();
  write_text(dir / "prometheus.yml",
             "global:\n  scrape_interval: 1s\nscrape_configs:\n"
             "  - job_name: desloc\n    static_configs:\n"
             "      - targets: ['127.0.0.1:" +
                 std::to_string(port) + "']\n");
  Process prom =
      Process::start({"/usr/bin/prometheus", "--config.file=" + (dir / "prometheus.yml").string(),
                      "--storage.tsdb.path=" + (dir / "tsdb").string(),
                      "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                     dir / "prometheus.log");
  const std::string query =
      "http://127.0.0.1:" + std::to_string(prom_port) + "/api/v1/query?query=desloc_rank_step";
  nlohmann::json answer;
  EXPECT_TRUE(eventually(
      [&] {
        const auto r = run_command("curl -s --max-time 5 '" + query + "'");
        if (r.exit_code != 0) return false;
        answer = nlohmann::json::parse(r.output, nullptr, false);
        return !answer.is_discarded() && answer.value("status", "") == "success" &&
               answer["data"]["result"].size() == 2;
      },
      60))
      << answer.dump() << "\n"
      << prom.output();
  if (answer.contains("data") && answer["data"]["result"].size() == 2)
    for (const auto& series : answer["data"]["result"]) {
      EXPECT_EQ(series["metric"]["job"], "desloc");
      EXPECT_GT(std::stod(series["value"][1].get<std::string>()), 0.0) << series.dump();
    }
  ::kill(prom.pid, SIGTERM);
  EXPECT_GE(prom.wait(std::chrono::seconds(30)), 0);
  // Ctrl-C ends the job at a common step.
  ::kill(job.pid, SIGINT);
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), 130) << job.output();
}

// A raw client: connects to 127.0.0.1:port and sends `bytes`; read_all() returns what the
// server sent until it closed, or nullopt when it has not closed within `seconds`.
struct RawClient {
  int fd = -1;
  explicit RawClient(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fd = -1;
  }
  ~RawClient() {
    if (fd >= 0) ::close(fd);
  }
  void send(const std::string& bytes) const {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  std::optional<std::string> read_all(int seconds) const {
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    char buf[4096];
    while (std::chrono::steady_clock::now() < end) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) got.append(buf, static_cast<std::size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return got;
    }
    return std::nullopt;
  }
};

// Issue 17's bad input: a port in use, a client that never finishes its request (slow-loris), an
// oversized header and garbage. Each is refused or timed out, the endpoint keeps answering
// everyone else meanwhile, and the job trains on.
TEST(StatusHttp, BadClientsAreRefusedOrTimedOutAndTheJobTrainsOn) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("status_http_bad");
  const auto cfg = write_text(dir / "job.toml", endless_two_site_job(dir / "out"));
  Process job = Process::start(
      {DESLOC_CLI, "launch", "--config", cfg.string(), "--http", "127.0.0.1:0", "--quiet"},
      dir / "launch.log");
  const int port = http_port(job);
  ASSERT_NE(port, 0) << job.output();
  const std::string url = "'http://127.0.0.1:" + std::to_string(port);
  auto code = [&](const std::string& path) {
    return run_command("curl -s --max-time 5 -o /dev/null -w '%{http_code}' " + url + path + "'")
        .output;
  };
  auto step = [&] {
    const auto state = nlohmann::json::parse(
        run_command("curl -s --max-time 5 " + url + "/api/state'").output, nullptr, false);
    if (state.is_discarded() || state["ranks"].empty()) return std::int64_t{0};
    return state["ranks"][0]["step"].get<std::int64_t>();
  };
  ASSERT_TRUE(eventually([&] { return step() > 0; }, 60)) << job.output();

  // The port is taken: a second endpoint says so and exits, naming it.
  const auto taken =
      run_command("DESLOC_JOB_TOKEN=another " + std::string(DESLOC_CLI) + " coordinator --config " +
                  cfg.string() + " --listen 127.0.0.1:0 --http 127.0.0.1:" + std::to_string(port));
  EXPECT_NE(taken.exit_code, 0) << taken.output;
  EXPECT_TRUE(contains(taken.output, "127.0.0.1:" + std::to_string(port) + ": cannot listen"))
      << taken.output;

  // A slow-loris client holds a half-sent request open; others are served meanwhile, and the
  // endpoint hangs up on it at its 10 s deadline.
  const RawClient slow(port);
  ASSERT_GE(slow.fd, 0);
  slow.send("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
  const auto slow_start = std::chrono::steady_clock::now();
  EXPECT_EQ(code("/metrics"), "200");
  // An oversized header (beyond Beast's 8 KiB limit) and garbage: closed without an answer.
  const RawClient big(port);
  big.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(64 * 1024, 'a') + "\r\n\r\n");
  const auto big_answer = big.read_all(15);
  ASSERT_TRUE(big_answer.has_value()) << "the oversized request was left open";
  EXPECT_FALSE(contains(*big_answer, "200 OK")) << *big_answer;
  const RawClient garbage(port);
  constexpr char kGarbage[] = "\x16\x03\x01\x00\xff garbage \0\r\n\r\n";  // NULs inside
  garbage.send(std::string(kGarbage, sizeof(kGarbage) - 1));
  const auto garbage_answer = garbage.read_all(15);
  ASSERT_TRUE(garbage_answer.has_value()) << "the garbage request was left open";
  EXPECT_FALSE(contains(*garbage_answer, "200 OK")) << *garbage_answer;
  const auto slow_answer = slow.read_all(20);
  ASSERT_TRUE(slow_answer.has_value()) << "the slow client was never timed out";
  const double held =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - slow_start).count();
  EXPECT_GE(held, 8.0);
  EXPECT_LE(held, 15.0);

  // None of it disturbed the job: it trained on, and the endpoint still answers.
  const std::int64_t before = step();
  EXPECT_TRUE(eventually([&] { return step() > before; }, 30)) << job.output();
  EXPECT_EQ(code("/api/state"), "200");
  ::kill(job.pid, SIGINT);
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), 130) << job.output();
}

// Clients that open connections and send nothing, more than the coordinator has descriptors
// (its limit set to 256 here, 400 connections): the endpoint holds at most its cap of them and
// answers the rest 503 at once, so the coordinator neither runs out of descriptors for its
// ranks nor spins on failed accepts, and says so once. (Before, its accept loop failed on
// every retry, logging each.)
TEST(StatusHttp, ManyIdleConnectionsNeitherSpinTheCoordinatorNorHoldItsRanksUp) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/prlimit", "util-linux");
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("status_http_flood");
  const auto cfg =
      write_text(dir / "job.toml", endless_two_site_job(dir / "out") + "token = \"flood\"\n");
  Cluster c{dir, {}, 0};
  c.coordinator =
      Process::start({"/usr/bin/prlimit", "--nofile=256:256", DESLOC_CLI, "coordinator", "--config",
                      cfg.string(), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"},
                     dir / "coordinator.log");
  const int port = http_port(c.coordinator);
  ASSERT_NE(port, 0) << c.coordinator.output();
  ASSERT_TRUE(eventually(
      [&] {
        const std::string out = c.coordinator.output();
        const auto at = out.find("listening on 127.0.0.1:");
        if (at != std::string::npos) c.port = std::atoi(out.c_str() + at + 23);
        return c.port != 0;
      },
      10));
  const auto code = [&] {
    return run_command("curl -s --max-time 5 -o /dev/null -w '%{http_code}' 'http://127.0.0.1:" +
                       std::to_string(port) + "/metrics'")
        .output;
  };
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 400; ++i) idle.push_back(std::make_unique<RawClient>(port));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(code(), "503");
  // The ranks still register and train.
  Process west = c.worker(cfg, "west", 0), east = c.worker(cfg, "east", 0);
  EXPECT_TRUE(eventually(
      [&] {
        return read_text(dir / "out" / "metrics.jsonl").find("\"step\":20,") != std::string::npos;
      },
      60))
      << west.output() << c.coordinator.output().substr(0, 4000);
  // Once the idle clients go, the endpoint serves again.
  idle.clear();
  EXPECT_TRUE(eventually([&] { return code() == "200"; }, 15));
  for (Process* p : {&west, &east}) ::kill(p->pid, SIGTERM);
  for (Process* p : {&west, &east})
    EXPECT_EQ(p->wait(std::chrono::seconds(60)), 130) << p->output();
  ::kill(c.coordinator.pid, SIGTERM);
  c.coordinator.wait(std::chrono::seconds(30));
  const std::string log = c.coordinator.output();
  std::size_t warnings = 0;
  for (std::size_t at = log.find("turning new ones away"); at != std::string::npos;
       at = log.find("turning new ones away", at + 1))
    ++warnings;
  EXPECT_GE(warnings, 1u) << log;
  EXPECT_LE(warnings, 3u) << log;
  EXPECT_EQ(log.find("accept failed"), std::string::npos) << log.substr(0, 4000);
  EXPECT_LT(log.size(), 64u * 1024) << log.substr(0, 4000);
}

// Loopback by name and in IPv6 is loopback: no token is needed for either.
TEST(StatusHttp, LocalhostAndIpv6LoopbackServeWithoutAToken) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  const auto dir = fresh_dir("status_http_localhost");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", \"east\"]\n"
                                                    "token = \"t\"\n");
  for (const std::string& host : {std::string("localhost"), std::string("[::1]")}) {
    if (host == "[::1]" && read_text("/proc/net/if_inet6").find(" lo") == std::string::npos)
      GTEST_SKIP() << "no IPv6 on the loopback interface";
    Process coord = Process::start({DESLOC_CLI, "coordinator", "--config", cfg.string(), "--listen",
                                    "127.0.0.1:0", "--http", host + ":0"},
                                   dir / ("coordinator_" + host + ".log"));
    const int port = http_port(coord, host, 20);
    ASSERT_NE(port, 0) << coord.output();
    const std::string url = "http://" + host + ":" + std::to_string(port) + "/api/state";
    EXPECT_EQ(
        run_command("curl -g -s --max-time 10 -o /dev/null -w '%{http_code}' '" + url + "'").output,
        "200")
        << coord.output();
    ::kill(coord.pid, SIGTERM);
    EXPECT_EQ(coord.wait(std::chrono::seconds(30)), 130) << coord.output();
  }
}

// A topology of other sites gives the dashboard nothing to hold the job's links to: refused,
// naming both lists.
TEST(StatusHttp, ATopologyOfNoneOfTheJobsSitesIsRefused) {
  const auto dir = fresh_dir("status_http_topology");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", \"east\"]\n"
                                                    "token = \"t\"\n");
  const auto topology = write_topology(dir / "topology.toml", {"A", "B"}, 100.0);
  const auto r =
      run_command(std::string(DESLOC_CLI) + " coordinator --config " + cfg.string() +
                  " --listen 127.0.0.1:0 --http 127.0.0.1:0 --topology " + topology.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "it describes sites [A, B], none of the job's [west, east]"))
      << r.output;
}

TEST(StatusHttp, OnAnotherAddressRequestsMustPresentTheJobToken) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  const auto dir = fresh_dir("status_http_token");
  const auto cfg = write_text(dir / "job.toml", tiny_job_toml(dir / "out") +
                                                    "[job]\nsites = [\"west\", \"east\"]\n"
                                                    "token = \"s3cret-token\"\n");
  Process coord = Process::start({DESLOC_CLI, "coordinator", "--config", cfg.string(), "--listen",
                                  "127.0.0.1:0", "--http", "0.0.0.0:0"},
                                 dir / "coordinator.log");
  int port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const std::string out = coord.output();
        const auto at = out.find("on http://0.0.0.0:");
        if (at != std::string::npos) port = std::atoi(out.c_str() + at + 18);
        return port != 0;
      },
      30))
      << coord.output();
  const std::string url = "'http://127.0.0.1:" + std::to_string(port) + "/metrics'";
  const std::string code = "curl -s --max-time 10 -o /dev/null -w '%{http_code}' ";
  EXPECT_EQ(run_command(code + url).output, "401");
  EXPECT_EQ(run_command(code + "-H 'Authorization: Bearer wrong' " + url).output, "401");
  EXPECT_EQ(run_command(code + "-H 'Authorization: Bearer s3cret-token' " + url).output, "200");
  // A browser sends the token as the password of its Basic prompt, which a 401 offers.
  EXPECT_EQ(run_command(code + "-u 'anyone:s3cret-token' " + url).output, "200");
  EXPECT_EQ(run_command(code + "-u 'anyone:wrong' " + url).output, "401");
  EXPECT_EQ(run_command(code + "-H 'Authorization: Basic !!notbase64!!' " + url).output, "401");
  const auto headers = run_command("curl -s --max-time 10 -D - -o /dev/null " + url).output;
  EXPECT_TRUE(contains(headers, "Basic realm=")) << headers;
  const auto body =
      run_command("curl -s --max-time 10 -H 'Authorization: Bearer s3cret-token' " + url).output;
  EXPECT_TRUE(contains(body, "desloc_ranks_registered 0")) << body;
  ::kill(coord.pid, SIGTERM);
  EXPECT_EQ(coord.wait(std::chrono::seconds(30)), 130) << coord.output();
}

TEST(StatusHttp, AnotherAddressNeedsTheJobToken) {
  const auto dir = fresh_dir("status_http_bind");
  // No token configured and a non-loopback address: refused before anything starts.
  const auto cfg = write_text(dir / "job.toml",
                              tiny_job_toml(dir / "out") + "[job]\nsites = [\"west\", \"east\"]\n");
  const auto r = run_command(std::string(DESLOC_CLI) + " launch --config " + cfg.string() +
                             " --http 0.0.0.0:0 --quiet");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "binds to loopback unless the job token")) << r.output;
}

}  // namespace
