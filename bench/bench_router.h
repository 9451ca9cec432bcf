// A VariableRouter of a bench's own (the client side of what a worker
// does), with placements fetched from the coordinator as ClusterCoordinator
// does, and the cluster of parameter servers it routes to. Shared by
// ps_bench and embedding_bench.
#ifndef CAPSTAN_BENCH_BENCH_ROUTER_H_
#define CAPSTAN_BENCH_BENCH_ROUTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/connection.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "training/variable_router.h"

namespace capstan::bench {

class Router {
 public:
  Router(const std::string& coordinator, uint64_t max_message_bytes, const std::string& client_name)
      : loop_(client_name + "-router") {
    rpc::ConnectOptions connect;
    connect.client_name = client_name;
    connect.max_message_bytes = max_message_bytes;
    loop_.run_sync([&]() { connection_ = kj::heap<rpc::Connection>(loop_.io(), loop_.timer(), coordinator, connect); });
    router_ = std::make_unique<VariableRouter>(loop_, connect, rpc::codec_options_for(max_message_bytes),
                                               std::chrono::seconds(120),
                                               placements_from(*connection_, loop_.timer()));
  }
  ~Router() {
    router_.reset();
    loop_.run_sync([this]() { connection_ = nullptr; });
  }
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  VariableRouter& operator*() { return *router_; }
  VariableRouter* operator->() { return router_.get(); }

 private:
  async::LoopThread loop_;
  kj::Own<rpc::Connection> connection_;
  std::unique_ptr<VariableRouter> router_;
};

// `num_ps` ps-servers and a coordinator started by bench::start (labels
// "ps<tag>_<i>" and "coordinator<tag>"), a client of the coordinator and a
// Router, both named `client_name`. Exits through fail() when the client
// cannot connect. Going, it drops the router and the client, then stops
// every daemon.
struct PsCluster {
  PsCluster(const std::string& bin_dir, int num_ps, const std::string& tag, const std::string& client_name) {
    for (int i = 0; i < num_ps; ++i) {
      ps_labels.push_back("ps" + tag + "_" + std::to_string(i));
      ps_list += (i > 0 ? "," : "") +
                 start(bin_dir, "ps-server", ps_labels.back(), {"--task-index", std::to_string(i)}).address;
    }
    coordinator = start(bin_dir, "coordinator", "coordinator" + tag, {"--ps", ps_list}).address;
    ClientOptions options;
    options.client_name = client_name;
    options.call_timeout = std::chrono::milliseconds(120000);
    auto connected = ClusterCoordinator::connect(coordinator, options);
    if (!connected.ok()) fail("connect to the coordinator", connected.status());
    client = *std::move(connected);
    router = std::make_unique<Router>(coordinator, options.max_message_bytes, client_name);
  }
  ~PsCluster() {
    router.reset();
    client.reset();
    stop_all();
  }
  PsCluster(const PsCluster&) = delete;
  PsCluster& operator=(const PsCluster&) = delete;

  std::vector<std::string> ps_labels;
  std::string ps_list;      // the parameter servers' addresses, comma-separated
  std::string coordinator;  // its address
  std::unique_ptr<ClusterCoordinator> client;
  std::unique_ptr<Router> router;
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_BENCH_ROUTER_H_
