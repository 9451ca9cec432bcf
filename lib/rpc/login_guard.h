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
//                and overall; a connection over a cap is closed at accept.
//
// Thread-safety: loop thread only, like the server.
#ifndef CAPSTAN_SDK_SRC_RPC_LOGIN_GUARD_H_
#define CAPSTAN_SDK_SRC_RPC_LOGIN_GUARD_H_

#include <kj/async-io.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "rpc/forwarding_stream.h"

namespace capstan::rpc {

// Counts connections not yet logged in, per peer host and overall.
class LoginCaps {
 public:
  LoginCaps(int per_host, int overall) : per_host_(per_host), overall_(overall) {}
  // Counts one more for `host`; false (and nothing counted) over a cap.
  bool admit(const std::string& host);
  void release(const std::string& host);
  int waiting() const { return total_; }

 private:
  const int per_host_;
  const int overall_;
  int total_ = 0;
  std::map<std::string, int> by_host_;
};

// One connection's login state, shared by its stream and its gate.
class LoginState {
 public:
  // `caps` must outlive the state; `host` was admitted by it.
  LoginState(LoginCaps& caps, std::string host) : caps_(caps), host_(std::move(host)) {}
  ~LoginState() { leave_waiting(); }
  LoginState(const LoginState&) = delete;
  LoginState& operator=(const LoginState&) = delete;

  bool logged_in() const { return logged_in_; }
  void logged_in_now() {
    logged_in_ = true;
    leave_waiting();
  }
  // Leaves the caps' count (at login, close or destruction; once).
  void leave_waiting() {
    if (counted_) caps_.release(host_);
    counted_ = false;
  }

 private:
  LoginCaps& caps_;
  const std::string host_;
  bool logged_in_ = false;
  bool counted_ = true;
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

#endif  // CAPSTAN_SDK_SRC_RPC_LOGIN_GUARD_H_
