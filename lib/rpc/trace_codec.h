// Spans (capstan/trace.h) on the wire (common.capnp TraceEvent,
// FlightRecord): a daemon's trace and flight recorder, to capstanctl and
// programs. The one conversion, both ways.
#ifndef CAPSTAN_LIB_RPC_TRACE_CODEC_H_
#define CAPSTAN_LIB_RPC_TRACE_CODEC_H_

#include "capstan/trace.h"
#include "capstan_schemas/common.capnp.h"

namespace capstan::rpc {

void event_to_wire(const trace::Event& in, wire::TraceEvent::Builder out);
// An unknown kind reads as kUser; an end before the start as the start.
trace::Event event_from_wire(wire::TraceEvent::Reader in);

void flight_to_wire(const trace::FlightRecord& in, wire::FlightRecord::Builder out);
trace::FlightRecord flight_from_wire(wire::FlightRecord::Reader in);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_TRACE_CODEC_H_
