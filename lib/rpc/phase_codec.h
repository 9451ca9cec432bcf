// Step phases (capstan/phases.h) on the wire: a run's (worker.capnp
// RunPhases, the worker-server to the coordinator) and a worker's totals
// (coordinator.capnp WorkerStats, the coordinator to programs and
// capstanctl). The one conversion, both ways.
#ifndef CAPSTAN_LIB_RPC_PHASE_CODEC_H_
#define CAPSTAN_LIB_RPC_PHASE_CODEC_H_

#include "capstan/phases.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/worker.capnp.h"

namespace capstan::rpc {

void phases_to_wire(const PhaseTimes& in, wire::RunPhases::Builder out);
// Each phase clamped to [0, total] (a worker's report is not trusted to be
// sane; one older than the field sends zeros); queued is 0.
PhaseTimes phases_from_wire(wire::RunPhases::Reader in);

// The phase fields of a WorkerStats (queued included).
void phases_to_wire(const PhaseTimes& in, wire::WorkerStats::Builder out);
PhaseTimes phases_from_wire(wire::WorkerStats::Reader in);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_PHASE_CODEC_H_
