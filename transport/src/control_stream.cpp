// TLS contexts and certificate checks for the control plane (see control_stream.hpp).
#include "control_stream.hpp"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/ssl/host_name_verification.hpp>

#include "desloc/core/error.hpp"

namespace desloc::transport {
namespace {

std::unique_ptr<ssl::context> base_context(const std::string& side) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  // See is_end_of_stream(): a TCP half-close ends the stream like a close_notify.
  SSL_CTX_set_options(ctx->native_handle(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION) != 1)
    throw ConfigError(fmt::format("{}: OpenSSL refused to require TLS 1.2 or newer", side));
  return ctx;
}

// Loads one PEM file, turning OpenSSL's error into one that names the file and its key.
template <class Load>
void load(const std::string& side, const char* what, const char* key, const std::string& path,
          Load&& fn, const std::string& hint = "") {
  if (path.empty())
    throw ConfigError(
        fmt::format("{}: TLS is enabled but no {} is set; set [job] {}", side, what, key));
  boost::system::error_code ec;
  fn(ec);
  if (ec)
    throw ConfigError(fmt::format("{}: cannot load the TLS {} '{}' ([job] {}): {}{}", side, what,
                                  path, key, describe_tls_error(ec), hint));
}

}  // namespace

std::string describe_tls_error(const boost::system::error_code& ec) {
  if (ec.category() != boost::asio::error::get_ssl_category()) return ec.message();
  // OpenSSL's reason string ("certificate verify failed") is clearer than Asio's message,
  // which may be empty for some codes.
  const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
  return reason != nullptr ? std::string(reason) : ec.message();
}

std::unique_ptr<ssl::context> make_server_tls_context(const TlsOptions& tls) {
  const std::string side = "coordinator";
  auto ctx = base_context(side);
  load(side, "certificate chain", "tls_cert", tls.cert_file,
       [&](auto& ec) { ctx->use_certificate_chain_file(tls.cert_file, ec); });
  load(
      side, "private key", "tls_key", tls.key_file,
      [&](auto& ec) { ctx->use_private_key_file(tls.key_file, ssl::context::pem, ec); },
      fmt::format("; it must be the private key of the certificate '{}' ([job] tls_cert)",
                  tls.cert_file));
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    ERR_clear_error();
    throw ConfigError(
        fmt::format("coordinator: the TLS private key '{}' ([job] tls_key) does not belong to the "
                    "certificate '{}' ([job] tls_cert)",
                    tls.key_file, tls.cert_file));
  }
  ctx->set_verify_mode(ssl::verify_none);  // ranks prove themselves with the job token
  return ctx;
}

std::unique_ptr<ssl::context> make_client_tls_context(const TlsOptions& tls,
                                                      const std::string& side) {
  auto ctx = base_context(side);
  ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  if (tls.ca_file.empty()) {
    boost::system::error_code ec;
    ctx->set_default_verify_paths(ec);
    if (ec)
      throw ConfigError(
          fmt::format("{}: cannot load the system's CA certificates: {}; set "
                      "[job] tls_ca to the CA that signed the coordinator's",
                      side, describe_tls_error(ec)));
  } else {
    load(side, "CA file", "tls_ca", tls.ca_file,
         [&](auto& ec) { ctx->load_verify_file(tls.ca_file, ec); });
  }
  return ctx;
}

void verify_server(ControlStream::TlsStream& stream, const std::string& server_name,
                   std::shared_ptr<std::string> failure) {
  boost::system::error_code ec;
  const bool is_address = (boost::asio::ip::make_address(server_name, ec), !ec);
  if (!is_address) SSL_set_tlsext_host_name(stream.native_handle(), server_name.c_str());
  stream.set_verify_callback([check = ssl::host_name_verification(server_name), server_name,
                              failure](bool preverified, ssl::verify_context& vc) mutable {
    const bool ok = check(preverified, vc);
    if (ok || !failure->empty()) return ok;
    X509_STORE_CTX* store = vc.native_handle();
    const int depth = X509_STORE_CTX_get_error_depth(store);
    std::string subject = "?";
    if (X509* cert = X509_STORE_CTX_get_current_cert(store)) {
      char buf[256];
      X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf));
      subject = buf;
    }
    int err = X509_STORE_CTX_get_error(store);
    if (preverified || err == X509_V_OK) {  // a good chain for another name: say so in the alert
      err = X509_V_ERR_HOSTNAME_MISMATCH;
      X509_STORE_CTX_set_error(store, err);
    }
    *failure =
        err == X509_V_ERR_HOSTNAME_MISMATCH
            ? fmt::format("its certificate ({}) does not name '{}'", subject, server_name)
            : fmt::format("{} (depth {}, {})", X509_verify_cert_error_string(err), depth, subject);
    return ok;
  });
}

}  // namespace desloc::transport
