// Names of wire enums as users see them (logs, capstanctl, metrics).
#ifndef CAPSTAN_LIB_WIRE_NAMES_H_
#define CAPSTAN_LIB_WIRE_NAMES_H_

#include <optional>
#include <string_view>

#include "capstan_schemas/common.capnp.h"

namespace capstan {

// "coordinator", "ps", "worker", "data_dispatcher", "data_worker", "unknown".
std::string_view role_name(wire::Role role);
std::optional<wire::Role> role_from_name(std::string_view name);

}  // namespace capstan

#endif  // CAPSTAN_LIB_WIRE_NAMES_H_
