#include "daemons/data_worker/remote_dispatcher.h"

#include <utility>

#include "async/status_exception.h"
#include "rpc/tensor_codec.h"

namespace capstan::data_worker {
namespace {

kj::Duration to_kj(std::chrono::milliseconds ms) { return ms.count() * kj::MILLISECONDS; }

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// The TaskDef the dispatcher sent, as the worker's core takes it.
TaskSpec task_spec(wire::TaskDef::Reader def) {
  TaskSpec spec;
  spec.task_id = def.getTaskId();
  spec.job_id = def.getJobId();
  spec.dataset_id = text(def.getDatasetId());
  spec.definition.assign(reinterpret_cast<const char*>(def.getDefinition().begin()), def.getDefinition().size());
  spec.mode = def.getProcessingMode();
  spec.num_consumers = def.getNumConsumers();
  spec.cross_trainer_cache = def.getCrossTrainerCache();
  spec.cross_trainer_cache_bytes = def.getCrossTrainerCacheBytes();
  spec.num_split_providers = def.getNumSplitProviders();
  spec.compression = def.getCompression();
  return spec;
}

}  // namespace

RemoteDispatcher::RemoteDispatcher(kj::AsyncIoProvider& io, kj::Timer& timer, std::string address,
                                   const rpc::ConnectOptions& options)
    : timer_(timer), connection_(kj::heap<rpc::Connection>(io, timer, std::move(address), options)) {}

RemoteDispatcher::~RemoteDispatcher() noexcept = default;

kj::Promise<wire::DataDispatcher::Client> RemoteDispatcher::service() {
  return connection_->service<wire::DataDispatcher>(timer_.now() + to_kj(kConnectTimeout));
}

kj::Promise<Result<HeartbeatReply>> RemoteDispatcher::worker_heartbeat(std::string worker_address,
                                                                       std::vector<int64_t> current_tasks) {
  return service()
      .then([this, worker_address = std::move(worker_address),
             current_tasks = std::move(current_tasks)](wire::DataDispatcher::Client dispatcher) {
        auto request = dispatcher.workerHeartbeatRequest();
        request.setWorkerAddress(worker_address);
        auto list = request.initCurrentTasks(static_cast<unsigned>(current_tasks.size()));
        for (unsigned i = 0; i < current_tasks.size(); ++i) list.set(i, current_tasks[i]);
        return rpc::with_deadline(
            timer_, kj::Promise<capnp::Response<wire::DataDispatcher::WorkerHeartbeatResults>>(request.send()),
            kCallTimeout, "workerHeartbeat");
      })
      .then(
          [](capnp::Response<wire::DataDispatcher::WorkerHeartbeatResults>&& response) {
            HeartbeatReply reply;
            for (auto def : response.getNewTasks()) reply.new_tasks.push_back(task_spec(def));
            for (int64_t id : response.getTasksToDelete()) reply.tasks_to_delete.push_back(id);
            reply.interval = std::chrono::milliseconds(response.getIntervalMs());
            return Result<HeartbeatReply>(std::move(reply));
          },
          [](kj::Exception&& e) { return Result<HeartbeatReply>(async::from_exception(e)); });
}

kj::Promise<Result<std::optional<Element>>> RemoteDispatcher::get_split(SplitRequest split) {
  return service()
      .then([split](wire::DataDispatcher::Client dispatcher) {
        auto request = dispatcher.getSplitRequest();
        request.setJobId(split.job_id);
        request.setRepetition(0);
        request.setSplitProviderIndex(split.split_provider_index);
        request.setTaskId(split.task_id);
        request.setSequence(split.sequence);
        return request.send();
      })
      .then([](capnp::Response<wire::DataDispatcher::GetSplitResults>&& response)
                -> kj::Promise<Result<std::optional<Element>>> {
        if (response.getEndOfSplits()) return Result<std::optional<Element>>(std::optional<Element>());
        return rpc::read_element(response.getSplit()).then([](Element&& element) {
          return Result<std::optional<Element>>(std::optional<Element>(std::move(element)));
        });
      })
      .catch_([](kj::Exception&& e) { return Result<std::optional<Element>>(async::from_exception(e)); });
}

kj::Promise<Status> RemoteDispatcher::finish_task(std::string worker_address, int64_t task_id) {
  return service()
      .then([this, worker_address = std::move(worker_address), task_id](wire::DataDispatcher::Client dispatcher) {
        auto request = dispatcher.finishTaskRequest();
        request.setWorkerAddress(worker_address);
        request.setTaskId(task_id);
        return rpc::with_deadline(
            timer_, kj::Promise<capnp::Response<wire::DataDispatcher::FinishTaskResults>>(request.send()),
            kCallTimeout, "finishTask");
      })
      .then([](capnp::Response<wire::DataDispatcher::FinishTaskResults>&&) { return Status::Ok(); },
            [](kj::Exception&& e) { return async::from_exception(e); });
}

}  // namespace capstan::data_worker
