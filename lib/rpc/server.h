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
// The KJ loop runs on the server's own async::LoopThread; service objects live
// there. Heavy work belongs on a thread pool (see pool.h).
//
// Thread-safety: start() and stop() from one controlling thread.
#ifndef CAPSTAN_LIB_RPC_SERVER_H_
#define CAPSTAN_LIB_RPC_SERVER_H_

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
#include "capstan/trace.h"
#include <boost/asio/thread_pool.hpp>

#include "rpc/errors.h"
#include "rpc/login_guard.h"
#include "async/loop_thread.h"
#include "rpc/tls.h"

namespace capstan::rpc {

// Callbacks from the loop thread; implementations must be thread-safe and
// must not block.
class RpcObserver {
 public:
  // One method's statistics. Made once per method, when a service that has
  // it is registered (or when an unknown method is first called), so a call
  // updates its counters without looking anything up. Loop thread only.
  class MethodStats {
   public:
    virtual ~MethodStats() = default;
    virtual void on_call() {}
    virtual void on_error(const Status& status) {}
    // When the call's answer (or error) is ready, `seconds` after it came.
    virtual void on_done(double seconds) {}
  };

  virtual ~RpcObserver() = default;
  // Null: the method is not observed.
  virtual std::unique_ptr<MethodStats> method_stats(const std::string& method) { return nullptr; }
  // A failure that belongs to no method (the accept loop, a connection).
  virtual void on_error(const std::string& what, const Status& status) {}
  virtual void on_bytes_received(size_t bytes) {}
  virtual void on_bytes_sent(size_t bytes) {}
  virtual void on_connection(const std::string& peer, bool opened) {}
  // `why`: "no cluster token was sent" or "wrong cluster token".
  virtual void on_login_refused(const std::string& peer, const std::string& why) {}
};

// Counts calls in flight (so stop() can drain them) and reports per-method
// statistics to the observer. Owned by RpcServer; used on its loop thread.
//
// Refcounted (kj::refcounted, loop thread only): a call's completion holds a
// reference, because it can run after the server has released everything
// else (pool work that outlived stop()'s grace period; ASan found it).
class CallTracker final : public kj::Refcounted {
 public:
  explicit CallTracker(RpcObserver* observer) : observer_(observer) {}

  struct Method {
    std::string name;  // "Interface.method"
    std::unique_ptr<RpcObserver::MethodStats> stats;  // may be null
  };

  // Registers the methods of interface `Schema` and its superclasses.
  void add_interface(capnp::InterfaceSchema schema);
  // The method; stays valid as long as the tracker.
  const Method& method(uint64_t interface_id, uint16_t method_id);

  using Clock = std::chrono::steady_clock;
  void begin(const Method& method);
  // `started`: when begin() was called for this call.
  void end(const Method& method, const kj::Exception* error, Clock::time_point started);
  int in_flight() const { return in_flight_; }
  // Resolves when no call is in flight.
  kj::Promise<void> drained();

 private:
  RpcObserver* const observer_;  // may be null
  const Method& add(std::pair<uint64_t, uint16_t> key, std::string name);

  std::map<std::pair<uint64_t, uint16_t>, Method> methods_;  // nodes never move
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
    const CallTracker::Method& method = tracker_.method(interface_id, method_id);
    const auto started = CallTracker::Clock::now();
    tracker_.begin(method);
    // The call in the flight recorder (and a trace): it overlaps the loop's
    // other calls.
    auto span = kj::heap<trace::Span>(trace::Kind::kRpc, method.name);
    span->set_async();
    try {
      auto result = ServiceImpl::dispatchCall(interface_id, method_id, context);
      CallTracker* tracker = &tracker_;
      const CallTracker::Method* called = &method;
      trace::Span* call = span.get();
      result.promise = result.promise
                           .then([tracker, called, started, call]() {
                                   call->finish();
                                   tracker->end(*called, nullptr, started);
                                 },
                                 [tracker, called, started, call](kj::Exception&& e) {
                                   call->fail(e.getDescription().cStr());
                                   call->finish();
                                   tracker->end(*called, &e, started);
                                   kj::throwFatalException(kj::mv(e));
                                 })
                           .attach(kj::addRef(tracker_), kj::mv(span));
      return result;
    } catch (const kj::Exception& e) {
      span->fail(e.getDescription().cStr());
      tracker_.end(method, &e, started);
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
  // Largest payload of an incoming message (reader traversal limit, plus
  // rpc::kMessageFramingBytes; see rpc/message_stream.h).
  uint64_t max_message_bytes = 64ull << 20;
  // Before a connection logs in (rpc/login_guard.h): the bytes it may send,
  // how long it may take, and how many such connections there may be per
  // peer host and overall (lowered to fit the open-file limit: see
  // derive_pre_login_caps; pre_login_caps() says what was used).
  size_t pre_login_bytes = 64 << 10;
  std::chrono::milliseconds login_deadline{10000};
  int max_pre_login_per_host = 256;
  int max_pre_login = 1024;
  // Accepted links whose peer stops acknowledging for this long break
  // (rpc/link_timeout.h); 0 leaves TCP's own.
  std::chrono::milliseconds link_timeout{10000};
  // Serve TLS only (rpc/tls.h); null: plain TCP.
  std::shared_ptr<Tls> tls;
  std::string name = "rpc";  // loop thread name
};

class RpcServer {
 public:
  using ServiceFactory = std::function<capnp::Capability::Client(CallTracker&)>;

  RpcServer(RpcServerOptions options, RpcObserver* observer);
  ~RpcServer();  // stop(0)

  // Why start() failed, for a caller that reacts differently to each.
  enum class StartFailure {
    kNone,
    kService,       // the factory failed (e.g. a damaged journal)
    kAddressInUse,  // host:port is taken
    kAddress,       // host:port cannot be listened on for another reason
  };

  // Listens, calls `on_listening` (when given) with the bound port, then
  // creates the service on the loop thread and accepts connections. Returns
  // the bound port, or an error naming host:port (e.g. address in use);
  // sets `*failure` (when given) to the kind of failure. A service that
  // fails to start closes the port again.
  Result<uint16_t> start(ServiceFactory factory, StartFailure* failure = nullptr,
                         const std::function<void(uint16_t)>& on_listening = {});

  // Stops accepting connections, waits up to `grace` for calls in flight to
  // finish, then disconnects everyone and destroys the service. Idempotent.
  //
  // `pool`: the thread pool the service posts work to (run_on_pool). Work
  // already running there is waited for, however long it takes, before the
  // service it references is destroyed; work still queued is dropped.
  // Pass null when the service posts to no pool that outlives it.
  //
  // `before_release` runs on the loop thread after that, just before the
  // service is released: a service whose outgoing connection holds a
  // capability to itself (a worker registered with its coordinator) closes
  // that connection there, or the cycle keeps it alive past the end.
  void stop(std::chrono::milliseconds grace, boost::asio::thread_pool* pool = nullptr,
            const std::function<void()>& before_release = {});

  async::LoopThread& loop() { return loop_; }

  // The caps on connections waiting to log in: the options' values, lowered
  // to fit the open-file limit at construction.
  const PreLoginCaps& pre_login_caps() const { return pre_login_caps_; }

 private:
  struct Impl;  // lives on the loop thread

  const RpcServerOptions options_;
  const PreLoginCaps pre_login_caps_;
  RpcObserver* const observer_;
  async::LoopThread loop_;
  kj::Own<Impl> impl_;  // created and destroyed on the loop thread
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_SERVER_H_
