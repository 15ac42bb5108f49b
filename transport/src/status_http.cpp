// The coordinator's read-only HTTP endpoint (status_http.hpp): rendering the job's status as
// Prometheus text and JSON, and a small Boost.Beast server, one request per connection, with
// a deadline on every read and write.
#include "desloc/transport/status_http.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::transport {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A label value in the exposition format: backslash, double quote and line feed escaped.
std::string label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

// A sample value as the exposition format spells the special ones: a diverged site reports a
// NaN loss, and fmt would write "nan".
std::string prometheus_value(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

bool is_loopback(const std::string& host) {
  boost::system::error_code ec;
  const auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

}  // namespace

JobStatus read_status(const Coordinator& c, std::vector<std::string> sites,
                      std::uint32_t ranks_per_site, std::int64_t steps, double uptime_s) {
  JobStatus s;
  s.sites = std::move(sites);
  s.ranks_per_site = ranks_per_site;
  s.steps = steps;
  s.registered = c.registered();
  s.membership = c.membership();
  s.ranks = c.progress();
  s.missing = c.missing();
  s.departed = c.departed();
  s.uptime_s = uptime_s;
  return s;
}

std::string prometheus_text(const JobStatus& s) {
  std::string out;
  const std::set<RankId> missing(s.missing.begin(), s.missing.end());
  std::set<std::string> live;
  if (s.membership)
    for (const auto& m : s.membership->members) live.insert(m.site);
  family(out, "desloc_up", "gauge", "1 while the coordinator serves the job.");
  out += "desloc_up 1\n";
  family(out, "desloc_uptime_seconds", "gauge", "Seconds since the coordinator started.");
  out += fmt::format("desloc_uptime_seconds {:.3f}\n", s.uptime_s);
  family(out, "desloc_train_steps", "gauge", "The job's train.steps.");
  out += fmt::format("desloc_train_steps {}\n", s.steps);
  family(out, "desloc_membership_epoch", "gauge",
         "The membership epoch (0 until every rank has registered).");
  out += fmt::format("desloc_membership_epoch {}\n", s.membership ? s.membership->epoch : 0);
  family(out, "desloc_ranks_expected", "gauge", "Sites x ranks per site.");
  out += fmt::format("desloc_ranks_expected {}\n", s.sites.size() * s.ranks_per_site);
  family(out, "desloc_ranks_registered", "gauge", "Ranks registered with the coordinator.");
  out += fmt::format("desloc_ranks_registered {}\n", s.registered);
  family(out, "desloc_site_live", "gauge",
         "1 for a site in the current membership, 0 for one dropped or not yet joined.");
  for (const auto& site : s.sites)
    out += fmt::format("desloc_site_live{{site=\"{}\"}} {}\n", label(site), live.count(site));
  family(out, "desloc_sites_departed_total", "counter", "Sites dropped from the job so far.");
  out += fmt::format("desloc_sites_departed_total {}\n", s.departed.size());
  family(out, "desloc_rank_step", "gauge", "The last step a rank reported in a heartbeat.");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_step{{site=\"{}\",rank=\"{}\"}} {}\n", label(r.id.site),
                       r.id.rank, r.step);
  family(out, "desloc_rank_loss", "gauge",
         "A rank's site's training loss at its last reported step (nats per token).");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_loss{{site=\"{}\",rank=\"{}\"}} {}\n", label(r.id.site),
                       r.id.rank, prometheus_value(r.loss));
  family(out, "desloc_rank_tokens_per_second", "gauge", "A rank's tokens per second, last step.");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_tokens_per_second{{site=\"{}\",rank=\"{}\"}} {}\n",
                       label(r.id.site), r.id.rank, prometheus_value(r.tokens_per_s));
  family(out, "desloc_rank_wan_bytes_sent_total", "counter",
         "Wide-area bytes a rank has sent (its share of the cross-site averages).");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_wan_bytes_sent_total{{site=\"{}\",rank=\"{}\"}} {}\n",
                       label(r.id.site), r.id.rank, r.wan_bytes_sent);
  family(out, "desloc_rank_connected", "gauge", "1 while a rank's control connection is open.");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_connected{{site=\"{}\",rank=\"{}\"}} {}\n", label(r.id.site),
                       r.id.rank, r.connected ? 1 : 0);
  family(out, "desloc_rank_silent_seconds", "gauge", "Seconds since a rank's last frame.");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_silent_seconds{{site=\"{}\",rank=\"{}\"}} {:.3f}\n",
                       label(r.id.site), r.id.rank, r.silent.count() / 1e3);
  family(out, "desloc_rank_missing", "gauge",
         "1 for a registered rank silent past job.heartbeat_timeout_ms.");
  for (const auto& r : s.ranks)
    out += fmt::format("desloc_rank_missing{{site=\"{}\",rank=\"{}\"}} {}\n", label(r.id.site),
                       r.id.rank, missing.count(r.id));
  return out;
}

std::string status_json(const JobStatus& s) {
  nlohmann::json j;
  j["sites"] = s.sites;
  j["ranks_per_site"] = s.ranks_per_site;
  j["train_steps"] = s.steps;
  j["registered"] = s.registered;
  j["uptime_s"] = s.uptime_s;
  j["epoch"] = s.membership ? s.membership->epoch : 0;
  nlohmann::json ring = nlohmann::json::array();
  if (s.membership)
    for (const auto i : s.membership->ring_order) ring.push_back(s.membership->sites.at(i));
  j["ring"] = ring;
  j["epoch_note"] = s.membership ? s.membership->note : "";
  j["departed"] = s.departed;
  const std::set<RankId> missing(s.missing.begin(), s.missing.end());
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks)
    ranks.push_back({{"site", r.id.site},
                     {"rank", r.id.rank},
                     {"step", r.step},
                     {"connected", r.connected},
                     {"silent_s", r.silent.count() / 1e3},
                     {"loss", r.loss},
                     {"tokens_per_s", r.tokens_per_s},
                     {"wan_bytes_sent", r.wan_bytes_sent},
                     {"missing", missing.count(r.id) > 0}});
  j["ranks"] = ranks;
  return j.dump();
}

struct StatusServer::Impl {
  Impl(const Coordinator& c, StatusServerOptions o) : coordinator(c), options(std::move(o)) {}

  const Coordinator& coordinator;
  StatusServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  http::response<http::string_body> answer(const http::request<http::string_body>& req) {
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "desloc");
    res.keep_alive(false);
    auto text = [&](http::status status, std::string type, std::string body) {
      res.result(status);
      res.set(http::field::content_type, type);
      res.body() = std::move(body);
    };
    if (options.token) {
      const auto field = req[http::field::authorization];
      const std::string_view auth(field.data(), field.size());
      const std::string_view prefix = "Bearer ";
      if (!auth.starts_with(prefix) || !options.token->matches(auth.substr(prefix.size()))) {
        text(http::status::unauthorized, "text/plain",
             "a bearer token (the job token) is required\n");
        res.set(http::field::www_authenticate, "Bearer");
        return res;
      }
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      text(http::status::method_not_allowed, "text/plain", "read-only: GET or HEAD\n");
      res.set(http::field::allow, "GET, HEAD");
      return res;
    }
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    const double uptime =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (path == "/metrics") {
      text(http::status::ok, "text/plain; version=0.0.4; charset=utf-8",
           prometheus_text(read_status(coordinator, options.sites, options.ranks_per_site,
                                       options.steps, uptime)));
    } else if (path == "/api/state") {
      text(http::status::ok, "application/json",
           status_json(read_status(coordinator, options.sites, options.ranks_per_site,
                                   options.steps, uptime)));
    } else if (path == "/") {
      text(http::status::ok, "text/plain",
           "desloc coordinator: /metrics (Prometheus), /api/state (JSON)\n");
    } else {
      text(http::status::not_found, "text/plain", "not found: /metrics, /api/state\n");
    }
    return res;
  }

  struct Session : std::enable_shared_from_this<Session> {
    // `owner` outlives every handler: stop() joins the loop before the Impl goes, and the
    // handlers still pending then are destroyed, never run.
    Session(tcp::socket s, Impl* o) : stream(std::move(s)), owner(o) {}
    beast::tcp_stream stream;
    Impl* owner;
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    http::response<http::string_body> response;

    void run() {
      stream.expires_after(std::chrono::seconds(10));
      http::async_read(
          stream, buffer, request, [self = shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return;  // a client that sent nothing whole: just close
            self->response = self->owner->answer(self->request);
            self->response.prepare_payload();
            self->stream.expires_after(std::chrono::seconds(10));
            http::async_write(self->stream, self->response, [self](beast::error_code, std::size_t) {
              beast::error_code ignored;
              self->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
            });
          });
    }
  };

  void accept() {
    acceptor.async_accept([self = this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Session>(std::move(socket), self)->run();
      self->accept();
    });
  }
};

StatusServer::StatusServer(const Coordinator& coordinator, StatusServerOptions options) {
  if (!is_loopback(options.bind) && !options.token)
    throw ConfigError(fmt::format(
        "--http {}:{}: the status endpoint binds to loopback unless the job token protects it; "
        "bind to 127.0.0.1, or configure job.token / job.token_file",
        options.bind, options.port));
  impl_ = std::make_shared<Impl>(coordinator, std::move(options));
  if (is_loopback(impl_->options.bind)) impl_->options.token.reset();
}

StatusServer::~StatusServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    log::error("status endpoint: error at shutdown: {}", e.what());
  }
}

std::uint16_t StatusServer::start() {
  auto& im = *impl_;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(im.options.bind, ec);
  if (ec)
    throw ConfigError(
        fmt::format("--http {}: '{}' is not an IP address", im.options.bind, im.options.bind));
  try {
    const tcp::endpoint ep{address, im.options.port};
    im.acceptor.open(ep.protocol());
    im.acceptor.set_option(tcp::acceptor::reuse_address(true));
    im.acceptor.bind(ep);
    im.acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw TransportError(fmt::format("--http {}:{}: cannot listen: {}; choose a free port",
                                     im.options.bind, im.options.port, e.code().message()));
  }
  const std::uint16_t port = im.acceptor.local_endpoint().port();
  im.accept();
  im.thread = std::thread([&im] {
    try {
      im.io.run();
    } catch (const std::exception& e) {
      log::error("status endpoint: stopped: {}", e.what());
    }
  });
  return port;
}

void StatusServer::stop() {
  auto& im = *impl_;
  if (!im.thread.joinable()) return;
  im.io.stop();
  im.thread.join();
  boost::system::error_code ignored;
  im.acceptor.close(ignored);
}

}  // namespace desloc::transport
