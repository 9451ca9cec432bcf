// The data-worker service (TF's GrpcWorkerImpl in front of
// DataServiceWorkerImpl): adapts the DataWorker core (data_worker.h, which
// has the glossary) to the DataWorker interface of
// schemas/data_worker.capnp. It decodes getElements, asks the core and
// encodes the reply (elements inline or as ByteSources, compressed frames,
// shared-memory placements); it reaches the dispatcher through a
// RemoteDispatcher, starts the core's heartbeats once the daemon knows its
// advertised address, and publishes the core's figures on /metrics and
// the status page.
//
// Thread-safety: lives on the RPC loop thread, as the core does.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "capstan_schemas/data_worker.capnp.h"
#include "daemons/common/node_service.h"
#include "daemons/data_worker/data_worker.h"
#include "daemons/data_worker/remote_dispatcher.h"

namespace capstan::data_worker {

class DataWorkerService : public daemon::NodeService<wire::DataWorker::Server>,
                          private kj::TaskSet::ErrorHandler {
 public:
  // Reads its settings once (DataWorkerConfig::from(ctx.config)).
  explicit DataWorkerService(daemon::DaemonContext& ctx);
  // Destroys the core first (which fails pending getSplit calls and joins
  // every task's threads).
  ~DataWorkerService();

 protected:
  kj::Promise<void> getElements(GetElementsContext context) override;

 private:
  // Per-job figures on /metrics (loop thread only).
  struct JobCounters {
    daemon::Counter* elements;
    daemon::Counter* bytes;
    daemon::Counter* starved;
  };
  JobCounters& job_counters(int64_t job_id);
  std::map<int64_t, JobCounters> job_counters_;  // at most 64 jobs
  std::optional<JobCounters> other_job_counters_;  // job="other": the jobs after those

  void taskFailed(kj::Exception&& exception) override;

  // Starts the core's heartbeats once the daemon knows the address it
  // advertises (after the service is built and the dispatcher is reachable).
  kj::Promise<void> start_when_ready();
  void write_shm(wire::DataWorker::GetElementsResults::Builder results, const std::vector<PlacedTensor>& placed,
                 const std::shared_ptr<data::shm::ShmRegion>& offer);

  // Constant after construction.
  daemon::Counter* elements_served_;
  daemon::Counter* bytes_served_;
  daemon::Counter* shm_bytes_;
  daemon::Counter* compressed_raw_bytes_;   // tensors sent compressed: their raw bytes
  daemon::Counter* compressed_wire_bytes_;  //   and their frames' bytes

  // Loop thread only. The dispatcher goes after the core, which calls it.
  bool waiting_logged_ = false;
  RemoteDispatcher dispatcher_;
  std::unique_ptr<DataWorker> worker_;

  // Last, so its promises (which use everything above) go first.
  kj::TaskSet background_;
};

}  // namespace capstan::data_worker

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_
