#include "wire_names.h"

namespace capstan {

std::string_view role_name(wire::Role role) {
  switch (role) {
    case wire::Role::COORDINATOR: return "coordinator";
    case wire::Role::PS: return "ps";
    case wire::Role::WORKER: return "worker";
    case wire::Role::DATA_DISPATCHER: return "data_dispatcher";
    case wire::Role::DATA_WORKER: return "data_worker";
    case wire::Role::UNKNOWN: break;
  }
  return "unknown";
}

std::optional<wire::Role> role_from_name(std::string_view name) {
  for (auto role : {wire::Role::COORDINATOR, wire::Role::PS, wire::Role::WORKER,
                    wire::Role::DATA_DISPATCHER, wire::Role::DATA_WORKER}) {
    if (role_name(role) == name) return role;
  }
  return std::nullopt;
}

}  // namespace capstan
