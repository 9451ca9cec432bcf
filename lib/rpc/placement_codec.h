// Where variables live (ps::VariableLocation) on the wire
// (wire::VariablePlacement, schemas/coordinator.capnp): the one conversion,
// both ways. The coordinator writes it in its replies; the closures' variable
// router, the worker-server and the SDK read it.
#ifndef CAPSTAN_LIB_RPC_PLACEMENT_CODEC_H_
#define CAPSTAN_LIB_RPC_PLACEMENT_CODEC_H_

#include "capstan_schemas/coordinator.capnp.h"
#include "types/shard_location.h"

namespace capstan::rpc {

void location_to_wire(const ps::VariableLocation& variable, wire::VariablePlacement::Builder out);
// A table whose optimizer this build does not know (a newer coordinator's)
// keeps its name, dtype and dim, which routing needs, and default values for
// the rest.
ps::VariableLocation location_from_wire(wire::VariablePlacement::Reader in);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_PLACEMENT_CODEC_H_
