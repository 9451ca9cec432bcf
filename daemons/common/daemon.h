// The runtime every Capstan daemon shares.
//
// A role's main() describes itself in a RoleSpec and calls run_daemon(),
// which:
//   1. reads configuration (YAML file < CAPSTAN_* env < flags; TF_CONFIG),
//      each integer checked against the range in its OptionSpec, then the
//      common keys into DaemonSettings; bad configuration prints one line
//      and exits 2;
//   2. sets up logging (role and task index in every line), metrics and the
//      worker thread pool;
//   3. serves /healthz, /readyz and /metrics on the HTTP port, then the
//      role's Cap'n Proto service behind the token gate on the RPC port
//      (port 0 picks free ports; they are logged and written to --port-file);
//   4. keeps connecting to the peers the role needs, with backoff, and
//      reports ready only while it has them all;
//   5. on SIGTERM/SIGINT stops accepting calls, lets calls in flight finish
//      (up to shutdown_grace_ms), and exits 0.
#ifndef CAPSTAN_DAEMONS_COMMON_DAEMON_H_
#define CAPSTAN_DAEMONS_COMMON_DAEMON_H_

#include <boost/asio/thread_pool.hpp>
#include <capnp/capability.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/functions.h"
#include "capstan/status.h"
#include "capstan_schemas/common.capnp.h"
#include "daemons/common/config.h"
#include "daemons/common/metrics.h"
#include "daemons/common/status_board.h"
#include "rpc/connection.h"
#include "rpc/server.h"
#include "rpc/tensor_codec.h"
#include "rpc/tls.h"
#include "sync/mutex.h"

namespace capstan::daemon {

// Who this daemon is; read by info() and /readyz from any thread.
class NodeIdentity {
 public:
  NodeIdentity(wire::Role role, int task_index);

  wire::Role role() const { return role_; }
  int task_index() const { return task_index_; }
  double uptime_seconds() const;
  // "ps:0" (or "ps" without an index): the tag in every log line.
  std::string tag() const;

  // Once, at start: after the RPC port is bound, so an early info() call
  // may race with it (hence the mutex; ThreadSanitizer found it).
  void set_addresses(std::string rpc_address, uint16_t http_port);
  std::string rpc_address() const;
  uint16_t http_port() const;

  bool ready() const { return ready_.load(); }
  void set_ready(bool ready) { ready_.store(ready); }

  void fill(wire::NodeInfo::Builder info) const;

 private:
  const wire::Role role_;
  const int task_index_;
  const std::chrono::steady_clock::time_point started_;
  const int gpu_count_;
  mutable Mutex mutex_;
  std::string rpc_address_ GUARDED_BY(mutex_);
  uint16_t http_port_ GUARDED_BY(mutex_) = 0;
  std::atomic<bool> ready_{false};
};

// A daemon this one needs before it is ready.
struct Peer {
  wire::Role role;
  std::string address;
};

// What a role's service gets from the runtime. Outlives the service.
struct DaemonContext {
  const Config& config;
  NodeIdentity& identity;
  MetricsRegistry& metrics;
  StatusBoard& status;  // the status page at `/`: the service adds its plots and tables
  boost::asio::thread_pool& pool;  // heavy work goes here (see async/pool.h)
  std::shared_ptr<spdlog::logger> log;
  rpc::CodecOptions codec;
  async::LoopThread* loop = nullptr;       // the RPC loop the service lives on
  std::vector<Peer> peers;               // from the configuration
  rpc::ConnectOptions peer_options;      // token etc. for connecting to peers
  const FunctionRegistry* functions = nullptr;  // modules loaded with --module
  // Run on the loop thread at shutdown, after calls in flight and pool work
  // have finished and before the service is released (RpcServer::stop's
  // before_release): a service closes here the connections that hold a
  // capability to itself.
  std::vector<std::function<void()>> on_stop;
  // Run on the loop thread when SIGTERM/SIGINT arrives, before the server
  // stops taking calls; the shutdown waits for their promises (within
  // shutdown_grace_ms): a worker leaves the coordinator here, the
  // coordinator lets its running closures finish.
  std::vector<std::function<kj::Promise<void>()>> on_drain;
};

struct RoleSpec {
  wire::Role role;
  std::string program;      // "ps-server"
  std::string description;  // first paragraph of --help
  std::vector<OptionSpec> options;  // the role's own keys
  // Adds the `module` key: shared libraries of user functions to load.
  bool loads_modules = false;
  // The peers the role needs, from its configuration; an error here is a
  // configuration error (exit 2).
  std::function<Result<std::vector<Peer>>(const Config&)> peers;
  // A caution about a configuration that works but may not be what the user
  // meant ("" for none): logged as a warning at start and shown by /readyz
  // after "ready".
  std::function<std::string(const Config&)> caution;
  // Builds the role's service on the RPC loop thread.
  std::function<capnp::Capability::Client(DaemonContext&, rpc::CallTracker&)> make_service;
};

// The make_service of a role whose service class takes a DaemonContext&.
template <typename Service>
auto service_factory() {
  return [](DaemonContext& context, rpc::CallTracker& tracker) -> capnp::Capability::Client {
    return kj::heap<rpc::Instrumented<Service>>(tracker, context);
  };
}

// Runs the daemon until SIGTERM/SIGINT; returns the process exit code.
int run_daemon(const RoleSpec& spec, int argc, char** argv);

// The keys every daemon has (documented in --help and the README), with the
// range of each integer, which parse_config enforces.
std::vector<OptionSpec> common_options();

// The common keys of one daemon, read from its Config once and checked
// together before anything starts, so that every configuration error exits 2
// before a port is bound. parse_config has checked each integer's range; what
// is checked here needs the cluster spec, a file or the role.
struct DaemonSettings {
  // task_index, else this task's index in the cluster spec; -1: none.
  int task_index = -1;
  std::string host;  // the RPC and HTTP ports bind to it
  // --port, else this task's port in the cluster spec, else the role's own
  // (7000 coordinator ... 7400 data-worker); 0 picks a free one.
  uint16_t port = 0;
  // This task's entry in the cluster spec, when the port came from it: the
  // address peers use unless advertise_address says otherwise.
  std::string cluster_address;
  std::string advertise_address;  // as given, checked; "": derived at start
  uint16_t http_port = 0;
  std::string port_file;  // "": none
  spdlog::level::level_enum log_level = spdlog::level::info;
  std::string log_file;  // "": stderr only
  // From token_file, else CAPSTAN_TOKEN (never a flag: it would show in
  // `ps`); nullopt: an open cluster.
  std::optional<std::string> token;
  size_t threads = 1;  // the worker pool's size: `threads`, or one per core for 0
  uint64_t max_message_bytes = 0;
  size_t buffer_cache_bytes = 0;
  std::chrono::milliseconds shutdown_grace{0};
  std::chrono::milliseconds login_deadline{0};
  std::chrono::milliseconds link_timeout{0};
  int max_pre_login_connections = 0;
  int max_pre_login_per_host = 0;
  std::string loopback_tcp_congestion;
  rpc::TlsFiles tls_files;
  std::shared_ptr<rpc::Tls> tls_server;  // loaded from tls_files; null: plain TCP
  std::shared_ptr<rpc::Tls> tls_client;  // with tls_ca; null: peers over plain TCP
  std::vector<Peer> peers;               // RoleSpec::peers, addresses checked
  std::vector<std::string> modules;      // RoleSpec::loads_modules: libraries to load

  // The role's peers' errors as RoleSpec::peers gives them; otherwise
  // InvalidArgument naming the key and the value.
  static Result<DaemonSettings> from(const RoleSpec& spec, const Config& config);
};

// The address a daemon advertises for --advertise_address VALUE: HOST:PORT as
// given, or HOST with `bound_port` (an IPv6 literal bracketed).
// INVALID_ARGUMENT names the value when it is no host or has a bad port.
Result<std::string> advertise_address(const std::string& value, int bound_port);

// The IP address of this machine's interface that reaches `peer`
// (host:port): a UDP socket is "connected" to it (no packet is sent) and
// asked for its local address. nullopt when the peer cannot be resolved.
std::optional<std::string> local_address_towards(const std::string& peer);

// The address of `role` from a flag/config key, else from the cluster spec
// (first task of that job); NotFound naming both when neither is set.
Result<std::string> peer_address(const Config& config, const std::string& key,
                                 const std::string& job);

// RoleSpec::peers of a role that needs one peer, `role`, found as
// peer_address(config, key, job) finds it.
std::function<Result<std::vector<Peer>>(const Config&)> one_peer(wire::Role role, std::string key, std::string job);

}  // namespace capstan::daemon

#endif  // CAPSTAN_DAEMONS_COMMON_DAEMON_H_
