// A VariableRouter of a bench's own (the client side of what a worker
// does), with placements fetched from the coordinator as ClusterCoordinator
// does. Shared by ps_bench and embedding_bench.
#ifndef CAPSTAN_BENCH_BENCH_ROUTER_H_
#define CAPSTAN_BENCH_BENCH_ROUTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_BENCH_ROUTER_H_
