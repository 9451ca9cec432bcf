#include "rpc/errors.h"

#include <string>

namespace capstan::rpc {

void status_to_wire(const Status& status, wire::ErrorDetail::Builder detail) {
  detail.setCode(static_cast<wire::StatusCode>(status.code()));
  detail.setMessage(status.message());
}

Status status_from_wire(wire::ErrorDetail::Reader detail) {
  auto code = static_cast<int32_t>(detail.getCode());
  std::string message(detail.getMessage().cStr(), detail.getMessage().size());
  if (code <= 0 || code > static_cast<int32_t>(StatusCode::kUnauthenticated)) {
    return Status::Unknown("the peer reported an error with unknown code " + std::to_string(code) + ": " + message);
  }
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace capstan::rpc
