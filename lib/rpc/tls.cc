#include "rpc/tls.h"

#include <kj/compat/tls.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace capstan::rpc {
namespace {

Result<std::string> read_pem(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(key + ": cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return Status::InvalidArgument(key + ": " + path + " is not a PEM file");
  }
  return text.str();
}

// A certificate or key of type T from the PEM file at `path` (config key
// `key`); errors name the key and the file.
template <typename T>
Result<std::unique_ptr<T>> parse_pem(const std::string& key, const std::string& path, const char* what) {
  CAPSTAN_ASSIGN_OR_RETURN(std::string text, read_pem(key, path));
  try {
    return std::make_unique<T>(kj::StringPtr(text.c_str()));
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(key + ": " + path + " holds no usable " + what + ": " + e.getDescription().cStr());
  }
}

}  // namespace

Tls::Tls() = default;
Tls::~Tls() = default;

Result<std::shared_ptr<Tls>> Tls::server(const TlsFiles& files) { return make(files, true); }

Result<std::shared_ptr<Tls>> Tls::client(const TlsFiles& files) { return make(files, false); }

Result<std::shared_ptr<Tls>> Tls::client_from_environment() {
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value == nullptr ? "" : value);
  };
  TlsFiles files{env("CAPSTAN_TLS_CERT"), env("CAPSTAN_TLS_KEY"), env("CAPSTAN_TLS_CA"), false};
  if (files.ca_file.empty()) {
    if (!files.cert_file.empty() || !files.key_file.empty()) {
      return Status::InvalidArgument("CAPSTAN_TLS_CERT/CAPSTAN_TLS_KEY are set but CAPSTAN_TLS_CA is not: "
                                     "set it to the CA that signed the daemons' certificates");
    }
    return std::shared_ptr<Tls>();
  }
  auto tls = client(files);
  if (!tls.ok()) return tls.status().with_context("CAPSTAN_TLS_*");
  return tls;
}

Result<std::shared_ptr<Tls>> Tls::make(const TlsFiles& files, bool server) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return Status::InvalidArgument("tls_cert and tls_key go together: got " +
                                   std::string(files.cert_file.empty() ? "tls_key" : "tls_cert") + " alone");
  }
  if (server && files.cert_file.empty()) {
    return Status::InvalidArgument("a TLS server needs tls_cert and tls_key");
  }
  if ((!server || files.verify_clients) && files.ca_file.empty()) {
    return Status::InvalidArgument(server ? "tls_verify_clients needs tls_ca, the CA that signs client certificates"
                                          : "a TLS client needs tls_ca, the CA that signed the servers' certificates");
  }
  std::shared_ptr<Tls> tls(new Tls());
  try {
    if (!files.cert_file.empty()) {
      CAPSTAN_ASSIGN_OR_RETURN(auto cert, parse_pem<kj::TlsCertificate>("tls_cert", files.cert_file, "certificate"));
      CAPSTAN_ASSIGN_OR_RETURN(auto key, parse_pem<kj::TlsPrivateKey>("tls_key", files.key_file, "private key"));
      tls->keypair_ = std::make_unique<kj::TlsKeypair>(kj::TlsKeypair{kj::mv(*key), kj::mv(*cert)});
    }
    if (!files.ca_file.empty()) {
      CAPSTAN_ASSIGN_OR_RETURN(auto ca, parse_pem<kj::TlsCertificate>("tls_ca", files.ca_file, "certificate"));
      tls->trusted_.push_back(kj::mv(*ca));
    }
    kj::TlsContext::Options options;
    options.useSystemTrustStore = false;  // only the cluster's CA
    options.verifyClients = server && files.verify_clients;
    options.trustedCertificates = kj::ArrayPtr<const kj::TlsCertificate>(tls->trusted_.data(), tls->trusted_.size());
    if (tls->keypair_) options.defaultKeypair = *tls->keypair_;
    tls->context_ = std::make_unique<kj::TlsContext>(kj::mv(options));
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("TLS setup failed: ") + e.getDescription().cStr());
  }
  return tls;
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Tls::wrap_server(kj::Own<kj::AsyncIoStream> stream) {
  return context_->wrapServer(kj::mv(stream));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Tls::wrap_client(kj::Own<kj::AsyncIoStream> stream, const std::string& host) {
  auto name = kj::heapString(host.c_str());
  kj::StringPtr name_ptr = name;
  return context_->wrapClient(kj::mv(stream), name_ptr).attach(kj::mv(name));
}

}  // namespace capstan::rpc
