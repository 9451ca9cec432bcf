// coordinator: the coordinator (TensorFlow's ClusterCoordinator and chief).
#include "daemons/common/daemon.h"
#include "daemons/coordinator/service.h"

using capstan::Result;
using capstan::daemon::Config;
using capstan::daemon::OptionType;
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
  spec.options = {
      {"ps", OptionType::kStringList,
       "host:port of each parameter server (default: the cluster spec's ps job).", std::nullopt},
      {"ps_service", OptionType::kString,
       "The parameter servers as a Kubernetes StatefulSet behind a headless Service, NAME[.NAMESPACE.svc]:PORT: "
       "task i is NAME-i.NAME[.NAMESPACE.svc]:PORT (with num_ps; instead of ps).",
       ""},
      {"num_ps", OptionType::kInt, "How many parameter servers ps_service has (its StatefulSet's replicas).", "0"},
      {"closures_per_worker", OptionType::kInt,
       "Closures each worker runs at once (TF runs one; more hides round trips of short closures).",
       "1"},
      {"closure_batch", OptionType::kInt,
       "When the queue is deep (more closures queued than twice the lanes), a lane sends a worker up to this many "
       "closures in one call, run one after another there (fewer round trips; still one at a time per lane). "
       "1: one closure per call. Closures with closure_timeout_ms are sent one at a time.",
       "16"},
      {"worker_ping_interval_ms", OptionType::kInt, "How often each worker is pinged.", "2000"},
      {"worker_ping_timeout_ms", OptionType::kInt,
       "A worker that does not answer a ping this fast is dropped (its closures re-queued).", "5000"},
      {"closure_timeout_ms", OptionType::kInt,
       "A closure run taking longer fails with DeadlineExceeded, which cancels the other closures as any "
       "closure error does; closures see the deadline (ClosureContext::deadline). 0: none.",
       "0"},
      {"num_workers", OptionType::kInt,
       "Workers the per-worker datasets are sharded for (default: the cluster spec's worker job, "
       "else the workers registered).",
       "0"},
      {"work_dir", OptionType::kString,
       "Directory of the coordinator's journal: a coordinator restarted with the same one knows its variables, "
       "their placement, the per-worker datasets and the checkpoint to recover from again. Empty: nothing survives a "
       "restart.",
       ""},
      {"checkpoint_dir", OptionType::kString,
       "Where the checkpoint policy saves, and where a parameter server that restarted empty is restored from "
       "(its newest checkpoint, unless the program saved or restored one since). Empty: none.",
       ""},
      {"checkpoint_every_steps", OptionType::kInt,
       "Save a checkpoint into checkpoint_dir every N closures completed. 0: off.", "0"},
      {"checkpoint_every_seconds", OptionType::kInt,
       "Save a checkpoint into checkpoint_dir every N seconds (when closures completed since). 0: off.", "0"},
      {"checkpoint_max_to_keep", OptionType::kInt, "Checkpoints the policy keeps in checkpoint_dir.", "3"},
      {"ps_recovery", OptionType::kBool,
       "Restore a parameter server that comes back without its shards from the latest checkpoint, by itself; "
       "the program pauses meanwhile. false: calls fail with DataLoss until a checkpoint is restored by hand.",
       "true"},
      {"checkpoint_on_preemption", OptionType::kBool,
       "With checkpoint_dir: when a worker leaves (its SIGTERM) or the coordinator gets SIGTERM, save a checkpoint "
       "once the running closures have finished.",
       "true"},
      {"ps_recovery_timeout_ms", OptionType::kInt,
       "While a lost parameter server can be recovered, join/fetch wait this long for it before they fail with "
       "Unavailable.",
       "300000"},
      {"client_grace_ms", OptionType::kInt,
       "A program's closure values are released when its client has not called for this long (the SDK calls at least "
       "every 5 s while it runs): a program that crashed or exited cannot fetch them any more. A client that "
       "reconnects within it (a link outage, a coordinator restart) fetches its values as before. 0: never (values "
       "stay until released one by one). At least 15000.",
       "300000"},
      {"max_queued_closures", OptionType::kInt,
       "Schedule calls are answered only while fewer closures than this wait for a worker, so a program that "
       "schedules faster than the workers run blocks in schedule() (as TF's does when its queue is full) and the "
       "queue, and the coordinator's memory, stay bounded (each client adds at most 16384 closures it has no answer "
       "for).",
       "32768"},
  };
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
