#include "rpc/login_guard.h"

#include <sys/resource.h>

#include <algorithm>

namespace capstan::rpc {

PreLoginCaps derive_pre_login_caps(uint64_t fd_limit, int configured_overall, int configured_per_host) {
  PreLoginCaps caps;
  caps.overall = std::max(configured_overall, 1);
  caps.per_host = std::clamp(configured_per_host, 1, caps.overall);
  // RLIM_INFINITY, or a limit so high no cap of an int could reach it.
  if (fd_limit == 0 || fd_limit >= (uint64_t{1} << 40)) return caps;
  caps.fd_limit = fd_limit;
  const uint64_t reserve = std::max(kMinReservedDescriptors, fd_limit / 4);
  const uint64_t overall = std::max<uint64_t>((fd_limit > reserve ? fd_limit - reserve : 0) / 2, 1);
  const uint64_t per_host = std::max<uint64_t>(overall / 2, 1);
  if (overall < static_cast<uint64_t>(caps.overall)) {
    caps.overall = static_cast<int>(overall);
    caps.lowered = true;
  }
  if (per_host < static_cast<uint64_t>(caps.per_host)) {
    caps.per_host = static_cast<int>(per_host);
    caps.lowered = true;
  }
  caps.per_host = std::min(caps.per_host, caps.overall);
  return caps;
}

uint64_t open_file_limit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<uint64_t>(limit.rlim_cur);
}

LoginCaps::Admission LoginCaps::admit(const std::string& host) {
  Admission admission;
  admission.ticket = next_++;
  auto mine = by_host_.find(host);
  if (mine != by_host_.end() && static_cast<int>(mine->second.size()) >= caps_.per_host) {
    admission.evicted = *mine->second.begin();
  } else if (waiting() >= caps_.overall) {
    admission.evicted = waiting_.begin()->first;
  }
  if (admission.evicted) release(*admission.evicted);
  waiting_.emplace(admission.ticket, host);
  by_host_[host].insert(admission.ticket);
  return admission;
}

void LoginCaps::release(Ticket ticket) {
  auto it = waiting_.find(ticket);
  if (it == waiting_.end()) return;
  auto host = by_host_.find(it->second);
  host->second.erase(ticket);
  if (host->second.empty()) by_host_.erase(host);
  waiting_.erase(it);
}

int LoginCaps::waiting_from(const std::string& host) const {
  auto it = by_host_.find(host);
  return it == by_host_.end() ? 0 : static_cast<int>(it->second.size());
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
