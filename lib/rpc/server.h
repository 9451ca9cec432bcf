// RpcServer: serves one daemon's Cap'n Proto interface on a TCP port.
//
// Glossary:
//   gate      the bootstrap capability of each connection; login(token)
//             returns the service when the cluster token matches.
//   service   the role's interface (ParameterServer, Worker, ...), created
//             once on the loop thread by the factory passed to start().
//   observer  receives per-method call/error counts and byte counts, which
//             the daemons turn into /metrics.
//
// Example:
//   RpcServer server(options, &observer);
//   auto port = server.start([&](CallTracker& tracker) -> capnp::Capability::Client {
//     return kj::heap<Instrumented<MyService>>(tracker, ...);
//   });
//   ...
//   server.stop(std::chrono::seconds(8));  // drain in-flight calls, disconnect
//
// The KJ loop runs on the server's own LoopThread; service objects live
// there. Heavy work belongs on a thread pool (see pool.h).
//
// Thread-safety: start() and stop() from one controlling thread.
#ifndef CAPSTAN_SDK_SRC_RPC_SERVER_H_
#define CAPSTAN_SDK_SRC_RPC_SERVER_H_

#include <capnp/capability.h>
#include <capnp/schema.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "capstan/status.h"
#include "rpc/errors.h"
#include "rpc/loop_thread.h"

namespace capstan::rpc {

// Callbacks from the loop thread; implementations must be thread-safe and
// must not block.
class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  virtual void on_call(const std::string& method) {}
  virtual void on_error(const std::string& method, const Status& status) {}
  virtual void on_bytes_received(size_t bytes) {}
  virtual void on_bytes_sent(size_t bytes) {}
  virtual void on_connection(const std::string& peer, bool opened) {}
  virtual void on_login_refused(const std::string& peer) {}
};

// Counts calls in flight (so stop() can drain them) and reports per-method
// statistics to the observer. Owned by RpcServer; used on its loop thread.
class CallTracker {
 public:
  explicit CallTracker(RpcObserver* observer) : observer_(observer) {}

  // Registers the method names of interface `Schema` and its superclasses.
  void add_interface(capnp::InterfaceSchema schema);
  const std::string& method_name(uint64_t interface_id, uint16_t method_id);

  void begin(const std::string& method);
  void end(const std::string& method, const kj::Exception* error);
  int in_flight() const { return in_flight_; }
  // Resolves when no call is in flight.
  kj::Promise<void> drained();

 private:
  RpcObserver* const observer_;  // may be null
  std::map<std::pair<uint64_t, uint16_t>, std::string> names_;
  int in_flight_ = 0;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> drain_waiters_;
};

// Wraps a generated Server class so every call is counted by the tracker.
// Use: kj::heap<Instrumented<MyServiceImpl>>(tracker, args...).
template <typename ServiceImpl>
class Instrumented final : public ServiceImpl {
 public:
  template <typename... Args>
  explicit Instrumented(CallTracker& tracker, Args&&... args)
      : ServiceImpl(std::forward<Args>(args)...), tracker_(tracker) {
    tracker_.add_interface(capnp::Schema::from<typename ServiceImpl::Serves>());
  }

  capnp::Capability::Server::DispatchCallResult dispatchCall(
      uint64_t interface_id, uint16_t method_id,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) override {
    const std::string& method = tracker_.method_name(interface_id, method_id);
    tracker_.begin(method);
    try {
      auto result = ServiceImpl::dispatchCall(interface_id, method_id, context);
      CallTracker* tracker = &tracker_;
      const std::string* name = &method;
      result.promise = result.promise.then(
          [tracker, name]() { tracker->end(*name, nullptr); },
          [tracker, name](kj::Exception&& e) {
            tracker->end(*name, &e);
            kj::throwFatalException(kj::mv(e));
          });
      return result;
    } catch (const kj::Exception& e) {
      tracker_.end(method, &e);
      throw;
    }
  }

 private:
  CallTracker& tracker_;
};

struct RpcServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 picks a free port
  // The cluster token; nullopt leaves the cluster open.
  std::optional<std::string> token;
  // Reader traversal limit for incoming messages.
  uint64_t max_message_bytes = 64ull << 20;
  std::string name = "rpc";  // loop thread name
};

class RpcServer {
 public:
  using ServiceFactory = std::function<capnp::Capability::Client(CallTracker&)>;

  RpcServer(RpcServerOptions options, RpcObserver* observer);
  ~RpcServer();  // stop(0)

  // Creates the service on the loop thread and starts listening. Returns the
  // bound port, or an error naming host:port (e.g. address in use).
  Result<uint16_t> start(ServiceFactory factory);

  // Stops accepting connections, waits up to `grace` for calls in flight to
  // finish, then disconnects everyone and destroys the service. Idempotent.
  void stop(std::chrono::milliseconds grace);

  LoopThread& loop() { return loop_; }

 private:
  struct Impl;  // lives on the loop thread

  const RpcServerOptions options_;
  RpcObserver* const observer_;
  LoopThread loop_;
  kj::Own<Impl> impl_;  // created and destroyed on the loop thread
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_SERVER_H_
