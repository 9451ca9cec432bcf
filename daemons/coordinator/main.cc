// coordinator: the coordinator (TensorFlow's ClusterCoordinator and chief).
#include "daemons/common/daemon.h"
#include "daemons/coordinator/service.h"

using capstan::Result;
using capstan::daemon::Config;
using capstan::daemon::Peer;
namespace wire = capstan::wire;

int main(int argc, char** argv) {
  capstan::daemon::RoleSpec spec;
  spec.role = wire::Role::COORDINATOR;
  spec.program = "coordinator";
  spec.description =
      "Capstan coordinator (TensorFlow's ClusterCoordinator and chief): keeps cluster membership, "
      "places variables on parameter servers, queues and dispatches closures, and orchestrates "
      "checkpoints.";
  spec.options = capstan::coordinator::CoordinatorConfig::options();
  spec.peers = [](const Config& config) -> Result<std::vector<Peer>> {
    CAPSTAN_ASSIGN_OR_RETURN(auto settings, capstan::coordinator::CoordinatorConfig::from(config));
    std::vector<Peer> peers;
    for (const auto& address : settings.ps) peers.push_back({wire::Role::PS, address});
    return peers;
  };
  spec.caution = [](const Config& config) -> std::string {
    auto settings = capstan::coordinator::CoordinatorConfig::from(config);
    if (!settings.ok() || !settings->ps.empty()) return "";
    return "no parameter servers configured (--ps, or a ps job in the cluster spec): creating a variable fails "
           "until they are given; closures and collectives work without them";
  };
  spec.make_service = capstan::daemon::service_factory<capstan::coordinator::CoordinatorService>();
  return capstan::daemon::run_daemon(spec, argc, argv);
}
