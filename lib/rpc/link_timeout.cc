#include "rpc/link_timeout.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

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

}  // namespace capstan::rpc
