// Synchronous training's values (types/replica.h) on the wire
// (schemas/worker.capnp): the one conversion, both ways, used by the
// coordinator's RemoteWorker and the worker-server's service.
#ifndef CAPSTAN_LIB_RPC_REPLICA_CODEC_H_
#define CAPSTAN_LIB_RPC_REPLICA_CODEC_H_

#include <kj/async.h>

#include <vector>

#include "capstan/status.h"
#include "capstan_schemas/worker.capnp.h"
#include "rpc/tensor_codec.h"
#include "types/replica.h"

namespace capstan::rpc {

void spec_to_wire(const training::MirroredSpec& in, wire::MirroredSpec::Builder out);
// InvalidArgument for an unknown dtype or optimizer, a negative dimension,
// or an empty name.
Result<training::MirroredSpec> spec_from_wire(wire::MirroredSpec::Reader in);

void state_to_wire(const training::MirroredState& in, wire::MirroredState::Builder out, const CodecOptions& codec);
// Rejects (InvalidArgument) slot names and tensors that do not pair up, and
// what read_tensor rejects. The reader need only live until the call returns.
kj::Promise<training::MirroredState> state_from_wire(wire::MirroredState::Reader in);

void settings_to_wire(const training::CollectiveSettings& in, wire::CollectiveSettings::Builder out);
// InvalidArgument for a non-positive timeout, an unknown transport, or
// tcpStreams outside [1, 16].
Result<training::CollectiveSettings> settings_from_wire(wire::CollectiveSettings::Reader in);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_REPLICA_CODEC_H_
