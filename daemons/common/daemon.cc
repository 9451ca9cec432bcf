#include "daemons/common/daemon.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>
#include <thread>

#include "async/status_exception.h"
#include "capstan/client.h"
#include "capstan/trace.h"
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
  PeerWatcher(async::LoopThread& loop, Readiness& readiness, rpc::ConnectOptions options,
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
                          peer.address, async::from_exception(e).message());
              return loop_.timer().afterDelay(5 * kj::SECONDS);
            })
        .then([this, i]() { return watch(i); });
  }

  async::LoopThread& loop_;
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
      OptionSpec{"port", OptionType::kInt,
                 "RPC port; 0 picks a free one. Default: the role's port, or this task's port in the "
                 "cluster spec.",
                 std::nullopt}
          .in_range(0, 65535),
      OptionSpec{"http_port", OptionType::kInt, "HTTP port for /healthz, /readyz and /metrics; 0 picks a free one.",
                 "0"}
          .in_range(0, 65535),
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
      // -1: none given; at most INT_MAX, as it is kept in an int.
      OptionSpec{"task_index", OptionType::kInt,
                 "This task's index in its job (default: from the cluster spec; a worker-server without one gets "
                 "the lowest free index from the coordinator).",
                 "-1"}
          .in_range(-1, std::numeric_limits<int>::max()),
      OptionSpec{"threads", OptionType::kInt, "Worker threads for heavy work; 0 means one per core.", "0"}
          .in_range(0, 1024),
      OptionSpec{"max_message_mib", OptionType::kInt,
                 "Largest RPC message payload accepted, in MiB (plus 64 KiB of framing; Cap'n Proto traversal "
                 "limit); larger tensors are chunked.",
                 "64"}
          .in_range(1, 4096),
      OptionSpec{"buffer_cache_mib", OptionType::kInt,
                 "MiB of freed large tensor buffers kept for reuse (faster repeated transfers); 0 disables.",
                 "1024"}
          .at_least(0),
      OptionSpec{"flight_records", OptionType::kInt,
                 "Spans the flight recorder keeps (the last closures, steps, collectives and RPCs; "
                 "`capstanctl dump` prints them).",
                 "4096"}
          .in_range(16, 1000000),
      OptionSpec{"shutdown_grace_ms", OptionType::kInt,
                 "On SIGTERM, how long calls in flight may take to finish before the daemon exits.", "8000"}
          .at_least(0),
      // The pre-login limits are ints in rpc::RpcServerOptions; a million is
      // far beyond any open-file limit.
      OptionSpec{"login_deadline_ms", OptionType::kInt,
                 "A connection that has not logged in (sent the cluster token) this long after connecting is "
                 "closed.",
                 "10000"}
          .in_range(1, 1000000),
      OptionSpec{"max_pre_login_connections", OptionType::kInt,
                 "Connections not yet logged in, at most (lowered to fit the open-file limit); at the cap the one "
                 "that waited longest is closed to admit a new one.",
                 "1024"}
          .in_range(1, 1000000),
      OptionSpec{"max_pre_login_per_host", OptionType::kInt,
                 "Connections not yet logged in from one host, at most (lowered to fit the open-file limit); at the "
                 "cap that host's connection that waited longest is closed to admit a new one.",
                 "256"}
          .in_range(1, 1000000),
      OptionSpec{"link_timeout_ms", OptionType::kInt,
                 "A link to or from a peer that stops acknowledging (a network partition) breaks after this long, "
                 "so calls fail with UNAVAILABLE instead of waiting; 0 leaves TCP's own (many minutes).",
                 "10000"}
          .in_range(0, 3600000),
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

std::function<Result<std::vector<Peer>>(const Config&)> one_peer(wire::Role role, std::string key, std::string job) {
  return [role, key = std::move(key), job = std::move(job)](const Config& config) -> Result<std::vector<Peer>> {
    CAPSTAN_ASSIGN_OR_RETURN(std::string address, peer_address(config, key, job));
    return std::vector<Peer>{{role, address}};
  };
}

Result<DaemonSettings> DaemonSettings::from(const RoleSpec& spec, const Config& config) {
  DaemonSettings out;
  const ClusterSpec& cluster = config.cluster();
  const std::string job = job_of(spec.role);
  if (!cluster.task_type.empty() && cluster.task_type != job) {
    return Status::InvalidArgument("cluster spec: task type '" + cluster.task_type + "' does not match " +
                                   spec.program + " (expects '" + job + "')");
  }
  out.task_index = static_cast<int>(config.get_int("task_index"));  // -1..INT_MAX by its spec
  if (out.task_index < 0 && cluster.task_index >= 0 && cluster.task_type == job) {
    out.task_index = cluster.task_index;
  }
  out.host = config.get_string("host");
  out.advertise_address = config.get_string("advertise_address");
  if (!out.advertise_address.empty()) {
    CAPSTAN_RETURN_IF_ERROR(daemon::advertise_address(out.advertise_address, 1).status());
  }
  const std::vector<std::string>& own_job = cluster.addresses(job);
  if (config.has("port")) {
    out.port = static_cast<uint16_t>(config.get_int("port"));  // 0..65535 by its spec
  } else if (out.task_index >= 0 && static_cast<size_t>(out.task_index) < own_job.size()) {
    out.cluster_address = own_job[static_cast<size_t>(out.task_index)];
    std::string own_host;
    Status parsed = rpc::parse_host_port(out.cluster_address, &own_host, &out.port);
    if (!parsed.ok()) return Status::InvalidArgument("cluster spec: " + parsed.message());
    // Other tasks reach us at the cluster spec's address: listen on all
    // interfaces unless told otherwise.
    if (config.source("host") == "default" && own_host != "127.0.0.1" && own_host != "localhost") {
      out.host = "0.0.0.0";
    }
  } else {
    static const std::map<wire::Role, uint16_t> kDefaultPorts = {
        {wire::Role::COORDINATOR, 7000}, {wire::Role::PS, 7100}, {wire::Role::WORKER, 7200},
        {wire::Role::DATA_DISPATCHER, 7300}, {wire::Role::DATA_WORKER, 7400}};
    out.port = kDefaultPorts.at(spec.role);
  }
  out.http_port = static_cast<uint16_t>(config.get_int("http_port"));
  out.port_file = config.get_string("port_file");
  out.max_message_bytes = static_cast<uint64_t>(config.get_int("max_message_mib")) << 20;
  out.login_deadline = std::chrono::milliseconds(config.get_int("login_deadline_ms"));
  out.max_pre_login_connections = static_cast<int>(config.get_int("max_pre_login_connections"));
  out.max_pre_login_per_host = static_cast<int>(config.get_int("max_pre_login_per_host"));
  out.link_timeout = std::chrono::milliseconds(config.get_int("link_timeout_ms"));
  out.loopback_tcp_congestion = config.get_string("loopback_tcp_congestion");
  out.tls_files = {config.get_string("tls_cert"), config.get_string("tls_key"), config.get_string("tls_ca"),
                   config.get_bool("tls_verify_clients")};
  if (!out.tls_files.cert_file.empty() || !out.tls_files.key_file.empty() || out.tls_files.verify_clients) {
    CAPSTAN_ASSIGN_OR_RETURN(out.tls_server, rpc::Tls::server(out.tls_files));
  }
  if (!out.tls_files.ca_file.empty()) {
    CAPSTAN_ASSIGN_OR_RETURN(out.tls_client, rpc::Tls::client(out.tls_files));
  }
  const int64_t threads = config.get_int("threads");
  out.threads = threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  out.buffer_cache_bytes = static_cast<size_t>(config.get_int("buffer_cache_mib")) << 20;
  out.shutdown_grace = std::chrono::milliseconds(config.get_int("shutdown_grace_ms"));
  const std::string& level = config.get_string("log_level");
  std::optional<spdlog::level::level_enum> parsed_level = parse_log_level(level);
  if (!parsed_level) {
    return Status::InvalidArgument("log_level: '" + level +
                                   "' is not one of trace, debug, info, warn, error, critical, off");
  }
  out.log_level = *parsed_level;
  out.log_file = config.get_string("log_file");
  if (const std::string& file = config.get_string("token_file"); !file.empty()) {
    Result<std::string> read = read_token_file(file);
    if (!read.ok()) return Status::InvalidArgument("token_file: " + read.status().message());
    out.token = *read;
  } else if (const char* env = std::getenv("CAPSTAN_TOKEN"); env != nullptr && *env != '\0') {
    out.token = std::string(env);
  }
  if (spec.peers) {
    CAPSTAN_ASSIGN_OR_RETURN(out.peers, spec.peers(config));
  }
  for (const Peer& peer : out.peers) {
    std::string peer_host;
    uint16_t peer_port = 0;
    Status parsed = rpc::parse_host_port(peer.address, &peer_host, &peer_port);
    if (!parsed.ok()) return Status::InvalidArgument(std::string(role_name(peer.role)) + ": " + parsed.message());
  }
  if (spec.loads_modules && config.has("module")) out.modules = config.get_list("module");
  return out;
}

namespace {

// The common keys, then the role's own.
std::vector<OptionSpec> role_options(const RoleSpec& spec) {
  std::vector<OptionSpec> specs = common_options();
  specs.insert(specs.end(), spec.options.begin(), spec.options.end());
  if (spec.loads_modules) {
    specs.push_back({"module", OptionType::kStringList,
                     "Shared libraries of user functions (closures, dataset functions) to load "
                     "(CAPSTAN_MODULE); repeat or separate with commas.",
                     std::nullopt});
  }
  return specs;
}

// What the settings change for the whole process, before any socket exists.
Status apply_process_settings(const DaemonSettings& settings) {
  CAPSTAN_RETURN_IF_ERROR(rpc::set_loopback_congestion_control(settings.loopback_tcp_congestion));
  set_buffer_cache_limit(settings.buffer_cache_bytes);
  std::signal(SIGPIPE, SIG_IGN);  // a peer that goes away is an error on its socket, not our death
  return Status::Ok();
}

Status load_modules(const std::vector<std::string>& modules, FunctionRegistry& functions) {
  for (const std::string& module : modules) {
    Status loaded = functions.load_module(module);
    if (!loaded.ok()) return Status::InvalidArgument("module: " + loaded.message());
  }
  return Status::Ok();
}

Result<std::shared_ptr<spdlog::logger>> open_log(const NodeIdentity& identity, const DaemonSettings& settings) {
  try {
    return make_logger(identity.tag(), settings.log_level, settings.log_file);
  } catch (const spdlog::spdlog_ex& e) {
    return Status::InvalidArgument("log_file: " + std::string(e.what()));
  }
}

// One daemon's runtime, from binding its ports to its exit: start() binds
// and builds the service, serve() waits for SIGTERM/SIGINT, drain() shuts
// down gracefully.
//
// The members are declared in the order they depend on one another, so that
// whatever the way out (a failed start included) they are destroyed in
// reverse: the status board, the RPC server (and the service) and the HTTP
// server stop before what their functions and handlers read.
//
// Daemon is not thread-safe: main's thread calls start, serve and drain, in
// that order; the peer watcher lives on the RPC loop thread.
class Daemon {
 public:
  // `spec`, `config`, `settings`, `identity` and `functions` must outlive
  // the Daemon.
  Daemon(const RoleSpec& spec, const Config& config, const DaemonSettings& settings, NodeIdentity& identity,
         const FunctionRegistry& functions, std::shared_ptr<spdlog::logger> log);
  ~Daemon();

  // Serves HTTP, then the role's service on the RPC port; writes the port
  // file and starts watching the peers. An error is a configuration error
  // (exit 2): the port is taken, the service cannot start, the port file
  // cannot be written.
  Status start();
  // Blocks until SIGTERM or SIGINT; returns which.
  int serve();
  // Reports not ready, runs the service's drain hooks, lets calls in flight
  // finish (all within shutdown_grace_ms) and stops everything.
  void drain(int signal_number);

 private:
  void register_metrics();
  void register_pages();
  rpc::RpcServerOptions server_options() const;
  rpc::ConnectOptions peer_options() const;
  // The address peers should use: advertise_address, else this task's entry
  // in the cluster spec, else the bind address (the host name when bound to
  // all interfaces).
  std::string advertised_address(uint16_t bound_port) const;

  // Constant after construction.
  const RoleSpec& spec_;
  const DaemonSettings& settings_;
  NodeIdentity& identity_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::string job_;
  const std::string caution_;  // RoleSpec::caution; "" for none

  // Created first, so a SIGTERM during start-up is handled, not fatal.
  boost::asio::io_context signal_context_;
  boost::asio::signal_set signals_;
  MetricsRegistry metrics_;
  RpcMetrics rpc_metrics_;
  Readiness readiness_;
  boost::asio::thread_pool pool_;
  StatusBoard status_;
  DaemonContext context_;
  std::atomic<bool> healthy_{false};  // set once the RPC port listens
  HttpServer http_;
  rpc::RpcServer server_;
  // Stops the status board before the server (and the service its
  // functions reference) goes, whatever the way out.
  struct StopBoard {
    StatusBoard& board;
    ~StopBoard() { board.stop(); }
  } stop_board_{status_};
  kj::Own<PeerWatcher> watcher_;  // made and released on the loop thread
};

Daemon::Daemon(const RoleSpec& spec, const Config& config, const DaemonSettings& settings, NodeIdentity& identity,
               const FunctionRegistry& functions, std::shared_ptr<spdlog::logger> log)
    : spec_(spec),
      settings_(settings),
      identity_(identity),
      log_(std::move(log)),
      job_(job_of(spec.role)),
      caution_(spec.caution ? spec.caution(config) : ""),
      signals_(signal_context_, SIGINT, SIGTERM),
      rpc_metrics_(metrics_, log_),
      readiness_(settings.peers, identity),
      pool_(settings.threads),
      context_{config,   identity, metrics_, status_, pool_, log_, rpc::codec_options_for(settings.max_message_bytes),
               nullptr,  settings.peers, peer_options(), &functions, {}, {}},
      server_(server_options(), &rpc_metrics_) {
  register_metrics();
  register_pages();
  // Once: what strangers may hold, and why when the limit lowered it.
  const rpc::PreLoginCaps& caps = server_.pre_login_caps();
  std::string why;
  if (caps.lowered) {
    why = " (lowered from max_pre_login_connections " + std::to_string(settings_.max_pre_login_connections) +
          " and max_pre_login_per_host " + std::to_string(settings_.max_pre_login_per_host) +
          " to leave descriptors free under the open-file limit " + std::to_string(caps.fd_limit) +
          "; raise it with ulimit -n or LimitNOFILE)";
  }
  log_->info("connections waiting to log in: at most {}, {} per host{}", caps.overall, caps.per_host, why);
}

Daemon::~Daemon() {
  // drain() releases the watcher; this is for a Daemon that goes without it
  // (an exception). It lives on the loop thread, which is still up here.
  if (watcher_) server_.loop().run_sync([this]() { watcher_ = nullptr; });
}

rpc::RpcServerOptions Daemon::server_options() const {
  rpc::RpcServerOptions options;
  options.host = settings_.host;
  options.port = settings_.port;
  options.token = settings_.token;
  options.max_message_bytes = settings_.max_message_bytes;
  options.login_deadline = settings_.login_deadline;
  options.max_pre_login = settings_.max_pre_login_connections;
  options.max_pre_login_per_host = settings_.max_pre_login_per_host;
  options.tls = settings_.tls_server;
  options.link_timeout = settings_.link_timeout;
  options.name = job_ + "-rpc";
  return options;
}

rpc::ConnectOptions Daemon::peer_options() const {
  rpc::ConnectOptions options;
  options.token = settings_.token.value_or("");
  options.client_name = identity_.tag();
  options.max_message_bytes = settings_.max_message_bytes;
  options.tls = settings_.tls_client;
  options.link_timeout = settings_.link_timeout;
  return options;
}

void Daemon::register_metrics() {
  NodeIdentity& identity = identity_;
  metrics_.callback_gauge("capstan_uptime_seconds", "Seconds since the daemon started.",
                          [&identity]() { return identity.uptime_seconds(); });
  metrics_.callback_gauge("capstan_ready", "1 when the daemon has every peer it needs.",
                          [&identity]() { return identity.ready() ? 1.0 : 0.0; });
  metrics_.gauge("capstan_build_info", "Version and role of this daemon.",
                 {{"version", capstan::version()}, {"role", job_}})
      ->set(1);
  register_process_metrics(metrics_);
}

// /healthz, /readyz, /metrics and the status page.
void Daemon::register_pages() {
  const std::atomic<bool>& healthy = healthy_;
  const Readiness& readiness = readiness_;
  const std::string& caution = caution_;
  MetricsRegistry& metrics = metrics_;
  StatusBoard& status = status_;
  NodeIdentity& identity = identity_;
  RpcMetrics& rpc_metrics = rpc_metrics_;
  http_.handle("/healthz", [&healthy]() {
    return healthy.load() ? HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}
                          : HttpResponse{503, "text/plain; charset=utf-8", "starting\n"};
  });
  http_.handle("/readyz", [&readiness, &caution]() {
    std::string missing = readiness.missing();
    if (missing.empty()) {
      return HttpResponse{200, "text/plain; charset=utf-8",
                          "ready\n" + (caution.empty() ? "" : "caution: " + caution + "\n")};
    }
    return HttpResponse{503, "text/plain; charset=utf-8", "not ready: " + missing + "\n"};
  });
  http_.handle("/metrics", [&metrics]() {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics.render()};
  });
  http_.handle("/", []() { return HttpResponse{200, "text/html; charset=utf-8", StatusBoard::page()}; });
  http_.handle("/status.json", [&status]() { return HttpResponse{200, "application/json", status.json()}; });
  status_.fact("ready", [&readiness, &caution]() {
    std::string missing = readiness.missing();
    return missing.empty() ? (caution.empty() ? "ready" : "ready (caution: " + caution + ")") : "not ready: " + missing;
  });
  status_.fact("uptime", [&identity]() { return std::to_string(static_cast<int64_t>(identity.uptime_seconds())) + " s"; });
  status_.plot("RPC calls/s", StatusBoard::Plot::kRate, [&rpc_metrics]() { return rpc_metrics.calls(); });
  status_.plot("CPU (cores busy)", StatusBoard::Plot::kRate, process_cpu_seconds);
  status_.plot("resident memory (MiB)", StatusBoard::Plot::kLevel,
               []() { return process_resident_memory_bytes() / (1 << 20); });
}

std::string Daemon::advertised_address(uint16_t bound_port) const {
  if (!settings_.advertise_address.empty()) {
    return advertise_address(settings_.advertise_address, bound_port).value();  // checked by from()
  }
  if (!settings_.cluster_address.empty()) return settings_.cluster_address;
  std::string host = settings_.host;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = gethostname(name, sizeof(name) - 1) == 0 ? name : "127.0.0.1";
  }
  return host + ":" + std::to_string(bound_port);
}

Status Daemon::start() {
  auto http_started = http_.start(settings_.host, settings_.http_port);
  if (!http_started.ok()) return Status::InvalidArgument("http_port: " + http_started.error);

  context_.loop = &server_.loop();
  rpc::RpcServer::StartFailure failure = rpc::RpcServer::StartFailure::kNone;
  // The identity has this daemon's address before its service exists: a
  // worker-server registers with the coordinator as its service starts, and
  // sent an empty address when that beat this thread.
  Result<uint16_t> bound = server_.start(
      [this](rpc::CallTracker& tracker) { return spec_.make_service(context_, tracker); }, &failure,
      [this, &http_started](uint16_t port) { identity_.set_addresses(advertised_address(port), http_started.port); });
  if (!bound.ok()) {
    // The kind of failure, not its text, says which key to blame. No
    // temporaries inside switch cases here: clang 14's ASan build destroyed
    // a case's temporary Status at the switch's end, on a path that never
    // made it (stack-use-after-scope, and a crash now and then).
    const Status error = bound.status();
    if (failure == rpc::RpcServer::StartFailure::kService) {
      log_->critical("{}", error.message());
      return error;
    }
    const char* key = failure == rpc::RpcServer::StartFailure::kAddressInUse ? "port: " : "host: ";
    return Status::InvalidArgument(key + error.message());
  }
  const std::string advertised = identity_.rpc_address();
  status_.set_facts({{"role", spec_.program},
                     {"version", capstan::version()},
                     {"address", advertised},
                     {"task index", std::to_string(identity_.task_index())},
                     {"pid", std::to_string(::getpid())}});
  status_.start();
  healthy_.store(true);
  log_->info("{} {} listening: rpc={}:{} http={}:{} (token {}; {}; {} worker threads)", spec_.program,
             capstan::version(), settings_.host, *bound, settings_.host, http_started.port,
             settings_.token ? "required" : "not required",
             !settings_.tls_server               ? "plain TCP"
             : settings_.tls_files.verify_clients ? "TLS, client certificates required"
                                                  : "TLS",
             settings_.threads);
  if (!settings_.port_file.empty()) {
    Status written = write_port_file(settings_.port_file, advertised, *bound, http_started.port);
    if (!written.ok()) {
      log_->error("cannot write port file '{}': {}", settings_.port_file, written.to_string());
      return Status::InvalidArgument("port_file: cannot write '" + settings_.port_file + "': " + written.message());
    }
  }

  server_.loop().run_sync([this]() {
    watcher_ = kj::heap<PeerWatcher>(server_.loop(), readiness_, context_.peer_options, log_);
  });
  if (std::string missing = readiness_.missing(); !missing.empty()) log_->info("not ready until {}", missing);
  if (!caution_.empty()) log_->warn("{}", caution_);
  return Status::Ok();
}

int Daemon::serve() {
  int signal_number = 0;
  signals_.async_wait([&signal_number](const boost::system::error_code& error, int number) {
    if (!error) signal_number = number;
  });
  signal_context_.run();
  return signal_number;
}

void Daemon::drain(int signal_number) {
  const auto started = std::chrono::steady_clock::now();
  const int64_t grace_ms = settings_.shutdown_grace.count();
  log_->info("received {}, shutting down (up to {} ms for calls in flight)",
             signal_number == SIGTERM ? "SIGTERM" : "SIGINT", grace_ms);
  readiness_.set_stopping();
  if (!context_.on_drain.empty()) {
    try {
      server_.loop().run_sync([this, grace_ms]() -> kj::Promise<void> {
        auto drains = kj::heapArrayBuilder<kj::Promise<void>>(context_.on_drain.size());
        for (auto& drain : context_.on_drain) drains.add(drain());
        return kj::joinPromises(drains.finish())
            .exclusiveJoin(server_.loop().timer().afterDelay(grace_ms * kj::MILLISECONDS).then([this, grace_ms]() {
              log_->warn("draining took longer than shutdown_grace_ms {}; stopping anyway", grace_ms);
            }));
      });
    } catch (const kj::Exception& e) {
      log_->warn("draining failed: {}", e.getDescription().cStr());
    }
  }
  const int64_t drained_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  server_.loop().run_sync([this]() { watcher_ = nullptr; });
  status_.stop();  // before the service its functions reference goes
  server_.stop(std::chrono::milliseconds(std::max<int64_t>(grace_ms - drained_ms, 0)), &pool_, [this]() {
    for (auto& hook : context_.on_stop) hook();
  });
  http_.stop();
  log_->info("stopped after {:.2f} s",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  log_->flush();
}

}  // namespace

int run_daemon(const RoleSpec& spec, int argc, char** argv) {
  ParseResult parsed =
      parse_config(spec.program, spec.description, role_options(spec), argc, argv, current_environment());
  if (parsed.action == ParseResult::Action::kError) return config_error(spec.program, parsed.text);
  if (parsed.action != ParseResult::Action::kRun) {
    std::fputs(parsed.text.c_str(), stdout);
    return 0;
  }
  const Config& config = parsed.config;
  Result<DaemonSettings> settings = DaemonSettings::from(spec, config);
  if (!settings.ok()) return config_error(spec.program, settings.status().message());
  if (Status applied = apply_process_settings(*settings); !applied.ok()) {
    return config_error(spec.program, applied.message());
  }
  FunctionRegistry functions;  // outlives the service, which calls into it
  if (Status loaded = load_modules(settings->modules, functions); !loaded.ok()) {
    return config_error(spec.program, loaded.message());
  }
  NodeIdentity identity(spec.role, settings->task_index);
  Result<std::shared_ptr<spdlog::logger>> log = open_log(identity, *settings);
  if (!log.ok()) return config_error(spec.program, log.status().message());
  for (const std::string& warning : parsed.warnings) (*log)->warn("{}", warning);
  trace::Recorder::get().set_flight_capacity(static_cast<size_t>(config.get_int("flight_records")));
  // A failed collective's flight records (capstan/trace.h) go to the log.
  trace::set_report_sink([log = *log](const std::string& text) { log->error("{}", text); });

  Daemon daemon(spec, config, *settings, identity, functions, *log);
  if (Status started = daemon.start(); !started.ok()) return config_error(spec.program, started.message());
  daemon.drain(daemon.serve());
  return 0;
}

}  // namespace capstan::daemon
