// The coordinator service: the Coordinator interface of
// schemas/coordinator.capnp over a Coordinator (coordinator.h). Each method
// decodes its request, calls the core and encodes the reply; the peers the
// core talks to are the Cap'n Proto ones of remote_peers.h.
//
// Not thread-safe: lives on the RPC loop thread, like the core.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_
#define CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_

#include "capstan_schemas/coordinator.capnp.h"
#include "daemons/common/node_service.h"
#include "daemons/coordinator/coordinator.h"
#include "daemons/coordinator/remote_peers.h"
#include "daemons/coordinator/rendezvous.h"

namespace capstan::coordinator {

class CoordinatorService : public daemon::NodeService<wire::Coordinator::Server> {
 public:
  explicit CoordinatorService(daemon::DaemonContext& ctx);
  ~CoordinatorService();

  // The coordinator's closure, worker, checkpoint and recovery figures on
  // /metrics (capstan_coordinator_*).
  static void register_metrics(daemon::MetricsRegistry& metrics, std::shared_ptr<const Coordinator::Stats> stats);
  // capstan_coordinator_worker_phase_seconds{worker, phase}: each run's
  // phases, by worker. `metrics` must outlive `times`' runs.
  static void register_worker_metrics(daemon::MetricsRegistry& metrics, std::shared_ptr<WorkerTimes> times);
  // The status page: closure plots, the program's reported figures, the
  // workers, parameter servers and variables (read on the loop thread).
  void register_status(daemon::StatusBoard& status, std::shared_ptr<const Coordinator::Stats> stats);

 protected:
  kj::Promise<void> registerWorker(RegisterWorkerContext context) override;
  kj::Promise<void> createVariable(CreateVariableContext context) override;
  kj::Promise<void> variableWritten(VariableWrittenContext context) override;
  kj::Promise<void> placements(PlacementsContext context) override;
  kj::Promise<void> schedule(ScheduleContext context) override;
  kj::Promise<void> scheduleMany(ScheduleManyContext context) override;
  // Answers a fetch of closure `id` into `out` (fetch, ClosureValues.fetch
  // results): encodedValue when the caller takes it (`encoded`), else value.
  template <typename Results>
  kj::Promise<void> fetch_value(int64_t id, bool encoded, Results out);
  class BatchValues;
  kj::Promise<void> join(JoinContext context) override;
  kj::Promise<void> done(DoneContext context) override;
  kj::Promise<void> fetch(FetchContext context) override;
  kj::Promise<void> release(ReleaseContext context) override;
  // release and scheduleMany's releases: checks and applies `ids`.
  Status release_ids(capnp::List<int64_t>::Reader ids, uint64_t client_id, uint64_t incarnation, const char* call);
  kj::Promise<void> createPerWorkerDataset(CreatePerWorkerDatasetContext context) override;
  kj::Promise<void> numWorkers(NumWorkersContext context) override;
  kj::Promise<void> workerStats(WorkerStatsContext context) override;
  kj::Promise<void> members(MembersContext context) override;
  kj::Promise<void> closureNames(ClosureNamesContext context) override;
  kj::Promise<void> workerAlive(WorkerAliveContext context) override;
  kj::Promise<void> createPerWorkerDatasetFromFunction(
      CreatePerWorkerDatasetFromFunctionContext context) override;
  kj::Promise<void> saveCheckpoint(SaveCheckpointContext context) override;
  kj::Promise<void> restoreCheckpoint(RestoreCheckpointContext context) override;
  kj::Promise<void> joinGroup(JoinGroupContext context) override;
  kj::Promise<void> createStrategy(CreateStrategyContext context) override;
  kj::Promise<void> runStep(RunStepContext context) override;
  kj::Promise<void> distributeStepInput(DistributeStepInputContext context) override;
  kj::Promise<void> readMirrored(ReadMirroredContext context) override;
  kj::Promise<void> strategyStatus(StrategyStatusContext context) override;
  kj::Promise<void> leaveWorker(LeaveWorkerContext context) override;
  kj::Promise<void> reportScalars(ReportScalarsContext context) override;
  kj::Promise<void> createEmbeddingTable(CreateEmbeddingTableContext context) override;
  kj::Promise<void> exportEmbeddingTable(ExportEmbeddingTableContext context) override;

 private:
  const CoordinatorConfig config_;
  RemoteParameterServers parameter_servers_;
  Coordinator core_;  // after parameter_servers_, which it uses
  GroupRendezvous rendezvous_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_
