#include "daemons/common/daemon.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "capstan/client.h"
#include "cuda_info.h"
#include "daemons/common/http_server.h"
#include "daemons/common/logging.h"
#include "io/durable_file.h"
#include "rpc/connection.h"
#include "rpc/link_timeout.h"
#include "wire_names.h"
#include "sync/mutex.h"

namespace capstan::daemon {
namespace {

// Feeds RPC statistics into /metrics and refused logins into the log.
class RpcMetrics final : public rpc::RpcObserver {
 public:
  RpcMetrics(MetricsRegistry& registry, std::shared_ptr<spdlog::logger> log)
      : registry_(registry),
        log_(std::move(log)),
        received_(registry.counter("capstan_rpc_received_bytes_total",
                                   "Bytes received on RPC connections.")),
        sent_(registry.counter("capstan_rpc_sent_bytes_total", "Bytes sent on RPC connections.")),
        connections_(registry.gauge("capstan_rpc_connections", "Open RPC connections.")),
        refused_(registry.counter("capstan_rpc_logins_refused_total",
                                  "Logins refused for a wrong cluster token.")) {}

  // The counters of one method, found in the registry once.
  class MethodMetrics final : public MethodStats {
   public:
    MethodMetrics(RpcMetrics& owner, std::string method)
        : owner_(owner),
          method_(std::move(method)),
          calls_(owner.registry_.counter("capstan_rpc_calls_total", "RPC calls received, by method.",
                                         {{"method", method_}})) {}
    void on_call() override {
      calls_->inc();
      owner_.calls_.fetch_add(1, std::memory_order_relaxed);
    }
    void on_done(double seconds) override {
      // Made at the method's first answer: methods never called add no
      // buckets to /metrics.
      if (duration_ == nullptr) {
        duration_ = owner_.registry_.histogram("capstan_rpc_duration_seconds",
                                               "Time from an RPC's arrival to its answer, by method.",
                                               {{"method", method_}});
      }
      duration_->observe(seconds);
    }
    void on_error(const Status& status) override {
      Counter*& errors = errors_[status.code()];  // one lookup per method and code
      if (errors == nullptr) {
        errors = owner_.registry_.counter("capstan_rpc_errors_total",
                                          "RPC calls that failed, by method and status code.",
                                          {{"method", method_}, {"code", std::string(status_code_name(status.code()))}});
      }
      errors->inc();
      owner_.log_->debug("{} failed: {}", method_, status.to_string());
    }

   private:
    RpcMetrics& owner_;
    const std::string method_;
    Counter* const calls_;
    Histogram* duration_ = nullptr;  // loop thread only
    std::map<StatusCode, Counter*> errors_;  // loop thread only
  };

  std::unique_ptr<MethodStats> method_stats(const std::string& method) override {
    return std::make_unique<MethodMetrics>(*this, method);
  }
  void on_error(const std::string& what, const Status& status) override {
    registry_
        .counter("capstan_rpc_errors_total", "RPC calls that failed, by method and status code.",
                 {{"method", what}, {"code", std::string(status_code_name(status.code()))}})
        ->inc();
    log_->debug("{} failed: {}", what, status.to_string());
  }
  void on_bytes_received(size_t bytes) override { received_->inc(static_cast<double>(bytes)); }
  void on_bytes_sent(size_t bytes) override { sent_->inc(static_cast<double>(bytes)); }
  void on_connection(const std::string& peer, bool opened) override {
    connections_->add(opened ? 1 : -1);
    log_->debug("connection {} {}", opened ? "from" : "closed:", peer);
  }
  void on_login_refused(const std::string& peer, const std::string& why) override {
    refused_->inc();
    log_->warn("refused login from {}: {}", peer, why);
  }

  // Calls received, every method.
  double calls() const { return static_cast<double>(calls_.load(std::memory_order_relaxed)); }

 private:
  std::atomic<int64_t> calls_{0};
  MetricsRegistry& registry_;
  std::shared_ptr<spdlog::logger> log_;
  Counter* received_;
  Counter* sent_;
  Gauge* connections_;
  Counter* refused_;
};

// Which peers are up; written on the RPC loop, read by /readyz.
class Readiness {
 public:
  Readiness(std::vector<Peer> peers, NodeIdentity& identity)
      : peers_(std::move(peers)), up_(peers_.size(), false), identity_(identity) {
    identity_.set_ready(peers_.empty());
  }
  void set_up(size_t i, bool up) {
    MutexLock lock(mutex_);
    up_[i] = up;
    bool all = true;
    for (bool u : up_) all = all && u;
    identity_.set_ready(all && !stopping_);
  }
  void set_stopping() {
    MutexLock lock(mutex_);
    stopping_ = true;
    identity_.set_ready(false);
  }
  // "" when ready, else what is missing.
  std::string missing() const {
    MutexLock lock(mutex_);
    if (stopping_) return "shutting down";
    std::string out;
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (up_[i]) continue;
      if (!out.empty()) out += ", ";
      out += std::string(role_name(peers_[i].role)) + " at " + peers_[i].address;
    }
    return out.empty() ? "" : "waiting for " + out;
  }
  const std::vector<Peer>& peers() const { return peers_; }

 private:
  const std::vector<Peer> peers_;
  mutable Mutex mutex_;
  std::vector<bool> up_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  NodeIdentity& identity_;
};

// Keeps a connection to every peer on the RPC loop thread: connects with
// backoff, checks the peer's role, and watches for the link to break.
class PeerWatcher {
 public:
  PeerWatcher(rpc::LoopThread& loop, Readiness& readiness, rpc::ConnectOptions options,
              std::shared_ptr<spdlog::logger> log)
      : loop_(loop), readiness_(readiness), log_(std::move(log)) {
    const auto& peers = readiness_.peers();
    for (size_t i = 0; i < peers.size(); ++i) {
      auto conn = kj::heap<rpc::Connection>(loop_.io(), loop_.timer(), peers[i].address, options);
      std::string what = std::string(role_name(peers[i].role)) + " at " + peers[i].address;
      auto log_ptr = log_;
      conn->set_retry_logger([log_ptr, what](const Status& error, std::chrono::milliseconds delay,
                                             int attempt) {
        // First failure, then every 20th, so a long wait stays readable.
        if (attempt == 1 || attempt % 20 == 0) {
          log_ptr->info("waiting for {} ({}); retrying with backoff (attempt {}, next in {} ms)",
                        what, error.message(), attempt, delay.count());
        }
      });
      connections_.add(kj::mv(conn));
    }
    for (size_t i = 0; i < peers.size(); ++i) tasks_.add(watch(i).eagerlyEvaluate(nullptr));
  }

 private:
  kj::Promise<void> watch(size_t i) {
    const Peer& peer = readiness_.peers()[i];
    auto& conn = *connections_[i];
    auto forever = loop_.timer().now() + 3650 * 24 * 3600 * kj::SECONDS;
    return conn.node(forever)
        .then([this](wire::Node::Client node) {
          return rpc::with_deadline(loop_.timer(), node.infoRequest().send(),
                                    std::chrono::seconds(10), "info");
        })
        .then(
            [this, i, &peer, &conn](capnp::Response<wire::Node::InfoResults>&& response)
                -> kj::Promise<void> {
              auto role = response.getInfo().getRole();
              if (role != peer.role) {
                log_->error("{} is a {}, expected a {}; retrying in 5 s", peer.address,
                            role_name(role), role_name(peer.role));
                conn.reset();
                return loop_.timer().afterDelay(5 * kj::SECONDS);
              }
              log_->info("connected to {} at {}", role_name(peer.role), peer.address);
              readiness_.set_up(i, true);
              return conn.on_disconnect().then([this, i, &peer]() {
                readiness_.set_up(i, false);
                log_->warn("lost {} at {}; reconnecting", role_name(peer.role), peer.address);
              });
            },
            [this, i, &peer](kj::Exception&& e) {
              readiness_.set_up(i, false);
              log_->error("cannot use {} at {}: {}; retrying in 5 s", role_name(peer.role),
                          peer.address, rpc::from_exception(e).message());
              return loop_.timer().afterDelay(5 * kj::SECONDS);
            })
        .then([this, i]() { return watch(i); });
  }

  rpc::LoopThread& loop_;
  Readiness& readiness_;
  std::shared_ptr<spdlog::logger> log_;
  kj::Vector<kj::Own<rpc::Connection>> connections_;
  kj::Vector<kj::Promise<void>> tasks_;
};

// Writes the file durably and atomically so a reader never sees half of it.
Status write_port_file(const std::string& path, const std::string& address, uint16_t rpc_port,
                       uint16_t http_port) {
  std::ostringstream out;
  out << "rpc_port: " << rpc_port << "\nhttp_port: " << http_port << "\naddress: " << address
      << "\npid: " << ::getpid() << "\n";
  return io::write_file_durably(path, out.str());
}

int config_error(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program.c_str(), message.c_str());
  return 2;
}

std::string job_of(wire::Role role) { return std::string(role_name(role)); }

}  // namespace

NodeIdentity::NodeIdentity(wire::Role role, int task_index)
    : role_(role),
      task_index_(task_index),
      started_(std::chrono::steady_clock::now()),
      gpu_count_(cuda_device_count()) {}

double NodeIdentity::uptime_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::string NodeIdentity::tag() const {
  std::string tag(role_name(role_));
  if (task_index_ >= 0) tag += ":" + std::to_string(task_index_);
  return tag;
}

void NodeIdentity::set_addresses(std::string rpc_address, uint16_t http_port) {
  MutexLock lock(mutex_);
  rpc_address_ = std::move(rpc_address);
  http_port_ = http_port;
}

std::string NodeIdentity::rpc_address() const {
  MutexLock lock(mutex_);
  return rpc_address_;
}

uint16_t NodeIdentity::http_port() const {
  MutexLock lock(mutex_);
  return http_port_;
}

void NodeIdentity::fill(wire::NodeInfo::Builder info) const {
  info.setRole(role_);
  info.setTaskIndex(task_index_);
  info.setVersion(capstan::version());
  info.setUptimeSeconds(uptime_seconds());
  {
    MutexLock lock(mutex_);
    info.setRpcAddress(rpc_address_);
    info.setHttpPort(http_port_);
  }
  info.setPid(::getpid());
  info.setReady(ready());
  info.setGpuCount(gpu_count_);
}

// --advertise_address as peers dial it: HOST:PORT as given, or HOST with the
// bound port (an IPv6 literal in brackets). Checked at start, so a typo is a
// configuration error rather than an address no peer can reach.
Result<std::string> advertise_address(const std::string& value, int bound_port) {
  auto bad = [&value](const std::string& why) {
    return Status::InvalidArgument("advertise_address: '" + value + "' " + why +
                                   "; give HOST or HOST:PORT, e.g. 10.0.0.7 or ps-0.ps.capstan.svc:7100");
  };
  if (value.find_first_of(" \t\r\n/") != std::string::npos) return bad("is not a host name or address");
  std::string host = value;
  std::string port;
  const size_t colon = value.rfind(':');
  const bool bracketed = !value.empty() && value.front() == '[';
  if (colon != std::string::npos && (bracketed ? colon > 0 && value[colon - 1] == ']' : value.find(':') == colon)) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return bad("has a bad port '" + port + "' (1-65535)");
    }
  }
  if (host.empty() || host == "[]") return bad("has no host");
  if (bracketed || host.find_first_of("[]") != std::string::npos || host.find(':') != std::string::npos) {
    // Only an IPv6 literal has colons or brackets.
    const std::string literal = bracketed ? host.substr(1, host.size() - 2) : host;
    in6_addr parsed;
    if ((bracketed && host.back() != ']') || ::inet_pton(AF_INET6, literal.c_str(), &parsed) != 1) {
      return bad("is neither HOST nor HOST:PORT nor an IPv6 address");
    }
    host = "[" + literal + "]";
  }
  return host + ":" + (port.empty() ? std::to_string(bound_port) : port);
}

std::vector<OptionSpec> common_options() {
  return {
      {"host", OptionType::kString, "Address to bind the RPC and HTTP ports to (0.0.0.0 for all).",
       "127.0.0.1"},
      {"port", OptionType::kInt,
       "RPC port; 0 picks a free one. Default: the role's port, or this task's port in the "
       "cluster spec.",
       std::nullopt},
      {"http_port", OptionType::kInt, "HTTP port for /healthz, /readyz and /metrics; 0 picks a free one.",
       "0"},
      {"advertise_address", OptionType::kString,
       "The address peers reach this daemon at, HOST or HOST:PORT (default: the cluster spec's entry, "
       "else the bind address, else, bound to all interfaces, the host name). Set it where the host "
       "name does not resolve for peers: a pod IP or a stable DNS name in Kubernetes.",
       ""},
      {"port_file", OptionType::kString,
       "Write the chosen ports to this file (rpc_port, http_port, address, pid) once listening.",
       ""},
      {"log_level", OptionType::kString, "trace, debug, info, warn, error, critical or off.", "info"},
      {"log_file", OptionType::kString, "Also append the log to this file.", ""},
      {"token_file", OptionType::kString,
       "File holding the cluster token (else the CAPSTAN_TOKEN variable; neither: open cluster).",
       ""},
      {"task_index", OptionType::kInt,
       "This task's index in its job (default: from the cluster spec; a worker-server without one gets the "
       "lowest free index from the coordinator).",
       "-1"},
      {"threads", OptionType::kInt, "Worker threads for heavy work; 0 means one per core.", "0"},
      {"max_message_mib", OptionType::kInt,
       "Largest RPC message payload accepted, in MiB (plus 64 KiB of framing; Cap'n Proto traversal "
       "limit); larger tensors are chunked.",
       "64"},
      {"buffer_cache_mib", OptionType::kInt,
       "MiB of freed large tensor buffers kept for reuse (faster repeated transfers); 0 disables.",
       "1024"},
      {"shutdown_grace_ms", OptionType::kInt,
       "On SIGTERM, how long calls in flight may take to finish before the daemon exits.", "8000"},
      {"login_deadline_ms", OptionType::kInt,
       "A connection that has not logged in (sent the cluster token) this long after connecting is closed.",
       "10000"},
      {"max_pre_login_connections", OptionType::kInt,
       "Connections not yet logged in, at most (lowered to fit the open-file limit); at the cap the one that "
       "waited longest is closed to admit a new one.",
       "1024"},
      {"max_pre_login_per_host", OptionType::kInt,
       "Connections not yet logged in from one host, at most (lowered to fit the open-file limit); at the cap "
       "that host's connection that waited longest is closed to admit a new one.",
       "256"},
      {"link_timeout_ms", OptionType::kInt,
       "A link to or from a peer that stops acknowledging (a network partition) breaks after this long, so "
       "calls fail with UNAVAILABLE instead of waiting; 0 leaves TCP's own (many minutes).",
       "10000"},
      {"loopback_tcp_congestion", OptionType::kString,
       "TCP congestion control for links whose two ends are loopback addresses (a cluster on one host); "
       "'system' keeps the kernel's default. BBR, a common default, paces sends and halves loopback throughput.",
       "cubic"},
      {"tls_cert", OptionType::kString,
       "PEM certificate: serve TLS only (with tls_key); also presented to peers when tls_ca is set.", ""},
      {"tls_key", OptionType::kString, "PEM private key of tls_cert.", ""},
      {"tls_ca", OptionType::kString,
       "PEM CA certificate: connect to peers over TLS and trust only this CA (and, with "
       "tls_verify_clients, require client certificates it signed).",
       ""},
      {"tls_verify_clients", OptionType::kBool,
       "Mutual TLS: refuse clients without a certificate signed by tls_ca.", "false"},
  };
}

std::optional<std::string> local_address_towards(const std::string& peer) {
  auto colon = peer.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string host = peer.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::asio::io_context io;
  boost::asio::ip::udp::resolver resolver(io);
  boost::system::error_code ec;
  auto found = resolver.resolve(host, peer.substr(colon + 1), ec);
  if (ec || found.empty()) return std::nullopt;
  boost::asio::ip::udp::socket socket(io);
  socket.open(found.begin()->endpoint().protocol(), ec);
  if (!ec) socket.connect(found.begin()->endpoint(), ec);
  if (ec) return std::nullopt;
  auto local = socket.local_endpoint(ec);
  if (ec) return std::nullopt;
  return local.address().to_string();
}

Result<std::string> peer_address(const Config& config, const std::string& key,
                                 const std::string& job) {
  if (config.has(key) && !config.get_string(key).empty()) return config.get_string(key);
  const auto& addresses = config.cluster().addresses(job);
  if (!addresses.empty()) return addresses.front();
  return Status::NotFound("missing required value '" + key + "' (set --" + key + ", CAPSTAN_" +
                          [&key]() {
                            std::string up = key;
                            for (auto& c : up) c = static_cast<char>(std::toupper(c));
                            return up;
                          }() +
                          ", '" + key + ":' in the config file, or a '" + job +
                          "' job in the cluster spec)");
}

int run_daemon(const RoleSpec& spec, int argc, char** argv) {
  std::vector<OptionSpec> specs = common_options();
  specs.insert(specs.end(), spec.options.begin(), spec.options.end());
  if (spec.loads_modules) {
    specs.push_back({"module", OptionType::kStringList,
                     "Shared libraries of user functions (closures, dataset functions) to load "
                     "(CAPSTAN_MODULE); repeat or separate with commas.",
                     std::nullopt});
  }
  auto parsed = parse_config(spec.program, spec.description, specs, argc, argv,
                             current_environment());
  if (parsed.action == ParseResult::Action::kError) return config_error(spec.program, parsed.text);
  if (parsed.action != ParseResult::Action::kRun) {
    std::fputs(parsed.text.c_str(), stdout);
    return 0;
  }
  Config& config = parsed.config;
  const ClusterSpec& cluster = config.cluster();
  const std::string job = job_of(spec.role);

  // --- Identity and ports from the cluster spec ---------------------------
  if (!cluster.task_type.empty() && cluster.task_type != job) {
    return config_error(spec.program, "cluster spec: task type '" + cluster.task_type +
                                          "' does not match " + spec.program +
                                          " (expects '" + job + "')");
  }
  int task_index = static_cast<int>(config.get_int("task_index"));
  if (task_index < 0 && cluster.task_index >= 0 && cluster.task_type == job) {
    task_index = cluster.task_index;
  }
  std::string host = config.get_string("host");
  if (const std::string& chosen = config.get_string("advertise_address"); !chosen.empty()) {
    if (auto checked = advertise_address(chosen, 1); !checked.ok()) {
      return config_error(spec.program, checked.status().message());
    }
  }
  int64_t port = -1;
  if (config.has("port")) {
    port = config.get_int("port");
  } else if (task_index >= 0 && static_cast<size_t>(task_index) < cluster.addresses(job).size()) {
    std::string own_host;
    uint16_t own_port = 0;
    Status ok = rpc::parse_host_port(cluster.addresses(job)[task_index], &own_host, &own_port);
    if (!ok.ok()) return config_error(spec.program, "cluster spec: " + ok.message());
    port = own_port;
    // Other tasks reach us at the cluster spec's address: listen on all
    // interfaces unless told otherwise.
    if (config.source("host") == "default" && own_host != "127.0.0.1" && own_host != "localhost") {
      host = "0.0.0.0";
    }
  } else {
    static const std::map<wire::Role, int> kDefaultPorts = {
        {wire::Role::COORDINATOR, 7000}, {wire::Role::PS, 7100}, {wire::Role::WORKER, 7200},
        {wire::Role::DATA_DISPATCHER, 7300}, {wire::Role::DATA_WORKER, 7400}};
    port = kDefaultPorts.at(spec.role);
  }
  if (port < 0 || port > 65535) {
    return config_error(spec.program, "port: " + std::to_string(port) + " is not in 0..65535");
  }
  int64_t http_port = config.get_int("http_port");
  if (http_port < 0 || http_port > 65535) {
    return config_error(spec.program,
                        "http_port: " + std::to_string(http_port) + " is not in 0..65535");
  }
  int64_t max_message_mib = config.get_int("max_message_mib");
  if (max_message_mib < 1 || max_message_mib > 4096) {
    return config_error(spec.program, "max_message_mib: " + std::to_string(max_message_mib) +
                                          " is not in 1..4096");
  }
  for (const char* key : {"login_deadline_ms", "max_pre_login_connections", "max_pre_login_per_host"}) {
    int64_t value = config.get_int(key);
    if (value < 1 || value > 1000000) {
      return config_error(spec.program, std::string(key) + ": " + std::to_string(value) + " is not in 1..1000000");
    }
  }
  int64_t link_timeout_ms = config.get_int("link_timeout_ms");
  if (link_timeout_ms < 0 || link_timeout_ms > 3600000) {
    return config_error(spec.program, "link_timeout_ms: " + std::to_string(link_timeout_ms) +
                                          " is not in 0..3600000");
  }
  if (Status set = rpc::set_loopback_congestion_control(config.get_string("loopback_tcp_congestion")); !set.ok()) {
    return config_error(spec.program, set.message());
  }
  rpc::TlsFiles tls_files{config.get_string("tls_cert"), config.get_string("tls_key"), config.get_string("tls_ca"),
                          config.get_bool("tls_verify_clients")};
  std::shared_ptr<rpc::Tls> tls_server;
  std::shared_ptr<rpc::Tls> tls_client;
  if (!tls_files.cert_file.empty() || !tls_files.key_file.empty() || tls_files.verify_clients) {
    auto made = rpc::Tls::server(tls_files);
    if (!made.ok()) return config_error(spec.program, made.status().message());
    tls_server = *made;
  }
  if (!tls_files.ca_file.empty()) {
    auto made = rpc::Tls::client(tls_files);
    if (!made.ok()) return config_error(spec.program, made.status().message());
    tls_client = *made;
  }
  int64_t threads = config.get_int("threads");
  if (threads < 0 || threads > 1024) {
    return config_error(spec.program, "threads: " + std::to_string(threads) + " is not in 0..1024");
  }
  int64_t buffer_cache_mib = config.get_int("buffer_cache_mib");
  if (buffer_cache_mib < 0) {
    return config_error(spec.program,
                        "buffer_cache_mib: " + std::to_string(buffer_cache_mib) + " is negative");
  }
  set_buffer_cache_limit(static_cast<size_t>(buffer_cache_mib) << 20);
  int64_t grace_ms = config.get_int("shutdown_grace_ms");
  if (grace_ms < 0) {
    return config_error(spec.program,
                        "shutdown_grace_ms: " + std::to_string(grace_ms) + " is negative");
  }
  auto level = parse_log_level(config.get_string("log_level"));
  if (!level) {
    return config_error(spec.program, "log_level: '" + config.get_string("log_level") +
                                          "' is not one of trace, debug, info, warn, error, "
                                          "critical, off");
  }
  // The token never comes from a flag value (it would show in `ps`).
  std::optional<std::string> token;
  if (!config.get_string("token_file").empty()) {
    auto read = read_token_file(config.get_string("token_file"));
    if (!read.ok()) return config_error(spec.program, "token_file: " + read.status().message());
    token = *read;
  } else if (const char* env = std::getenv("CAPSTAN_TOKEN"); env != nullptr && *env != '\0') {
    token = std::string(env);
  }
  auto peers = spec.peers ? spec.peers(config) : Result<std::vector<Peer>>(std::vector<Peer>{});
  if (!peers.ok()) return config_error(spec.program, peers.status().message());
  for (const auto& peer : *peers) {
    std::string peer_host;
    uint16_t peer_port = 0;
    Status ok = rpc::parse_host_port(peer.address, &peer_host, &peer_port);
    if (!ok.ok()) return config_error(spec.program, std::string(role_name(peer.role)) + ": " + ok.message());
  }

  FunctionRegistry functions;
  if (spec.loads_modules && config.has("module")) {
    for (const auto& module : config.get_list("module")) {
      Status loaded = functions.load_module(module);
      if (!loaded.ok()) return config_error(spec.program, "module: " + loaded.message());
    }
  }

  // --- Runtime ------------------------------------------------------------
  NodeIdentity identity(spec.role, task_index);
  std::shared_ptr<spdlog::logger> log;
  try {
    log = make_logger(identity.tag(), *level, config.get_string("log_file"));
  } catch (const spdlog::spdlog_ex& e) {
    return config_error(spec.program, "log_file: " + std::string(e.what()));
  }
  for (const auto& warning : parsed.warnings) log->warn("{}", warning);

  // Signals first, so a SIGTERM during start-up is handled, not fatal.
  boost::asio::io_context signal_context;
  boost::asio::signal_set signals(signal_context, SIGINT, SIGTERM);
  std::signal(SIGPIPE, SIG_IGN);

  MetricsRegistry metrics;
  metrics.callback_gauge("capstan_uptime_seconds", "Seconds since the daemon started.",
                         [&identity]() { return identity.uptime_seconds(); });
  metrics.callback_gauge("capstan_ready", "1 when the daemon has every peer it needs.",
                         [&identity]() { return identity.ready() ? 1.0 : 0.0; });
  metrics.gauge("capstan_build_info", "Version and role of this daemon.",
                {{"version", capstan::version()}, {"role", job}})
      ->set(1);
  register_process_metrics(metrics);
  RpcMetrics rpc_metrics(metrics, log);
  Readiness readiness(*peers, identity);

  size_t pool_threads = threads > 0 ? static_cast<size_t>(threads)
                                    : std::max(1u, std::thread::hardware_concurrency());
  boost::asio::thread_pool pool(pool_threads);
  uint64_t max_message_bytes = static_cast<uint64_t>(max_message_mib) << 20;
  StatusBoard status;
  DaemonContext context{config, identity, metrics, status, pool, log,
                        rpc::codec_options_for(max_message_bytes), nullptr, {}, {}, nullptr, {}, {}};
  context.peers = *peers;
  context.functions = &functions;
  context.peer_options.token = token.value_or("");
  context.peer_options.client_name = identity.tag();
  context.peer_options.max_message_bytes = max_message_bytes;
  context.peer_options.tls = tls_client;
  context.peer_options.link_timeout = std::chrono::milliseconds(link_timeout_ms);

  HttpServer http;
  std::atomic<bool> healthy{false};  // set once the RPC port listens
  http.handle("/healthz", [&healthy]() {
    return healthy.load() ? HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}
                          : HttpResponse{503, "text/plain; charset=utf-8", "starting\n"};
  });
  const std::string caution = spec.caution ? spec.caution(config) : "";
  http.handle("/readyz", [&readiness, &caution]() {
    std::string missing = readiness.missing();
    if (missing.empty()) {
      return HttpResponse{200, "text/plain; charset=utf-8",
                          "ready\n" + (caution.empty() ? "" : "caution: " + caution + "\n")};
    }
    return HttpResponse{503, "text/plain; charset=utf-8", "not ready: " + missing + "\n"};
  });
  http.handle("/metrics", [&metrics]() {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics.render()};
  });
  http.handle("/", []() { return HttpResponse{200, "text/html; charset=utf-8", StatusBoard::page()}; });
  http.handle("/status.json", [&status]() { return HttpResponse{200, "application/json", status.json()}; });
  status.fact("ready", [&readiness, &caution]() {
    std::string missing = readiness.missing();
    return missing.empty() ? (caution.empty() ? "ready" : "ready (caution: " + caution + ")") : "not ready: " + missing;
  });
  status.fact("uptime", [&identity]() { return std::to_string(static_cast<int64_t>(identity.uptime_seconds())) + " s"; });
  status.plot("RPC calls/s", StatusBoard::Plot::kRate, [&rpc_metrics]() { return rpc_metrics.calls(); });
  status.plot("CPU (cores busy)", StatusBoard::Plot::kRate, process_cpu_seconds);
  status.plot("resident memory (MiB)", StatusBoard::Plot::kLevel,
              []() { return process_resident_memory_bytes() / (1 << 20); });
  auto http_started = http.start(host, static_cast<uint16_t>(http_port));
  if (!http_started.ok()) return config_error(spec.program, "http_port: " + http_started.error);

  rpc::RpcServerOptions server_options;
  server_options.host = host;
  server_options.port = static_cast<uint16_t>(port);
  server_options.token = token;
  server_options.max_message_bytes = max_message_bytes;
  server_options.login_deadline = std::chrono::milliseconds(config.get_int("login_deadline_ms"));
  server_options.max_pre_login = static_cast<int>(config.get_int("max_pre_login_connections"));
  server_options.max_pre_login_per_host = static_cast<int>(config.get_int("max_pre_login_per_host"));
  server_options.tls = tls_server;
  server_options.link_timeout = std::chrono::milliseconds(link_timeout_ms);
  server_options.name = job + "-rpc";
  rpc::RpcServer server(server_options, &rpc_metrics);
  {
    // Once: what strangers may hold, and why when the limit lowered it.
    const rpc::PreLoginCaps& caps = server.pre_login_caps();
    std::string why;
    if (caps.lowered) {
      why = " (lowered from max_pre_login_connections " + std::to_string(server_options.max_pre_login) +
            " and max_pre_login_per_host " + std::to_string(server_options.max_pre_login_per_host) +
            " to leave descriptors free under the open-file limit " + std::to_string(caps.fd_limit) +
            "; raise it with ulimit -n or LimitNOFILE)";
    }
    log->info("connections waiting to log in: at most {}, {} per host{}", caps.overall, caps.per_host, why);
  }
  // Whatever the way out, the status board stops before the server (and the
  // service its functions reference) goes.
  struct StopBoard {
    StatusBoard& board;
    ~StopBoard() { board.stop(); }
  } stop_board{status};
  context.loop = &server.loop();
  rpc::RpcServer::StartFailure failure;
  auto bound = server.start([&spec, &context](rpc::CallTracker& tracker) {
    return spec.make_service(context, tracker);
  }, &failure);
  if (!bound.ok()) {
    http.stop();
    const std::string message = bound.status().message();
    switch (failure) {
      case rpc::RpcServer::StartFailure::kService:
        log->critical("{}", message);
        return config_error(spec.program, message);
      case rpc::RpcServer::StartFailure::kAddressInUse:
        return config_error(spec.program, "port: " + message);
      default:
        return config_error(spec.program, "host: " + message);
    }
  }
  // The address peers should use: this task's entry in the cluster spec, or
  // else the bind address (the host name when bound to all interfaces).
  std::string advertised_host = host;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    advertised_host = gethostname(name, sizeof(name) - 1) == 0 ? name : "127.0.0.1";
  }
  std::string advertised = advertised_host + ":" + std::to_string(*bound);
  if (task_index >= 0 && static_cast<size_t>(task_index) < cluster.addresses(job).size() &&
      !config.has("port")) {
    advertised = cluster.addresses(job)[task_index];
  }
  if (const std::string& chosen = config.get_string("advertise_address"); !chosen.empty()) {
    advertised = advertise_address(chosen, *bound).value();  // checked before start
  }
  identity.set_addresses(advertised, http_started.port);
  status.set_facts({{"role", spec.program},
                    {"version", capstan::version()},
                    {"address", advertised},
                    {"task index", std::to_string(identity.task_index())},
                    {"pid", std::to_string(::getpid())}});
  status.start();
  healthy.store(true);
  log->info("{} {} listening: rpc={}:{} http={}:{} (token {}; {}; {} worker threads)", spec.program,
            capstan::version(), host, *bound, host, http_started.port, token ? "required" : "not required",
            !tls_server                ? "plain TCP"
            : tls_files.verify_clients ? "TLS, client certificates required"
                                       : "TLS",
            pool_threads);
  if (!config.get_string("port_file").empty()) {
    Status written = write_port_file(config.get_string("port_file"), advertised, *bound, http_started.port);
    if (!written.ok()) {
      log->error("cannot write port file '{}': {}", config.get_string("port_file"), written.to_string());
      status.stop();
      server.stop(std::chrono::milliseconds(0));
      http.stop();  // its handlers read locals that go before it
      return 2;
    }
  }

  // --- Peers --------------------------------------------------------------
  kj::Own<PeerWatcher> watcher;
  server.loop().run_sync([&]() {
    watcher = kj::heap<PeerWatcher>(server.loop(), readiness, context.peer_options, log);
  });
  if (std::string missing = readiness.missing(); !missing.empty()) {
    log->info("not ready until {}", missing);
  }
  if (!caution.empty()) log->warn("{}", caution);

  // --- Run until SIGTERM/SIGINT -------------------------------------------
  int signal_number = 0;
  signals.async_wait([&signal_number](const boost::system::error_code& error, int number) {
    if (!error) signal_number = number;
  });
  signal_context.run();

  auto started = std::chrono::steady_clock::now();
  log->info("received {}, shutting down (up to {} ms for calls in flight)",
            signal_number == SIGTERM ? "SIGTERM" : "SIGINT", grace_ms);
  readiness.set_stopping();
  if (!context.on_drain.empty()) {
    try {
      server.loop().run_sync([&]() -> kj::Promise<void> {
        auto drains = kj::heapArrayBuilder<kj::Promise<void>>(context.on_drain.size());
        for (auto& drain : context.on_drain) drains.add(drain());
        return kj::joinPromises(drains.finish())
            .exclusiveJoin(server.loop().timer().afterDelay(grace_ms * kj::MILLISECONDS).then([&log, grace_ms]() {
              log->warn("draining took longer than shutdown_grace_ms {}; stopping anyway", grace_ms);
            }));
      });
    } catch (const kj::Exception& e) {
      log->warn("draining failed: {}", e.getDescription().cStr());
    }
  }
  const int64_t drained_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - started).count();
  server.loop().run_sync([&]() { watcher = nullptr; });
  status.stop();  // before the service its functions reference goes
  server.stop(std::chrono::milliseconds(std::max<int64_t>(grace_ms - drained_ms, 0)), &pool, [&context]() {
    for (auto& hook : context.on_stop) hook();
  });
  http.stop();
  log->info("stopped after {:.2f} s",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  log->flush();
  return 0;
}

}  // namespace capstan::daemon
