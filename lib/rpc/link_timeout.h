// Dead-link detection for RPC sockets: without it a peer behind a network
// partition (no RST, packets vanish) looks alive until TCP gives up, which
// takes many minutes, and calls to it wait for their own timeouts.
//
// set_link_timeout(stream, t): TCP keepalive probes an idle link (first
// after t/3, then every t/6, gone after 3 unanswered) and TCP_USER_TIMEOUT
// ends a link whose sent data stays unacknowledged for t. Either way the
// connection breaks, calls on it fail with Unavailable and clients
// reconnect. A peer that is slow but alive still acknowledges in time.
//
// tune_loopback_link(stream): a link whose two ends are both loopback
// addresses (a cluster on one host) gets the congestion control
// loopback_congestion_control() names. BBR, the default on many hosts,
// paces every send by its bandwidth estimate; on loopback, where there is
// no queue to model, that halves throughput (5.0 against 10.7 GB/s for
// 1 MiB messages on our 2-vCPU machine) and makes the first transfers after
// an idle spell slower still. Links between hosts keep the kernel's choice.
#ifndef CAPSTAN_LIB_RPC_LINK_TIMEOUT_H_
#define CAPSTAN_LIB_RPC_LINK_TIMEOUT_H_

#include <kj/async-io.h>

#include "capstan/status.h"

#include <chrono>
#include <string>

namespace capstan::rpc {

// No-op for streams that are not TCP sockets (tests' in-memory pipes).
void set_link_timeout(kj::AsyncIoStream& stream, std::chrono::milliseconds timeout);

// The algorithm for loopback links: what set_loopback_congestion_control()
// set, else the environment variable CAPSTAN_LOOPBACK_TCP_CONGESTION, else
// "cubic"; empty for "system" (the kernel's default for every link). A name
// the kernel does not allow (net.ipv4.tcp_allowed_congestion_control)
// leaves the kernel's default on the link.
std::string loopback_congestion_control();
// InvalidArgument unless `name` is "system" or an algorithm's name (letters,
// digits, '_', at most 15 characters). Daemons call it with their
// `loopback_tcp_congestion` key before they connect or listen.
Status set_loopback_congestion_control(const std::string& name);

// Sets loopback_congestion_control() on a TCP socket whose local and peer
// addresses are both loopback; returns whether it did. Anything else (not
// TCP, another host, an algorithm the kernel refuses) is left as it is.
bool tune_loopback_socket(int fd);
void tune_loopback_link(kj::AsyncIoStream& stream);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_LINK_TIMEOUT_H_
