#include "daemons/coordinator/per_worker_datasets.h"

#include <algorithm>
#include <random>
#include <utility>

#include "async/status_exception.h"
#include "capstan/data/dataset.h"
#include "daemons/coordinator/checkpointing.h"

namespace capstan::coordinator {

PerWorkerDatasets::PerWorkerDatasets(int expected_workers, std::shared_ptr<spdlog::logger> log, Journal journal)
    : expected_workers_(expected_workers), log_(std::move(log)), journal_(std::move(journal)) {}

kj::Promise<void> PerWorkerDatasets::send(const DatasetTarget& worker, size_t registered, int64_t id,
                                          const PerWorkerDataset& dataset) {
  int n = std::max({expected_workers_, static_cast<int>(registered), worker.task_index + 1});
  int64_t worker_id = worker.id;
  kj::Promise<Status> sent = nullptr;
  if (!dataset.function.empty()) {
    sent = worker.peer->create_dataset_from_function(id, dataset.function, n, worker.task_index, dataset.uid);
  } else {
    auto parsed = data::Dataset::deserialize(dataset.definition);  // checked when it was created
    if (!parsed.ok()) {
      sent = parsed.status();
    } else {
      sent = worker.peer->create_dataset(id, parsed->resolve_shard_hint(n, worker.task_index).serialize(), dataset.uid);
    }
  }
  return sent.catch_([](kj::Exception&& e) { return async::from_exception(e); })
      .then([this, worker_id, id](Status status) {
        if (!status.ok()) {
          log_->warn("worker {} could not build per-worker dataset {}: {}", worker_id, id, status.to_string());
        }
      });
}

kj::Promise<void> PerWorkerDatasets::send_all(const DatasetTarget& worker, size_t registered) {
  auto sends = kj::heapArrayBuilder<kj::Promise<void>>(datasets_.size());
  for (const auto& [id, dataset] : datasets_) sends.add(send(worker, registered, id, dataset));
  return kj::joinPromises(sends.finish());
}

kj::Promise<Result<int64_t>> PerWorkerDatasets::add(PerWorkerDataset dataset,
                                                    const std::vector<DatasetTarget>& workers) {
  if (dataset.name.size() > 256) {
    return Result<int64_t>(Status::InvalidArgument("per-worker dataset name longer than 256 bytes"));
  }
  if (!dataset.name.empty()) {
    for (const auto& [existing_id, existing] : datasets_) {
      if (existing.name != dataset.name) continue;
      if (existing.definition != dataset.definition || existing.function != dataset.function ||
          existing.step_input != dataset.step_input) {
        return Result<int64_t>(Status::AlreadyExists(
            "per-worker dataset '" + dataset.name + "' exists (id " + std::to_string(existing_id) +
            ") with another definition; give the new one another name"));
      }
      log_->info("per-worker dataset '{}' found again (a reconnecting program): id {}, iterators where they were",
                 dataset.name, existing_id);
      return Result<int64_t>(existing_id);
    }
  }
  int64_t id = next_id_;
  std::random_device random;
  do {
    dataset.uid = (static_cast<uint64_t>(random()) << 32) ^ random();
  } while (dataset.uid == 0);
  Status logged = journal_(id, dataset);
  if (!logged.ok()) return Result<int64_t>(logged);
  ++next_id_;
  const PerWorkerDataset& added = datasets_[id] = std::move(dataset);
  // The workers registered now build theirs now; later ones when they register.
  auto sends = kj::heapArrayBuilder<kj::Promise<void>>(workers.size());
  for (const auto& worker : workers) sends.add(send(worker, workers.size(), id, added));
  return kj::joinPromises(sends.finish()).then([id]() { return Result<int64_t>(id); });
}

kj::Promise<std::map<std::string, std::string>> PerWorkerDatasets::iterator_states(
    const std::vector<DatasetTarget>& workers) {
  using States = std::map<std::string, std::string>;
  auto states = std::make_shared<States>();
  auto reads = kj::Vector<kj::Promise<void>>();
  for (const auto& [id, dataset] : datasets_) {
    if (dataset.step_input) continue;
    for (const auto& worker : workers) {
      std::string name = iterator_tensor_name(dataset.name, id, worker.task_index);
      reads.add(worker.peer->save_iterator(id)
                    .catch_([](kj::Exception&& e) { return Result<std::string>(async::from_exception(e)); })
                    .then([this, states, name](Result<std::string> state) {
                      if (state.ok()) {
                        (*states)[name] = std::move(*state);
                      } else {
                        log_->warn("checkpoint without the position of {}: {}", name, state.status().to_string());
                      }
                    }));
    }
  }
  return kj::joinPromises(reads.releaseAsArray()).then([states]() { return std::move(*states); });
}

kj::Promise<Result<int>> PerWorkerDatasets::restore_iterators(std::map<std::string, std::string> states,
                                                              const std::vector<DatasetTarget>& workers) {
  auto restores = kj::Vector<kj::Promise<Status>>();
  int count = 0;
  for (const auto& [id, dataset] : datasets_) {
    if (dataset.step_input) continue;
    for (const auto& worker : workers) {
      std::string name = iterator_tensor_name(dataset.name, id, worker.task_index);
      auto found = states.find(name);
      if (found == states.end()) {
        if (!states.empty()) log_->warn("the checkpoint has no position for {}: that iterator goes on where it is", name);
        continue;
      }
      ++count;
      restores.add(worker.peer->restore_iterator(id, found->second)
                       .catch_([](kj::Exception&& e) { return async::from_exception(e); })
                       .then([name](Status status) { return status.with_context("restoring " + name); }));
    }
  }
  return kj::joinPromises(restores.releaseAsArray()).then([count](kj::Array<Status> statuses) -> Result<int> {
    for (auto& status : statuses) CAPSTAN_RETURN_IF_ERROR(status);
    return count;
  });
}

void PerWorkerDatasets::restore(int64_t id, PerWorkerDataset dataset) {
  datasets_[id] = std::move(dataset);
  next_id_ = std::max(next_id_, id + 1);
}

}  // namespace capstan::coordinator
