// The worker-server service: runs the closures the coordinator sends
// through the capability the worker handed it at registration.
//
// A closure runs on the daemon's thread pool with a ClosureContext whose
// variable calls go to the parameter servers (through the RPC loop); the
// variable placement comes from the coordinator and is refreshed when a
// closure arrives with a newer placement version or names an unknown
// variable. Per-worker datasets are built when the coordinator sends their
// definitions, and rebuilt when the worker registers again.
//
// Lives on the RPC loop thread; the state closures share (placements,
// iterators, connections) is guarded by mutex_ or touched only on the loop.
#ifndef CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_
#define CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "capstan/data/dataset.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/ps.capnp.h"
#include "capstan_schemas/worker.capnp.h"
#include "daemons/common/node_service.h"
#include "training/variable_router.h"
#include "sync/mutex.h"

namespace capstan::worker_server {

class WorkerService : public daemon::NodeService<wire::Worker::Server>,
                      private kj::TaskSet::ErrorHandler {
 public:
  explicit WorkerService(daemon::DaemonContext& ctx);
  ~WorkerService();

 protected:
  kj::Promise<void> runClosure(RunClosureContext context) override;
  kj::Promise<void> createDataset(CreateDatasetContext context) override;
  kj::Promise<void> createDatasetFromFunction(CreateDatasetFromFunctionContext context) override;

 private:
  class Context;
  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> register_with_coordinator();
  // Resolves when this worker must register again: the link broke, or the
  // coordinator no longer counts it (it stopped answering pings for a while).
  kj::Promise<void> until_dropped();

  kj::Own<rpc::Connection> coordinator_;
  std::shared_ptr<VariableRouter> router_;
  Mutex mutex_;
  std::map<int64_t, std::shared_ptr<data::Iterator>> iterators_ GUARDED_BY(mutex_);
  int64_t worker_id_ = 0;
  kj::TaskSet tasks_;
};

}  // namespace capstan::worker_server

#endif  // CAPSTAN_DAEMONS_WORKER_SERVER_SERVICE_H_
