#include "rpc/server.h"

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <map>

#include "async/status_exception.h"
#include "capstan_schemas/common.capnp.h"
#include "rpc/counting_stream.h"
#include "rpc/link_timeout.h"
#include "rpc/login_guard.h"
#include "rpc/message_stream.h"

namespace capstan::rpc {
namespace {

// Compares in time independent of where the strings differ.
bool token_matches(const std::string& expected, kj::StringPtr given) {
  unsigned char diff = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % (expected.empty() ? 1 : expected.size())]);
  }
  return diff == 0;
}

std::string peer_name(kj::AsyncIoStream& stream) {
  struct sockaddr_storage addr;
  kj::uint len = sizeof(addr);
  try {
    stream.getpeername(reinterpret_cast<struct sockaddr*>(&addr), &len);
  } catch (const kj::Exception&) {
    return "unknown peer";
  }
  char host[64] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<struct sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<struct sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

class GateImpl : public wire::Gate::Server {
 public:
  GateImpl(const std::optional<std::string>& token, capnp::Capability::Client service,
           std::string peer, RpcObserver* observer, std::shared_ptr<LoginState> login)
      : token_(token),
        service_(kj::mv(service)),
        peer_(std::move(peer)),
        observer_(observer),
        login_(std::move(login)) {}

 protected:
  kj::Promise<void> login(LoginContext context) override {
    auto params = context.getParams();
    if (token_ && !token_matches(*token_, params.getToken())) {
      // Say which: a client that sent nothing is missing its configuration,
      // one that sent something has the wrong one.
      const bool sent = params.getToken().size() > 0;
      const std::string why = sent ? "wrong cluster token" : "no cluster token was sent";
      if (observer_ != nullptr) observer_->on_login_refused(peer_, why);
      async::throw_status(Status::Unauthenticated(
          "login refused: " + why + " from " + peer_ +
          (sent ? " (the client's CAPSTAN_TOKEN or --token-file differs from the daemon's)"
                : "; this daemon requires one: set CAPSTAN_TOKEN or --token-file on the client")));
    }
    login_->logged_in_now();  // the connection's pre-login limits end
    context.getResults().setNode(service_.castAs<wire::Node>());
    return kj::READY_NOW;
  }

 private:
  const std::optional<std::string>& token_;
  capnp::Capability::Client service_;
  const std::string peer_;
  RpcObserver* const observer_;
  const std::shared_ptr<LoginState> login_;
};

// "host" of "host:port" (the last colon: IPv6 hosts have colons).
std::string host_of(const std::string& peer) {
  auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

void CallTracker::add_interface(capnp::InterfaceSchema schema) {
  for (auto method : schema.getMethods()) {
    auto key = std::make_pair(schema.getProto().getId(), method.getOrdinal());
    if (methods_.count(key) != 0) break;  // already registered
    std::string name(schema.getShortDisplayName().cStr());
    name += ".";
    name += method.getProto().getName().cStr();
    add(key, std::move(name));
  }
  for (auto super : schema.getSuperclasses()) add_interface(super);
}

const CallTracker::Method& CallTracker::add(std::pair<uint64_t, uint16_t> key, std::string name) {
  Method method;
  if (observer_ != nullptr) method.stats = observer_->method_stats(name);
  method.name = std::move(name);
  return methods_.emplace(key, std::move(method)).first->second;
}

const CallTracker::Method& CallTracker::method(uint64_t interface_id, uint16_t method_id) {
  auto key = std::make_pair(interface_id, method_id);
  auto it = methods_.find(key);
  if (it != methods_.end()) return it->second;
  return add(key, "unknown." + std::to_string(interface_id) + "." + std::to_string(method_id));
}

void CallTracker::begin(const Method& method) {
  ++in_flight_;
  if (method.stats != nullptr) method.stats->on_call();
}

void CallTracker::end(const Method& method, const kj::Exception* error, Clock::time_point started) {
  --in_flight_;
  if (method.stats != nullptr) {
    if (error != nullptr) method.stats->on_error(async::from_exception(*error));
    method.stats->on_done(std::chrono::duration<double>(Clock::now() - started).count());
  }
  if (in_flight_ == 0) {
    for (auto& waiter : drain_waiters_) waiter->fulfill();
    drain_waiters_.clear();
  }
}

kj::Promise<void> CallTracker::drained() {
  if (in_flight_ == 0) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  drain_waiters_.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

struct RpcServer::Impl final : private kj::TaskSet::ErrorHandler {
  struct Connection {
    Connection(kj::Own<kj::AsyncIoStream> stream, capnp::ReaderOptions reader_options,
               capnp::Capability::Client gate)
        : stream(kj::mv(stream)),
          messages(*this->stream),
          network(messages, capnp::rpc::twoparty::Side::SERVER, reader_options),
          rpc(capnp::makeRpcServer(network, kj::mv(gate))) {}
    kj::Own<kj::AsyncIoStream> stream;
    MessageStream messages;  // large received messages in shareable buffers
    capnp::TwoPartyVatNetwork network;
    capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
    kj::Promise<void> login_deadline = nullptr;  // closes the stream if no login came
  };

  Impl(const RpcServerOptions& options, const PreLoginCaps& caps, kj::Timer& timer, RpcObserver* observer)
      : options(options),
        timer(timer),
        observer(observer),
        tracker(kj::refcounted<CallTracker>(observer)),
        login_caps(caps),
        tasks(*this) {}

  void taskFailed(kj::Exception&& exception) override {
    // A connection or the accept loop failed; the server keeps serving.
    if (observer != nullptr) observer->on_error("accept", async::from_exception(exception));
  }

  kj::Promise<void> accept_loop() {
    // evalNow: KJ may fail the accept synchronously (EMFILE right away).
    return kj::evalNow([this]() { return listener->accept(); })
        .then([this](kj::Own<kj::AsyncIoStream>&& raw) { add_connection(kj::mv(raw)); })
        .then([this]() { return accept_loop(); },
              [this](kj::Exception&& e) -> kj::Promise<void> {
                // Out of file descriptors (EMFILE) or another failure to
                // take a connection: the loop must not end, or the port
                // stays dead after the flood that caused it is gone. Try
                // again shortly; waiting connections stay in the backlog.
                if (observer != nullptr) observer->on_error("accept", async::from_exception(e));
                return timer.afterDelay(50 * kj::MILLISECONDS).then([this]() { return accept_loop(); });
              });
  }

  void add_connection(kj::Own<kj::AsyncIoStream> raw) {
    std::string peer = peer_name(*raw);
    std::string host = host_of(peer);
    const LoginCaps::Admission admission = login_caps.admit(host);
    if (admission.evicted) {
      // At a cap: the connection that has waited longest goes, now (its
      // descriptor closes before this returns), so a flood holds at most the
      // caps' descriptors and a newcomer with the token still gets in.
      close_waiting(*admission.evicted);
      if (observer != nullptr) {
        const PreLoginCaps& caps = login_caps.caps();
        observer->on_error("accept", Status::ResourceExhausted(
                                         "closed the connection that waited longest to log in, to admit " + peer +
                                         ": " + std::to_string(login_caps.waiting() - 1) +
                                         " connections are waiting (caps " + std::to_string(caps.overall) + ", " +
                                         std::to_string(caps.per_host) +
                                         " per host; raise max_pre_login_connections, max_pre_login_per_host "
                                         "or the open-file limit, ulimit -n)"));
      }
    }
    const uint64_t id = admission.ticket;
    auto login = std::make_shared<LoginState>(login_caps, id);
    set_link_timeout(*raw, options.link_timeout);
    tune_loopback_link(*raw);
    if (options.tls) {
      // The handshake first, within the login deadline; a client that fails
      // it (no TLS, a certificate from another CA) is dropped.
      auto deadline = options.login_deadline.count() * kj::MILLISECONDS;
      // Held in `handshakes` so that an eviction can end it (and close its
      // descriptor) at once; the entry goes after it ends, from a later turn
      // of the loop, as a promise cannot destroy itself.
      handshakes.emplace(id, timer.timeoutAfter(deadline, options.tls->wrap_server(kj::mv(raw)))
                                 .then([this, id, login, peer](kj::Own<kj::AsyncIoStream>&& secured) {
                                   serve(id, kj::mv(secured), login, peer);
                                 },
                                 [this, peer](kj::Exception&& e) {
                                   if (observer != nullptr) {
                                     observer->on_error("accept", async::from_exception(e).with_context(
                                                                      "TLS handshake with " + peer));
                                   }
                                 })
                                 .then([this, id]() {
                                   tasks.add(kj::evalLater([this, id]() { handshakes.erase(id); }));
                                 })
                                 .eagerlyEvaluate(nullptr));
      return;
    }
    serve(id, kj::mv(raw), login, peer);
  }

  // Closes connection `id` (waiting to log in, or in its TLS handshake) now:
  // its descriptor is closed when this returns. Never called from within that
  // connection's own promises.
  void close_waiting(uint64_t id) {
    handshakes.erase(id);
    connections.erase(id);
  }

  // Serves one connection (its TLS handshake done) behind the gate.
  void serve(uint64_t id, kj::Own<kj::AsyncIoStream> raw, std::shared_ptr<LoginState> login,
             const std::string& peer) {
    auto guarded = kj::heap<PreLoginStream>(kj::mv(raw), login, options.pre_login_bytes);
    PreLoginStream* guard = guarded.get();
    RpcObserver* obs = observer;
    auto stream = kj::heap<CountingStream>(
        kj::mv(guarded),
        [obs](size_t n) {
          if (obs != nullptr) obs->on_bytes_received(n);
        },
        [obs](size_t n) {
          if (obs != nullptr) obs->on_bytes_sent(n);
        });
    capnp::ReaderOptions reader_options = reader_options_for(options.max_message_bytes);
    capnp::Capability::Client gate =
        kj::heap<Instrumented<GateImpl>>(*tracker, options.token, service, peer, observer, login);
    auto it = connections.try_emplace(id, kj::mv(stream), reader_options, kj::mv(gate)).first;
    // The stream (and `guard` in it) lives as long as the connection, which
    // owns this promise.
    it->second.login_deadline = timer.afterDelay(options.login_deadline.count() * kj::MILLISECONDS)
                                    .then([guard, login]() {
                                      if (!login->logged_in()) guard->close();
                                    })
                                    .eagerlyEvaluate(nullptr);
    if (observer != nullptr) observer->on_connection(peer, true);
    // By id, not iterator: an evicted connection is erased first (its end
    // still resolves this, when its RPC system goes: fulfilled, or rejected
    // as its fulfiller is destroyed).
    auto ended = [this, id, peer]() {
      if (observer != nullptr) observer->on_connection(peer, false);
      connections.erase(id);
    };
    tasks.add(it->second.network.onDisconnect().then([ended]() { ended(); }, [ended](kj::Exception&&) { ended(); }));
  }

  // Resolves once no connection has outgoing messages queued.
  kj::Promise<void> flush_writes() {
    return kj::evalLast([this]() -> kj::Promise<void> {
      for (auto& [id, connection] : connections) {
        if (connection.network.getCurrentQueueCount() > 0) {
          return timer.afterDelay(5 * kj::MILLISECONDS).then([this]() { return flush_writes(); });
        }
      }
      return kj::READY_NOW;
    });
  }

  const RpcServerOptions& options;
  kj::Timer& timer;
  RpcObserver* const observer;
  kj::Own<CallTracker> tracker;
  LoginCaps login_caps;
  capnp::Capability::Client service = nullptr;
  kj::Own<kj::ConnectionReceiver> listener;
  kj::Promise<void> accepting = nullptr;
  // By connection id (its LoginCaps ticket); nodes never move.
  std::map<uint64_t, kj::Promise<void>> handshakes;  // TLS handshakes under way
  std::map<uint64_t, Connection> connections;
  kj::TaskSet tasks;
};

RpcServer::RpcServer(RpcServerOptions options, RpcObserver* observer)
    : options_(std::move(options)),
      pre_login_caps_(
          derive_pre_login_caps(open_file_limit(), options_.max_pre_login, options_.max_pre_login_per_host)),
      observer_(observer),
      loop_(options_.name) {}

RpcServer::~RpcServer() { stop(std::chrono::milliseconds(0)); }

Result<uint16_t> RpcServer::start(ServiceFactory factory, StartFailure* failure,
                                  const std::function<void(uint16_t)>& on_listening) {
  StartFailure ignored;
  if (failure == nullptr) failure = &ignored;
  *failure = StartFailure::kNone;
  std::string where = options_.host + ":" + std::to_string(options_.port);
  try {
    Status service_error;
    auto port = loop_.run_sync([this, &factory, &on_listening, &service_error]() -> kj::Promise<uint16_t> {
      impl_ = kj::heap<Impl>(options_, pre_login_caps_, loop_.timer(), observer_);
      return loop_.io()
          .getNetwork()
          .parseAddress(kj::StringPtr(options_.host.c_str()), options_.port)
          .then([this, &factory, &on_listening, &service_error](kj::Own<kj::NetworkAddress>&& address) {
            impl_->listener = address->listen();
            const auto port = static_cast<uint16_t>(impl_->listener->getPort());
            // The port is known before the service exists, so a service
            // that announces this server's address at once (a worker
            // registering with the coordinator) never finds it unset.
            if (on_listening) on_listening(port);
            // A service that cannot start (e.g. a damaged journal) is a
            // startup error of its own, not a listening error.
            try {
              impl_->service = factory(*impl_->tracker);
            } catch (const kj::Exception& e) {
              service_error = async::from_exception(e);
              return uint16_t{0};
            } catch (const std::exception& e) {
              service_error = Status::Internal(e.what());
              return uint16_t{0};
            }
            impl_->accepting = impl_->accept_loop().eagerlyEvaluate([this](kj::Exception&& e) {
              if (observer_ != nullptr) observer_->on_error("accept", async::from_exception(e));
            });
            return port;
          });
    });
    if (!service_error.ok()) {
      loop_.run_sync([this]() { impl_ = nullptr; });
      *failure = StartFailure::kService;
      return Status(service_error.code(), "starting the service: " + service_error.message());
    }
    return port;
  } catch (const kj::Exception& e) {
    // KJ reports the OS error of listen() only as text ("bind(...): Address
    // already in use"); this is the one place that reads it.
    std::string reason(e.getDescription().cStr());
    *failure = StartFailure::kAddress;
    if (reason.find("EADDRINUSE") != std::string::npos || reason.find("in use") != std::string::npos) {
      reason = "address already in use";
      *failure = StartFailure::kAddressInUse;
    }
    loop_.run_sync([this]() { impl_ = nullptr; });
    return Status::Unavailable(where + ": " + reason);
  }
}

void RpcServer::stop(std::chrono::milliseconds grace, boost::asio::thread_pool* pool,
                     const std::function<void()>& before_release) {
  if (impl_.get() == nullptr) return;
  try {
    loop_.run_sync([this, grace]() -> kj::Promise<void> {
      // Stop accepting; let calls in flight finish (bounded by grace).
      impl_->accepting = nullptr;
      impl_->listener = nullptr;
      // A finished call's reply is queued after its promise resolves, so
      // wait for the replies to be written as well.
      auto drained = impl_->tracker->drained().then([this]() { return impl_->flush_writes(); });
      return loop_.timer().afterDelay(grace.count() * kj::MILLISECONDS).exclusiveJoin(kj::mv(drained));
    });
  } catch (const kj::Exception&) {
    // The loop already ended; nothing left to drain.
  }
  // Pool work still running (a closure longer than the grace period) holds
  // references into the service: it finishes before the service goes. The
  // loop keeps running meanwhile, so that work can still reach it.
  if (pool != nullptr) {
    pool->stop();
    pool->join();
  }
  try {
    loop_.run_sync([this, &before_release]() {
      if (before_release) before_release();
      impl_ = nullptr;
    });
  } catch (const kj::Exception&) {
  }
  loop_.stop();
}

}  // namespace capstan::rpc
