// Raw Cap'n Proto calls to a daemon, for tests that send what the SDK never
// would (bad requests, calls past the limits).
#ifndef CAPSTAN_TESTS_INTEGRATION_RAW_RPC_H_
#define CAPSTAN_TESTS_INTEGRATION_RAW_RPC_H_

#include <string>

#include "capstan/status.h"
#include "capstan_schemas/common.capnp.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "async/loop_thread.h"

namespace capstan::testing {

// Connects to the node at `address` from `loop`, runs `call(node)` (which
// returns a kj::Promise<void>) and returns the status it ends with.
template <typename Call>
Status raw_call(async::LoopThread& loop, const std::string& address, Call call) {
  return loop.run_sync([&]() -> kj::Promise<Status> {
    auto conn = kj::heap<rpc::Connection>(loop.io(), loop.timer(), address, rpc::ConnectOptions{});
    auto deadline = loop.timer().now() + 10 * kj::SECONDS;
    return conn->node(deadline)
        .then([call](wire::Node::Client node) { return call(node); })
        .then([]() { return Status::Ok(); }, [](kj::Exception&& e) { return async::from_exception(e); })
        .attach(kj::mv(conn));
  });
}

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_INTEGRATION_RAW_RPC_H_
