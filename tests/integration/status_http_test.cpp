// The coordinator's status endpoint during a real `desloc launch` job (issue 17): /metrics in
// the Prometheus text format passes `promtool check metrics` and is scraped by a real
// Prometheus server started here on loopback, which then answers a query; /api/state is JSON;
// the endpoint refuses anything but reads.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "cluster_env.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A port nobody listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Waits until `probe` is true or `seconds` pass.
template <class Probe>
bool eventually(Probe&& probe, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (probe()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

TEST(StatusHttp, PrometheusScrapesARunningJob) {
  DESLOC_REQUIRE_PROGRAM("/usr/bin/prometheus", "prometheus");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/promtool", "prometheus");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("status_http");
  std::string toml = tiny_job_toml(dir / "out");
  toml.replace(toml.find("steps = 20"), 10, "steps = 100000");
  toml += "[sync]\nmethod = \"desloc\"\nkx = 4\n[job]\nsites = [\"west\", \"east\"]\n";
  const auto cfg = write_text(dir / "job.toml", toml);
  Process job = Process::start(
      {DESLOC_CLI, "launch", "--config", cfg.string(), "--http", "127.0.0.1:0", "--quiet"},
      dir / "launch.log");
  int port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const std::string out = job.output();
        const auto at = out.find("on http://127.0.0.1:");
        if (at != std::string::npos) port = std::atoi(out.c_str() + at + 20);
        return port != 0;
      },
      30))
      << job.output();
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  auto get = [&](const std::string& path, const std::string& flags = "") {
    return run_command("curl -s -S --max-time 10 " + flags + " '" + base + path + "'");
  };

  // The membership forms and the ranks report steps and losses (a heartbeat may carry a step
  // just before its loss, so wait for both).
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
               loss_of(metrics) > 0.0;
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
