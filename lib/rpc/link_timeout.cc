#include "rpc/link_timeout.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <cstdlib>
#include <cstring>

#include "sync/mutex.h"

namespace capstan::rpc {

void set_link_timeout(kj::AsyncIoStream& stream, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return;
  int seconds = static_cast<int>(std::max<int64_t>(1, timeout.count() / 1000));
  int on = 1;
  int idle = std::max(1, seconds / 3);
  int interval = std::max(1, seconds / 6);
  int probes = 3;
  auto user_timeout = static_cast<unsigned>(timeout.count());
  try {
    stream.setsockopt(SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    stream.setsockopt(IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    stream.setsockopt(IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    stream.setsockopt(IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
    stream.setsockopt(IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  } catch (const kj::Exception&) {
    // Not a TCP socket.
  }
}

namespace {

bool is_loopback(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    return (ntohl(in.sin_addr.s_addr) >> 24) == 127;
  }
  if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&in6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6) && in6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

namespace {

Mutex congestion_mutex;
std::optional<std::string> congestion_set GUARDED_BY(congestion_mutex);

}  // namespace

std::string loopback_congestion_control() {
  MutexLock lock(congestion_mutex);
  if (!congestion_set) {
    const char* env = std::getenv("CAPSTAN_LOOPBACK_TCP_CONGESTION");
    std::string name = env == nullptr ? "cubic" : env;
    congestion_set = name == "system" ? "" : name;
  }
  return *congestion_set;
}

Status set_loopback_congestion_control(const std::string& name) {
  bool valid = name == "system" || (!name.empty() && name.size() <= 15);
  for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!valid) {
    return Status::InvalidArgument("loopback_tcp_congestion: '" + name +
                                   "' is not a TCP congestion control name (e.g. cubic, reno, bbr) nor 'system'");
  }
  MutexLock lock(congestion_mutex);
  congestion_set = name == "system" ? "" : name;
  return Status::Ok();
}

bool tune_loopback_socket(int fd) {
  const std::string algorithm = loopback_congestion_control();
  if (algorithm.empty()) return false;
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0 || !is_loopback(local) ||
      !is_loopback(peer)) {
    return false;
  }
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(), static_cast<socklen_t>(algorithm.size())) == 0;
}

void tune_loopback_link(kj::AsyncIoStream& stream) {
  const std::string algorithm = loopback_congestion_control();
  if (algorithm.empty()) return;
  try {
    sockaddr_storage local{}, peer{};
    kj::uint local_length = sizeof(local), peer_length = sizeof(peer);
    stream.getsockname(reinterpret_cast<sockaddr*>(&local), &local_length);
    stream.getpeername(reinterpret_cast<sockaddr*>(&peer), &peer_length);
    if (!is_loopback(local) || !is_loopback(peer)) return;
    stream.setsockopt(IPPROTO_TCP, TCP_CONGESTION, algorithm.data(), static_cast<kj::uint>(algorithm.size()));
  } catch (const kj::Exception&) {
    // Not a TCP socket, or an algorithm the kernel does not allow: the
    // kernel's default stays.
  }
}

}  // namespace capstan::rpc
