// Connection: a client's link to one daemon, used on a KJ loop thread.
//
// It connects and logs in on first use, retrying with exponential backoff
// while the daemon is unreachable (a peer that is not up yet, or restarting),
// and connects again after the link breaks. A refused login (wrong token)
// is final and not retried.
//
// Example (on the loop thread):
//   Connection conn(io, timer, "127.0.0.1:7000", options);
//   conn.node(deadline).then([](wire::Node::Client node) { ... });
//
// Thread-safety: not thread-safe; lives on one loop thread.
#ifndef CAPSTAN_LIB_RPC_CONNECTION_H_
#define CAPSTAN_LIB_RPC_CONNECTION_H_

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/timer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "capstan/status.h"
#include "capstan_schemas/common.capnp.h"
#include "async/status_exception.h"
#include "rpc/tls.h"

namespace capstan::rpc {

struct ConnectOptions {
  std::string token;        // "" for an open cluster
  std::string client_name;  // shown in the daemon's logs
  // Largest payload of an incoming message (reader traversal limit, plus
  // kMessageFramingBytes; see rpc/message_stream.h).
  uint64_t max_message_bytes = 64ull << 20;
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  // Longest a single connect-and-login attempt may take.
  std::chrono::milliseconds attempt_timeout{10000};
  // A link whose peer stops acknowledging for this long breaks (see
  // rpc/link_timeout.h); 0 leaves TCP's own (many minutes).
  std::chrono::milliseconds link_timeout{10000};
  // TLS to the daemon (rpc/tls.h); null: from CAPSTAN_TLS_CA etc. when set,
  // else plain TCP.
  std::shared_ptr<Tls> tls;
};

class Connection {
 public:
  // Called after each failed attempt with the error and the delay before the
  // next one (for "waiting for coordinator at ..." log lines).
  using RetryLogger = std::function<void(const Status& error, std::chrono::milliseconds delay, int attempt)>;

  Connection(kj::AsyncIoProvider& io, kj::Timer& timer, std::string address,
             ConnectOptions options);
  ~Connection();

  const std::string& address() const { return address_; }
  void set_retry_logger(RetryLogger logger) { retry_logger_ = std::move(logger); }

  // The logged-in service, connecting (and retrying) until `deadline` when
  // there is no live link. Rejects with Unavailable/DeadlineExceeded when the
  // daemon stays unreachable, Unauthenticated when the token is refused.
  kj::Promise<wire::Node::Client> node(kj::TimePoint deadline);
  template <typename Interface>
  kj::Promise<typename Interface::Client> service(kj::TimePoint deadline) {
    return node(deadline).then(
        [](wire::Node::Client node) { return node.castAs<Interface>(); });
  }

  bool connected() const { return link_.get() != nullptr; }
  // Resolves when the current link breaks (immediately when there is none).
  kj::Promise<void> on_disconnect();
  // Drops the link; the next node() connects again.
  void reset();

 private:
  struct Link;

  kj::Promise<wire::Node::Client> attempt(kj::TimePoint deadline, int attempt_number,
                                          std::chrono::milliseconds backoff);
  kj::Promise<wire::Node::Client> connect_once();

  kj::AsyncIoProvider& io_;
  kj::Timer& timer_;
  const std::string address_;
  Status tls_error_;  // CAPSTAN_TLS_* set but unusable: every attempt fails with it
  const ConnectOptions options_;
  RetryLogger retry_logger_;
  kj::Own<Link> link_;
  // Shares one connection attempt among concurrent callers.
  kj::Maybe<kj::ForkedPromise<wire::Node::Client>> pending_;
  std::shared_ptr<bool> pending_settled_;  // pending_ has resolved or failed
  // Watches the live link and forgets it when it breaks.
  kj::Promise<void> watch_ = nullptr;
};

// Rejects with DeadlineExceeded ("<what> did not finish within N ms") when
// `promise` takes longer than `timeout`.
template <typename T>
kj::Promise<T> with_deadline(kj::Timer& timer, kj::Promise<T> promise,
                             std::chrono::milliseconds timeout, std::string what) {
  return promise.exclusiveJoin(
      timer.afterDelay(timeout.count() * kj::MILLISECONDS)
          .then([what = std::move(what), timeout]() -> kj::Promise<T> {
            return async::to_exception(Status::DeadlineExceeded(
                what + " did not finish within " + std::to_string(timeout.count()) + " ms"));
          }));
}

// Splits "host:port" ("[v6]:port" too). Returns InvalidArgument naming the
// address when it has no valid port.
Status parse_host_port(const std::string& address, std::string* host, uint16_t* port);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_CONNECTION_H_
