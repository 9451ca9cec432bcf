// The worker-server service: the Cap'n Proto shell of the Worker core
// (worker.h). It registers with the coordinator (handing over a capability
// to itself) and registers again when dropped; runClosure and the per-worker
// dataset calls are decoded here and run by the core on the daemon's pool.
// Variable calls go to the parameter servers through a VariableRouter, whose
// placements come from the coordinator. The replica calls (synchronous
// training) are decoded here and run by Replicas on the pool.
//
// Lives on the RPC loop thread; the core and the router are thread-safe.
#ifndef CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_
#define CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "capstan/data/dataset.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/ps.capnp.h"
#include "capstan_schemas/worker.capnp.h"
#include "daemons/common/metrics.h"
#include "daemons/common/node_service.h"
#include "daemons/worker_server/worker.h"
#include "training/variable_router.h"

namespace capstan::worker_server {

class WorkerService : public daemon::NodeService<wire::Worker::Server>,
                      private kj::TaskSet::ErrorHandler {
 public:
  explicit WorkerService(daemon::DaemonContext& ctx);
  ~WorkerService();

 protected:
  kj::Promise<void> runClosure(RunClosureContext context) override;
  kj::Promise<void> runClosures(RunClosuresContext context) override;
  kj::Promise<void> cancelClosure(CancelClosureContext context) override;
  kj::Promise<void> createDataset(CreateDatasetContext context) override;
  kj::Promise<void> createDatasetFromFunction(CreateDatasetFromFunctionContext context) override;
  kj::Promise<void> saveIterator(SaveIteratorContext context) override;
  kj::Promise<void> restoreIterator(RestoreIteratorContext context) override;
  kj::Promise<void> replicaStatus(ReplicaStatusContext context) override;
  kj::Promise<void> prepareReplica(PrepareReplicaContext context) override;
  kj::Promise<void> formReplica(FormReplicaContext context) override;
  kj::Promise<void> readReplica(ReadReplicaContext context) override;
  kj::Promise<void> abortReplica(AbortReplicaContext context) override;
  kj::Promise<void> saveReplica(SaveReplicaContext context) override;

 private:
  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> register_with_coordinator();
  // Resolves when this worker must register again: the link broke, or the
  // coordinator no longer counts it (it stopped answering pings for a while).
  kj::Promise<void> until_dropped();
  // At SIGTERM: leaveWorker, which returns once this worker's running
  // closures are done; no registering again afterwards.
  kj::Promise<void> leave_coordinator();

  kj::Own<rpc::Connection> coordinator_;
  std::shared_ptr<VariableRouter> router_;
  std::shared_ptr<Replicas> replicas_;  // shared with pool work in flight
  std::shared_ptr<Worker> worker_;  // shared with pool work in flight
  // capstan_worker_phase_seconds: where each closure's time went.
  std::shared_ptr<daemon::PhaseHistograms> phase_histograms_;
  int64_t worker_id_ = 0;
  kj::Own<kj::TaskSet> tasks_;  // released at shutdown (ctx.on_stop)
};

}  // namespace capstan::worker_server

#endif  // CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_
