// Limits on a connection before it logs in (issue 12): a stranger who can
// reach a daemon's port, without the cluster token, must not be able to make
// it allocate, hold descriptors for long, or stop accepting.
//
//   byte budget  until login a connection may send only `pre_login_bytes`
//                (the Bootstrap message and the login call are a few hundred
//                bytes); the read that would pass it fails, which closes the
//                connection before a large message is buffered;
//   deadline     a connection that has not logged in within `login_deadline`
//                is closed;
//   caps         connections not yet logged in are bounded per peer address
//                and overall, within the open-file limit; at a cap the oldest
//                waiting connection is closed to admit the new one.
//
// Thread-safety: loop thread only, like the server.
#ifndef CAPSTAN_LIB_RPC_LOGIN_GUARD_H_
#define CAPSTAN_LIB_RPC_LOGIN_GUARD_H_

#include <kj/async-io.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "rpc/forwarding_stream.h"

namespace capstan::rpc {

// The caps on connections not yet logged in. Each waiting connection holds a
// descriptor, so the caps come from the process's open-file limit as well as
// from the configuration: a flood of strangers must leave descriptors for the
// authenticated peers, the files and the HTTP port (issue 37).
//
//   reserve     max(kMinReservedDescriptors, limit / 4) descriptors are never
//               counted on;
//   overall     at most half of what is left, and at most the configured
//               max_pre_login_connections;
//   per host    at most half of that (so one host cannot take every slot),
//               and at most the configured max_pre_login_per_host.
//
// E.g. `ulimit -n 64`: 16 waiting connections, 8 per host; 1024: 384 and 192;
// 65536 and above: the configured 1024 and 256.
struct PreLoginCaps {
  int overall = 0;
  int per_host = 0;
  uint64_t fd_limit = 0;  // the soft limit they came from; 0: unlimited
  bool lowered = false;   // the limit made them lower than configured
};
constexpr uint64_t kMinReservedDescriptors = 32;

// `fd_limit`: the soft RLIMIT_NOFILE; 0 (or RLIM_INFINITY) means unlimited.
// `configured_*` are at least 1 (daemon.cc checks them). Each cap is at least
// 1, so a daemon under a tiny limit still lets a client in.
PreLoginCaps derive_pre_login_caps(uint64_t fd_limit, int configured_overall, int configured_per_host);

// The soft RLIMIT_NOFILE of this process; 0 when unlimited or unknown.
uint64_t open_file_limit();

// Counts connections not yet logged in, per peer host and overall. At a cap a
// new connection is still admitted and the oldest waiting one is evicted
// instead: a client with the token gets in during a flood of idle strangers
// (it logs in within a round trip, long before it is the oldest), while the
// flood still holds at most the caps' descriptors.
class LoginCaps {
 public:
  using Ticket = uint64_t;  // one waiting connection; never reused
  struct Admission {
    Ticket ticket = 0;
    // A waiting connection that no longer counts: the caller closes it now.
    std::optional<Ticket> evicted;
  };

  explicit LoginCaps(PreLoginCaps caps) : caps_(caps) {}
  const PreLoginCaps& caps() const { return caps_; }

  // Counts a new connection from `host`. When that reaches a cap, the oldest
  // waiting connection from `host` (its own cap reached) or else the oldest
  // overall is evicted.
  Admission admit(const std::string& host);
  // Stops counting `ticket`; nothing when it was evicted or released before.
  void release(Ticket ticket);
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int waiting_from(const std::string& host) const;

 private:
  const PreLoginCaps caps_;
  Ticket next_ = 1;
  std::map<Ticket, std::string> waiting_;  // ticket -> host; oldest first
  std::map<std::string, std::set<Ticket>> by_host_;  // oldest first
};

// One connection's login state, shared by its stream and its gate.
class LoginState {
 public:
  // `caps` must outlive the state; `ticket` was admitted by it.
  LoginState(LoginCaps& caps, LoginCaps::Ticket ticket) : caps_(caps), ticket_(ticket) {}
  ~LoginState() { leave_waiting(); }
  LoginState(const LoginState&) = delete;
  LoginState& operator=(const LoginState&) = delete;

  bool logged_in() const { return logged_in_; }
  void logged_in_now() {
    logged_in_ = true;
    leave_waiting();
  }
  // Leaves the caps' count (at login, close or destruction).
  void leave_waiting() { caps_.release(ticket_); }

 private:
  LoginCaps& caps_;
  const LoginCaps::Ticket ticket_;
  bool logged_in_ = false;
};

// Forwards to a stream and, until its connection logs in, lets through at
// most `budget` bytes; close() ends the connection (the login deadline).
class PreLoginStream final : public ForwardingStream {
 public:
  PreLoginStream(kj::Own<kj::AsyncIoStream> inner, std::shared_ptr<LoginState> state, size_t budget)
      : ForwardingStream(kj::mv(inner)), state_(std::move(state)), budget_(budget) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;

  // Ends a connection that did not log in in time: reads see the end of the
  // stream from now on, so the RPC system disconnects.
  void close();

 private:
  const std::shared_ptr<LoginState> state_;
  const size_t budget_;
  size_t read_ = 0;  // bytes read before login
  bool closed_ = false;
};

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_LOGIN_GUARD_H_
