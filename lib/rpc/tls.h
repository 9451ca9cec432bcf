// TLS for Capstan's RPC (issue 12), over KJ's TLS (OpenSSL).
//
// A daemon with tls_cert and tls_key serves only TLS; with tls_ca as well it
// checks the certificates of the daemons it connects to, and with
// tls_verify_clients it requires every client to present a certificate
// signed by that CA (mutual TLS). Clients (the SDK, capstanctl, data-service
// readers) read CAPSTAN_TLS_CA, and for mutual TLS CAPSTAN_TLS_CERT and
// CAPSTAN_TLS_KEY. Server certificates must name the host clients dial (an
// IP address such as 127.0.0.1 as a subjectAltName). The cluster token then
// only ever travels inside TLS. scripts/make-test-ca.sh makes a test CA.
//
// Thread-safety: a Tls is immutable after creation; its context may wrap
// streams on any event loop.
#ifndef CAPSTAN_LIB_RPC_TLS_H_
#define CAPSTAN_LIB_RPC_TLS_H_

#include <kj/async-io.h>

#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"

namespace kj {
class TlsContext;
class TlsCertificate;
struct TlsKeypair;
}  // namespace kj

namespace capstan::rpc {

struct TlsFiles {
  std::string cert_file;  // PEM certificate (chain)
  std::string key_file;   // PEM private key
  std::string ca_file;    // PEM CA certificate(s) to trust
  bool verify_clients = false;  // servers: require client certificates from ca_file
};

class Tls {
 public:
  // A server: cert and key required; ca required with verify_clients (and
  // used when the daemon itself connects to peers). InvalidArgument naming
  // the file for a missing, unreadable or non-PEM one.
  static Result<std::shared_ptr<Tls>> server(const TlsFiles& files);
  // A client: ca required; cert and key together or neither.
  static Result<std::shared_ptr<Tls>> client(const TlsFiles& files);
  // A client from CAPSTAN_TLS_CA, CAPSTAN_TLS_CERT, CAPSTAN_TLS_KEY; null
  // when CAPSTAN_TLS_CA is unset (plain TCP).
  static Result<std::shared_ptr<Tls>> client_from_environment();

  ~Tls();
  Tls(const Tls&) = delete;
  Tls& operator=(const Tls&) = delete;

  // Handshakes as the server / as a client checking `host`'s certificate.
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrap_server(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrap_client(kj::Own<kj::AsyncIoStream> stream, const std::string& host);

 private:
  Tls();
  static Result<std::shared_ptr<Tls>> make(const TlsFiles& files, bool server);

  std::unique_ptr<kj::TlsKeypair> keypair_;
  std::vector<kj::TlsCertificate> trusted_;
  std::unique_ptr<kj::TlsContext> context_;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_TLS_H_
