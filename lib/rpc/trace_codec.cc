#include "rpc/trace_codec.h"

#include <algorithm>
#include <string_view>

namespace capstan::rpc {
namespace {

constexpr trace::Kind kKinds[] = {trace::Kind::kClosure,    trace::Kind::kStep,       trace::Kind::kPhase,
                                  trace::Kind::kRpc,        trace::Kind::kCollective, trace::Kind::kRead,
                                  trace::Kind::kCheckpoint, trace::Kind::kSchedule,   trace::Kind::kUser};

trace::Kind kind_from_name(std::string_view name) {
  for (trace::Kind kind : kKinds) {
    if (name == trace::kind_name(kind)) return kind;
  }
  return trace::Kind::kUser;
}

trace::State state_from_name(std::string_view name) {
  for (trace::State state : {trace::State::kStarted, trace::State::kFinished, trace::State::kFailed}) {
    if (name == trace::state_name(state)) return state;
  }
  return trace::State::kStarted;
}

}  // namespace

void event_to_wire(const trace::Event& in, wire::TraceEvent::Builder out) {
  out.setKind(trace::kind_name(in.kind));
  out.setName(in.name);
  out.setDetail(in.detail);
  out.setStartNs(in.start_ns);
  out.setEndNs(in.end_ns);
  out.setThread(in.thread);
  out.setAsync(in.async);
  out.setFailed(in.failed);
  out.setId(in.id);
  out.setFlowIn(in.flow_in);
  out.setFlowOut(in.flow_out);
}

trace::Event event_from_wire(wire::TraceEvent::Reader in) {
  trace::Event out;
  out.kind = kind_from_name(in.getKind().cStr());
  out.name = in.getName().cStr();
  out.detail = in.getDetail().cStr();
  out.start_ns = in.getStartNs();
  out.end_ns = std::max(in.getEndNs(), out.start_ns);
  out.thread = in.getThread();
  out.async = in.getAsync();
  out.failed = in.getFailed();
  out.id = in.getId();
  out.flow_in = in.getFlowIn();
  out.flow_out = in.getFlowOut();
  return out;
}

void flight_to_wire(const trace::FlightRecord& in, wire::FlightRecord::Builder out) {
  out.setId(in.id);
  out.setKind(trace::kind_name(in.kind));
  out.setName(in.name);
  out.setDetail(in.detail);
  out.setState(trace::state_name(in.state));
  out.setStartNs(in.start_ns);
  out.setEndNs(in.end_ns);
  out.setThread(in.thread);
}

trace::FlightRecord flight_from_wire(wire::FlightRecord::Reader in) {
  trace::FlightRecord out;
  out.id = in.getId();
  out.kind = kind_from_name(in.getKind().cStr());
  out.name = in.getName().cStr();
  out.detail = in.getDetail().cStr();
  out.state = state_from_name(in.getState().cStr());
  out.start_ns = in.getStartNs();
  out.end_ns = in.getEndNs();
  out.thread = in.getThread();
  return out;
}

}  // namespace capstan::rpc
