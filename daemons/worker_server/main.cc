// worker-server: the worker (TensorFlow's /job:worker).
#include "daemons/common/daemon.h"
#include "daemons/worker_server/service.h"

using capstan::daemon::OptionType;
namespace wire = capstan::wire;

int main(int argc, char** argv) {
  capstan::daemon::RoleSpec spec;
  spec.role = wire::Role::WORKER;
  spec.loads_modules = true;
  spec.program = "worker-server";
  spec.description =
      "Capstan worker (TensorFlow's /job:worker): runs the closures the coordinator schedules, "
      "reading and updating variables on the parameter servers.";
  spec.options = {
      {"coordinator", OptionType::kString,
       "host:port of the coordinator (default: the cluster spec's chief/coordinator).", std::nullopt},
      {"collective_host", OptionType::kString,
       "IP address the other workers reach this one at for synchronous training's collectives (data "
       "connections). Default: host, or when host is 0.0.0.0 the address this machine uses to reach the "
       "coordinator.",
       ""},
      {"replica_memory_mib", OptionType::kInt,
       "MiB a worker may hold for one strategy's mirrored variables (values and optimizer slots; synchronous "
       "training); a strategy that needs more is refused, naming this key, when its group forms.",
       "4096"},
      {"step_input_memory_mib", OptionType::kInt,
       "MiB a worker may hold for a strategy's step input (MirroredStrategy::distribute_step_input: every "
       "worker holds all of its examples); a larger or endless dataset fails the step, naming this key.",
       "4096"},
  };
  spec.peers = capstan::daemon::one_peer(wire::Role::COORDINATOR, "coordinator", "coordinator");
  spec.make_service = capstan::daemon::service_factory<capstan::worker_server::WorkerService>();
  return capstan::daemon::run_daemon(spec, argc, argv);
}
