// NodeService<S>: the Node methods (info, echo, discard, clock, trace,
// flight) every role's
// service offers, mixed into the role's generated Server class S.
//
//   class PsService : public NodeService<wire::ParameterServer::Server> { ... };
#ifndef CAPSTAN_DAEMONS_COMMON_NODE_SERVICE_H_
#define CAPSTAN_DAEMONS_COMMON_NODE_SERVICE_H_

#include "capstan_schemas/common.capnp.h"
#include "daemons/common/daemon.h"

namespace capstan::daemon {

// The generated Server keeps its context typedefs protected.
using InfoContext = capnp::CallContext<wire::Node::InfoParams, wire::Node::InfoResults>;
using EchoContext = capnp::CallContext<wire::Node::EchoParams, wire::Node::EchoResults>;
using DiscardContext = capnp::CallContext<wire::Node::DiscardParams, wire::Node::DiscardResults>;
using ClockContext = capnp::CallContext<wire::Node::ClockParams, wire::Node::ClockResults>;
using TraceContext = capnp::CallContext<wire::Node::TraceParams, wire::Node::TraceResults>;
using FlightContext = capnp::CallContext<wire::Node::FlightParams, wire::Node::FlightResults>;

kj::Promise<void> serve_info(const DaemonContext& ctx, InfoContext context);
kj::Promise<void> serve_echo(const DaemonContext& ctx, EchoContext context);
kj::Promise<void> serve_discard(const DaemonContext& ctx,
                                DiscardContext context);
kj::Promise<void> serve_clock(ClockContext context);
// Records the spans of the next `seconds` (capstan/trace.h) and answers them.
kj::Promise<void> serve_trace(const DaemonContext& ctx, TraceContext context);
kj::Promise<void> serve_flight(FlightContext context);

template <typename Server>
class NodeService : public Server {
 public:
  explicit NodeService(DaemonContext& ctx) : ctx_(ctx) {}

 protected:
  kj::Promise<void> info(InfoContext context) override {
    return serve_info(ctx_, context);
  }
  kj::Promise<void> echo(EchoContext context) override {
    return serve_echo(ctx_, context);
  }
  kj::Promise<void> discard(DiscardContext context) override {
    return serve_discard(ctx_, context);
  }
  kj::Promise<void> clock(ClockContext context) override { return serve_clock(context); }
  kj::Promise<void> trace(TraceContext context) override { return serve_trace(ctx_, context); }
  kj::Promise<void> flight(FlightContext context) override { return serve_flight(context); }

  DaemonContext& ctx_;
};

}  // namespace capstan::daemon

#endif  // CAPSTAN_DAEMONS_COMMON_NODE_SERVICE_H_
