// The coordinator's dashboard (`/`, issue 17) in a real browser: headless Chromium (Debian's
// `chromium`) loads it during a 3-site `desloc launch` job, and what its script rendered is
// read back from the DOM: every site live, the step advancing, and after one site is killed,
// that site marked dropped, the second epoch and why it began. A screenshot of the dropped
// state is kept as the test's artefact: <build>/dashboard_dropped_site.png.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cluster_env.hpp"
#include "http_env.hpp"
#include "test_env.hpp"

using namespace desloc::test;

namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

// Headless Chromium on `url`: the DOM after the page's script ran for `ms` of virtual time
// (its fetches included), and a screenshot when `png` is given.
std::string chromium(const fs::path& profile, const std::string& url, int ms,
                     const fs::path& png = {}) {
  const std::string common = std::string(kChromium) +
                             " --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
                             "--no-first-run --hide-scrollbars --user-data-dir='" +
                             profile.string() + "' --virtual-time-budget=" + std::to_string(ms);
  if (!png.empty())
    run_command(common + " --window-size=1300,1000 --screenshot='" + png.string() + "' '" + url +
                "' 2>/dev/null");
  return run_command(common + " --dump-dom '" + url + "' 2>/dev/null").output;
}

// The state the page shows for `site` (its data-state attribute), "" when absent.
std::string shown_state(const std::string& dom, const std::string& site) {
  std::smatch m;
  const std::regex re("data-site=\"" + site + "\" data-state=\"([a-z]+)\"");
  return std::regex_search(dom, m, re) ? m[1].str() : "";
}

long shown_number(const std::string& dom, const std::string& id) {
  const std::string key = "id=\"" + id + "\">";
  const auto at = dom.find(key);
  return at == std::string::npos ? -1 : std::atol(dom.c_str() + at + key.size());
}

TEST(Dashboard, ChromiumShowsTheJobLiveAndMarksAKilledSiteDropped) {
  DESLOC_REQUIRE_PROGRAM(kChromium, "chromium");
  DESLOC_REQUIRE_PROGRAM("/usr/bin/curl", "curl");
  ASSERT_TRUE(have_prepared_corpus());
  const auto dir = fresh_dir("dashboard");
  std::string toml = tiny_job_toml(dir / "out");
  toml.replace(toml.find("steps = 20"), 10, "steps = 100000");
  toml +=
      "[sync]\nmethod = \"desloc\"\nkx = 4\n[job]\nsites = [\"west\", \"east\", \"north\"]\n"
      "heartbeat_ms = 200\nheartbeat_timeout_ms = 1500\nrecovery_timeout_s = 10\n"
      "[transport]\ndeadline_s = 5\n";
  const auto cfg = write_text(dir / "job.toml", toml);
  const auto topology = write_topology(dir / "topology.toml", {"west", "east", "north"}, 800.0);
  Process job = Process::start({DESLOC_CLI, "launch", "--config", cfg.string(), "--http",
                                "127.0.0.1:0", "--topology", topology.string(), "--quiet"},
                               dir / "launch.log");
  const int port = http_port(job);
  ASSERT_NE(port, 0) << job.output();
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  auto state = [&] {
    return nlohmann::json::parse(run_command("curl -s --max-time 5 '" + url + "api/state'").output,
                                 nullptr, false);
  };
  ASSERT_TRUE(eventually(
      [&] {
        const auto s = state();
        return !s.is_discarded() && s["epoch"] == 1 && s["ranks"].size() == 3 &&
               s["ranks"][0]["step"].get<int>() > 0;
      },
      60))
      << job.output();

  // Every site live, epoch 1, a step; a second load later shows a later step.
  const std::string first = chromium(dir / "chrome", url, 3000);
  for (const char* site : {"west", "east", "north"})
    EXPECT_EQ(shown_state(first, site), "live") << site << "\n" << first;
  EXPECT_EQ(shown_number(first, "epoch"), 1) << first;
  const long step = shown_number(first, "step");
  EXPECT_GT(step, 0) << first;
  EXPECT_TRUE(first.find("class=\"link\"") != std::string::npos) << "no ring links drawn";
  EXPECT_TRUE(first.find("<polyline") != std::string::npos) << "no loss curve drawn";
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::string later = chromium(dir / "chrome", url, 3000);
  EXPECT_GT(shown_number(later, "step"), step) << later;

  // Kill one site: the coordinator drops it, and the page says so.
  const pid_t north = child_with_argument(job.pid, "north");
  ASSERT_GT(north, 0) << job.output();
  ::kill(north, SIGKILL);
  ASSERT_TRUE(eventually(
      [&] {
        const auto s = state();
        return !s.is_discarded() && s["site_state"]["north"] == "dropped";
      },
      60))
      << job.output();
  const fs::path png = dir / "dashboard_dropped_site.png";
  const std::string dropped = chromium(dir / "chrome", url, 3000, png);
  EXPECT_EQ(shown_state(dropped, "north"), "dropped") << dropped;
  EXPECT_EQ(shown_state(dropped, "west"), "live") << dropped;
  EXPECT_EQ(shown_number(dropped, "epoch"), 2) << dropped;
  EXPECT_TRUE(dropped.find("dropped site(s) [north]") != std::string::npos) << dropped;
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 20000u);
  const fs::path artefact =
      fs::path(DESLOC_CLI).parent_path().parent_path() / "dashboard_dropped_site.png";
  fs::copy_file(png, artefact, fs::copy_options::overwrite_existing);
  std::printf("dashboard screenshot: %s\n", artefact.c_str());

  // The survivors train on, and the page keeps up.
  const long before = shown_number(dropped, "step");
  EXPECT_TRUE(eventually(
      [&] { return shown_number(chromium(dir / "chrome", url, 2000), "step") > before; }, 60));
  ::kill(job.pid, SIGINT);
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), 130) << job.output();
}

}  // namespace
