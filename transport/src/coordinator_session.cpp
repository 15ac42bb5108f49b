// The coordinator's side of one connection: TLS, Challenge -> AuthResponse -> Hello within the
// handshake deadline, then frames handed to the coordinator.
#include "coordinator_session.hpp"

#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/transport/site_name.hpp"

namespace desloc::transport {

namespace {

// " in sync.codec_x (this rank: \"int8\", the coordinator: \"fp32\")", naming up to three keys
// whose values differ (and how many more); "" when neither side listed its keys.
std::string config_difference(const std::vector<ConfigValue>& rank,
                              const std::vector<ConfigValue>& mine) {
  std::map<std::string, std::pair<std::string, std::string>> differ;  // key -> (rank, mine)
  constexpr const char* kAbsent = "(absent)";
  for (const ConfigValue& v : rank) differ[v.key] = {v.value, kAbsent};
  for (const ConfigValue& v : mine) {
    auto [it, fresh] = differ.try_emplace(v.key, kAbsent, v.value);
    if (!fresh) it->second.second = v.value;
  }
  std::erase_if(differ, [](const auto& kv) { return kv.second.first == kv.second.second; });
  if (differ.empty()) return {};
  std::string text;
  std::size_t shown = 0;
  for (const auto& [key, values] : differ) {
    if (shown++ == 3) break;
    text += fmt::format("{}{} (this rank: {}, the coordinator: {})", shown == 1 ? " in " : ", ",
                        key, values.first, values.second);
  }
  if (differ.size() > 3) text += fmt::format(" and {} more key(s)", differ.size() - 3);
  return text;
}

}  // namespace

std::optional<Reject> check_hello(const Hello& h, const CoordinatorOptions& options) {
  const RankId id{h.site, h.rank};
  if (h.protocol_version != options.protocol_version)
    return Reject{RejectCode::kVersion,
                  fmt::format("protocol version {} from {} but the coordinator speaks {}; run "
                              "the same desloc build everywhere",
                              h.protocol_version, id.str(), options.protocol_version)};
  if (h.config_hash != options.config_hash)
    return Reject{RejectCode::kConfigHash,
                  fmt::format("the job config of {} differs from the coordinator's{} (config hash "
                              "{:#018x}, the coordinator's {:#018x}); every rank must run the same "
                              "job config",
                              id.str(), config_difference(h.config, options.config), h.config_hash,
                              options.config_hash)};
  if (!valid_site_name(h.site))
    return Reject{RejectCode::kWorldSize, fmt::format("site name '{}' is invalid; use {}",
                                                      h.site.substr(0, 64), kSiteNameRule)};
  if (const std::size_t ranks = options.ranks_of(h.site); h.rank >= ranks)
    return Reject{RejectCode::kWorldSize,
                  fmt::format("rank {} of site '{}' is outside 0..{}; the job has {} ranks {}",
                              h.rank, h.site, ranks - 1, ranks,
                              options.site_ranks.empty() ? "per site" : "at that site")};
  return std::nullopt;
}

CoordinatorSession::CoordinatorSession(tcp::socket socket, std::uint64_t connection,
                                       const CoordinatorOptions& options, ssl::context* tls,
                                       SessionOwner& owner)
    : FramedPeer(std::move(socket), tls, "", options.max_frame_payload),
      options_(options),
      owner_(owner),
      connection_(connection),
      handshake_timer_(this->socket().get_executor()) {
  set_name("connection " + endpoint_name(this->socket()));
}

void CoordinatorSession::start() {
  // Fresh per connection, so an AuthResponse recorded on one connection is no answer on
  // another.
  nonce_ = random_nonce();
  handshake_timer_.expires_after(options_.handshake_timeout);
  handshake_timer_.async_wait([self = self()](const boost::system::error_code& ec) {
    if (!ec) self->on_handshake_deadline();
  });
  if (!stream().tls()) return challenge();
  state_ = State::kTlsHandshake;
  stream().tls_stream().async_handshake(
      ssl::stream_base::server, [self = self()](const boost::system::error_code& ec) {
        if (self->closed() || self->state_ != State::kTlsHandshake) return;
        if (ec) return self->refuse_tls("TLS handshake failed: " + describe_tls_error(ec));
        self->challenge();
      });
}

void CoordinatorSession::on_handshake_deadline() {
  if (closed() || state_ == State::kRegistered || state_ == State::kDone) return;
  const auto limit = options_.handshake_timeout.count();
  if (state_ == State::kTlsHandshake)
    return refuse_tls(fmt::format("no TLS handshake within {} ms", limit));
  const auto partial = buffered();
  refuse(RejectCode::kHandshakeTimeout,
         fmt::format("did not complete the handshake within {} ms{}; dropping it", limit,
                     partial == 0 ? std::string()
                                  : fmt::format(" (stalled mid-frame, {} bytes of a partial "
                                                "frame buffered)",
                                                partial)));
}

void CoordinatorSession::refuse(RejectCode code, const std::string& reason) {
  if (state_ == State::kRegistered) owner_.rank_closed(*this, "refused: " + reason);
  log::warn("coordinator: refusing {} ({}): {}", name(), reject_code_name(code), reason);
  send(encode(Reject{code, reason}));
  state_ = State::kDone;
  handshake_timer_.cancel();
  finish();
}

void CoordinatorSession::challenge() {
  state_ = State::kAwaitAuth;
  send(encode(Challenge{nonce_}));
  start_reading();
}

// Without a TLS session nothing can go out over TLS, so the Reject is sent in plaintext: a
// rank that was not configured for TLS reads it as the reason it was refused.
void CoordinatorSession::refuse_tls(const std::string& reason) {
  log::warn("coordinator: refusing {} (tls): {}", name(), reason);
  state_ = State::kDone;
  handshake_timer_.cancel();
  boost::system::error_code ignored;
  socket().cancel(ignored);  // a handshake still in progress ends with operation_aborted
  stream().fall_back_to_plain();
  send(encode(Reject{RejectCode::kAuth,
                     reason + "; this coordinator requires TLS: set [job] tls = true and "
                              "tls_ca on every rank"}));
  finish();
}

void CoordinatorSession::authenticate(const Frame& frame) {
  const auto resp = decode<AuthResponse>(frame);
  if (resp.mac.empty())
    return refuse(RejectCode::kAuth,
                  "no job token presented; give this rank the job's token (config `token` or "
                  "token file)");
  if (!options_.token->verify(nonce_, resp.mac))
    return refuse(RejectCode::kAuth,
                  "wrong job token (HMAC-SHA256 response does not match); use the same token as "
                  "the coordinator");
  state_ = State::kAwaitHello;
}

void CoordinatorSession::hello(const Frame& frame) {
  const auto h = decode<Hello>(frame);
  auto reject = check_hello(h, options_);
  if (!reject) reject = owner_.admit(self(), h);
  if (reject) return refuse(reject->code, reject->reason);
  id_ = RankId{h.site, h.rank};
  set_name(fmt::format("rank {} ({})", id_.str(), endpoint_name(socket())));
  state_ = State::kRegistered;
  handshake_timer_.cancel();
}

void CoordinatorSession::on_frame(Frame frame) {
  switch (state_) {
    case State::kAwaitAuth:
      return authenticate(frame);
    case State::kAwaitHello:
      return hello(frame);
    case State::kRegistered:
      return owner_.rank_frame(*this, frame);
    case State::kTlsHandshake:  // frames are read only after the handshake
    case State::kDone:
      return;
  }
}

void CoordinatorSession::on_protocol_error(const std::string& what) {
  if (state_ == State::kDone) return abort("");
  refuse(RejectCode::kProtocol, what);
}

void CoordinatorSession::on_closed(const std::string& reason) {
  handshake_timer_.cancel();
  if (state_ == State::kRegistered) {
    owner_.rank_closed(*this, reason);
  } else if (!reason.empty()) {
    log::info("coordinator: {} closed before registering: {}", name(), reason);
  }
  state_ = State::kDone;
}

}  // namespace desloc::transport
