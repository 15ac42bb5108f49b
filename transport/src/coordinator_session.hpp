// One rank's control connection as the coordinator sees it: the TLS handshake, the challenge
// and the job token, the Hello's admission, then the registered rank's frames.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "desloc/transport/control_plane.hpp"
#include "framed_peer.hpp"

namespace desloc::transport {

class CoordinatorSession;

// What a session asks of the coordinator that accepted it, always on the coordinator's thread.
class SessionOwner {
 public:
  // After the token and the Hello's own checks: registers the rank (nullopt; the owner then
  // sends the Welcome and routes the rank's messages to `session`) or says why not.
  virtual std::optional<Reject> admit(const std::shared_ptr<CoordinatorSession>& session,
                                      const Hello& hello) = 0;
  // A registered rank's frame; throws DataError for one that has no place in the protocol.
  virtual void rank_frame(const CoordinatorSession& session, const Frame& frame) = 0;
  // A registered rank's connection ended; reason "" when it closed cleanly.
  virtual void rank_closed(const CoordinatorSession& session, const std::string& reason) = 0;

 protected:
  ~SessionOwner() = default;
};

// What a Hello must satisfy whoever else is registered: the protocol version, the config
// hash, a valid site name and a rank inside the world. nullopt when it does.
std::optional<Reject> check_hello(const Hello& hello, const CoordinatorOptions& options);

class CoordinatorSession : public FramedPeer {
 public:
  // `connection` numbers this connection among the coordinator's (from 1). `tls` null: plain.
  CoordinatorSession(tcp::socket socket, std::uint64_t connection,
                     const CoordinatorOptions& options, ssl::context* tls, SessionOwner& owner);

  void start();  // the handshake deadline, then TLS or the challenge
  // Sends a Reject with the reason and closes; a registered rank counts as closed.
  void refuse(RejectCode code, const std::string& reason);

  std::uint64_t connection() const { return connection_; }
  const RankId& id() const { return id_; }  // once registered

 private:
  enum class State { kTlsHandshake, kAwaitAuth, kAwaitHello, kRegistered, kDone };

  std::shared_ptr<CoordinatorSession> self() {
    return std::static_pointer_cast<CoordinatorSession>(shared_from_this());
  }
  void on_handshake_deadline();
  void challenge();
  void refuse_tls(const std::string& reason);
  void authenticate(const Frame& frame);
  void hello(const Frame& frame);

  void on_frame(Frame frame) override;
  void on_protocol_error(const std::string& what) override;
  void on_closed(const std::string& reason) override;

  const CoordinatorOptions& options_;
  SessionOwner& owner_;
  std::uint64_t connection_;
  boost::asio::steady_timer handshake_timer_;
  Nonce nonce_{};
  State state_ = State::kAwaitAuth;
  RankId id_;
};

}  // namespace desloc::transport
