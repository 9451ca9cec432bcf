#include "rpc/login_guard.h"

#include <algorithm>

namespace capstan::rpc {

bool LoginCaps::admit(const std::string& host) {
  int& mine = by_host_[host];
  if (mine >= per_host_ || total_ >= overall_) {
    if (mine == 0) by_host_.erase(host);
    return false;
  }
  ++mine;
  ++total_;
  return true;
}

void LoginCaps::release(const std::string& host) {
  auto it = by_host_.find(host);
  if (it == by_host_.end()) return;
  --total_;
  if (--it->second == 0) by_host_.erase(it);
}

kj::Promise<size_t> PreLoginStream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  if (closed_) return size_t{0};
  if (state_->logged_in()) return inner().tryRead(buffer, min_bytes, max_bytes);
  if (read_ >= budget_) {
    // More than a login before logging in: end the connection here, before
    // the message is read (and its buffer filled).
    close();
    return size_t{0};
  }
  size_t allowed = std::min(max_bytes, budget_ - read_);
  return inner().tryRead(buffer, std::min(min_bytes, allowed), allowed).then([this](size_t n) {
    if (!state_->logged_in()) read_ += n;
    return n;
  });
}

void PreLoginStream::close() {
  if (closed_) return;
  closed_ = true;
  state_->leave_waiting();
  try {
    inner().shutdownWrite();
  } catch (const kj::Exception&) {
    // Already gone.
  }
  try {
    inner().abortRead();
  } catch (const kj::Exception&) {
  }
}

}  // namespace capstan::rpc
