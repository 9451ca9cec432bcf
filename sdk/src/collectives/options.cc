// The names of CollectiveOptions' values (capstan/collectives.h): plain
// value code in capstan_base, which the replica codec (lib/rpc) and
// configuration use below the Communicator.
#include <string>
#include <string_view>

#include "capstan/collectives.h"

namespace capstan {

std::string_view collective_transport_name(CollectiveOptions::Transport transport) {
  switch (transport) {
    case CollectiveOptions::Transport::kAuto: return "auto";
    case CollectiveOptions::Transport::kTcp: return "tcp";
    case CollectiveOptions::Transport::kSharedMemory: return "shm";
  }
  return "?";
}

Result<CollectiveOptions::Transport> collective_transport_from_name(std::string_view name) {
  if (name == "auto") return CollectiveOptions::Transport::kAuto;
  if (name == "tcp") return CollectiveOptions::Transport::kTcp;
  if (name == "shm") return CollectiveOptions::Transport::kSharedMemory;
  return Status::InvalidArgument("collective transport '" + std::string(name) + "' is not one of auto, tcp, shm");
}

}  // namespace capstan
