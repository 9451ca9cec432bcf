// The data-dispatcher service (TensorFlow's tf.data service DispatchServer):
// the Cap'n Proto shell around Dispatcher (dispatcher.h), which holds the
// logic and the glossary. Each call decodes its request, runs the matching
// Dispatcher method on the dispatcher thread and encodes the reply.
//
// Threads: the Dispatcher blocks on disk (definition files), so it runs on a
// one-thread pool of its own, never on the RPC loop; being a single thread,
// it applies state changes in journal order. A reply is sent only once the
// journal holds every change made up to its call durably: a second thread
// waits for that (group commit, dispatcher.h), so the dispatcher thread
// takes the next calls while an fsync runs, and their changes share the
// next one.
//
// DispatcherService lives on the RPC loop thread; only the dispatcher
// thread touches the Dispatcher.
#ifndef CAPSTAN_DAEMONS_DATA_DISPATCHER_SERVICE_H_
#define CAPSTAN_DAEMONS_DATA_DISPATCHER_SERVICE_H_

#include <boost/asio/thread_pool.hpp>

#include <memory>

#include "capstan_schemas/data_dispatcher.capnp.h"
#include "daemons/common/node_service.h"
#include "daemons/data_dispatcher/dispatcher.h"

namespace capstan::daemon {
class Config;
}

namespace capstan::data_dispatcher {

// The typed configuration, read once from the daemon's keys.
DispatcherConfig dispatcher_config_from(const daemon::Config& config);

class DispatcherService : public daemon::NodeService<wire::DataDispatcher::Server>,
                          private kj::TaskSet::ErrorHandler {
 public:
  explicit DispatcherService(daemon::DaemonContext& ctx);
  ~DispatcherService();

 protected:
  kj::Promise<void> registerDataset(RegisterDatasetContext context) override;
  kj::Promise<void> getDatasetDefinition(GetDatasetDefinitionContext context) override;
  kj::Promise<void> getOrCreateJob(GetOrCreateJobContext context) override;
  kj::Promise<void> releaseJobClient(ReleaseJobClientContext context) override;
  kj::Promise<void> clientHeartbeat(ClientHeartbeatContext context) override;
  kj::Promise<void> workerHeartbeat(WorkerHeartbeatContext context) override;
  kj::Promise<void> finishTask(FinishTaskContext context) override;
  kj::Promise<void> getSplit(GetSplitContext context) override;
  kj::Promise<void> listDatasets(ListDatasetsContext context) override;
  kj::Promise<void> listJobs(ListJobsContext context) override;
  kj::Promise<void> listWorkers(ListWorkersContext context) override;

 private:
  void taskFailed(kj::Exception&& exception) override;
  // Runs `func(dispatcher)` on the dispatcher thread; a promise on the loop
  // for its result, resolved once the journal holds every change made so
  // far (or rejected with the journal's failure).
  template <typename Func>
  auto on_dispatcher(Func func);
  kj::Promise<void> gc_loop();
  // The status page: jobs, data workers and datasets.
  void register_status(daemon::StatusBoard& status);
  template <typename Func>
  auto read_dispatcher(Func func);

  SystemDispatcherClock clock_;
  std::unique_ptr<Dispatcher> dispatcher_;  // used only on dispatcher_thread_
  // Declared after dispatcher_: joined (in the destructor) before it goes.
  boost::asio::thread_pool dispatcher_thread_{1};
  boost::asio::thread_pool sync_thread_{1};  // waits in Dispatcher::wait_durable
  kj::TaskSet tasks_;
};

}  // namespace capstan::data_dispatcher

#endif  // CAPSTAN_DAEMONS_DATA_DISPATCHER_SERVICE_H_
