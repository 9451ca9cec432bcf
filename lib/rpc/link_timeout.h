// Dead-link detection for RPC sockets: without it a peer behind a network
// partition (no RST, packets vanish) looks alive until TCP gives up, which
// takes many minutes, and calls to it wait for their own timeouts.
//
// set_link_timeout(stream, t): TCP keepalive probes an idle link (first
// after t/3, then every t/6, gone after 3 unanswered) and TCP_USER_TIMEOUT
// ends a link whose sent data stays unacknowledged for t. Either way the
// connection breaks, calls on it fail with Unavailable and clients
// reconnect. A peer that is slow but alive still acknowledges in time.
#ifndef CAPSTAN_SDK_SRC_RPC_LINK_TIMEOUT_H_
#define CAPSTAN_SDK_SRC_RPC_LINK_TIMEOUT_H_

#include <kj/async-io.h>

#include <chrono>

namespace capstan::rpc {

// No-op for streams that are not TCP sockets (tests' in-memory pipes).
void set_link_timeout(kj::AsyncIoStream& stream, std::chrono::milliseconds timeout);

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_LINK_TIMEOUT_H_
