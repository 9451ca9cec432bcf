// A Status carried as a value inside a reply (wire::ErrorDetail: one
// outcome among several), both ways. A status that fails a whole call
// travels as a kj::Exception instead (async/status_exception.h).
#ifndef CAPSTAN_LIB_RPC_ERRORS_H_
#define CAPSTAN_LIB_RPC_ERRORS_H_

#include "capstan/status.h"
#include "capstan_schemas/common.capnp.h"

namespace capstan::rpc {

// An unknown code from a newer or hostile peer reads as UNKNOWN, naming the
// code.
void status_to_wire(const Status& status, wire::ErrorDetail::Builder detail);
Status status_from_wire(wire::ErrorDetail::Reader detail);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_ERRORS_H_
