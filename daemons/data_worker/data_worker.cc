#include "daemons/data_worker/data_worker.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <utility>

#include "capstan/data/dataset.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "async/mailbox.h"
#include "async/pool.h"
#include "sync/mutex.h"

namespace capstan::data_worker {
namespace {

// Shared-memory regions: at most this many consumers at once, each region
// at most this large, dropped after this long without a request.
constexpr size_t kMaxShmRegions = 32;
constexpr int64_t kMaxShmRegionBytes = int64_t{1} << 30;
// All regions together: consumers that never release their records (or
// pretend to have mapped a region) cannot pin more of the host than this.
constexpr int64_t kMaxShmTotalBytes = int64_t{4} << 30;
constexpr std::chrono::seconds kShmIdle{60};

kj::Duration to_kj(std::chrono::milliseconds ms) { return ms.count() * kj::MILLISECONDS; }

// The dispatcher is down or slow: worth asking again.
bool retryable(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded ||
         status.code() == StatusCode::kResourceExhausted;
}

const char* mode_name(wire::ProcessingMode mode) {
  switch (mode) {
    case wire::ProcessingMode::OFF: return "OFF";
    case wire::ProcessingMode::DYNAMIC: return "DYNAMIC";
    case wire::ProcessingMode::FILE: return "FILE";
    case wire::ProcessingMode::DATA: return "DATA";
    case wire::ProcessingMode::FILE_OR_DATA: return "FILE_OR_DATA";
    case wire::ProcessingMode::HINT: return "HINT";
  }
  return "UNKNOWN";
}

}  // namespace

// One getSplit call a pipeline thread is waiting for.
struct SplitCall {
  SplitCall(int64_t job, int64_t index, int64_t task, int64_t number)
      : job_id(job), split_provider_index(index), task_id(task), sequence(number) {}
  const int64_t job_id;
  const int64_t split_provider_index;
  const int64_t task_id;
  const int64_t sequence;  // the task's request number for this provider
  // Both guarded by SplitBridge::mutex_ (an annotation cannot name another
  // object's mutex).
  bool done = false;
  Result<std::optional<Element>> result{Status::Unavailable("getSplit was not answered")};
};

// Carries getSplit calls from pipeline threads to the loop and the answers
// back. The loop never waits for a pipeline thread here (a pipeline thread
// posts its call and wakes the loop through the loop's Mailbox, then waits
// on a condition variable), so the DataWorker may join pipeline threads
// on the loop once the bridge is closed.
//
// Thread-safety: thread-safe; take() and answer() on the loop thread.
class SplitBridge {
 public:
  // Pipeline side: posts a call and waits up to `timeout` for its answer.
  // Cancelled when `cancelled` becomes true (see wake_waiters) or the bridge
  // closes; DeadlineExceeded when the loop did not answer in time.
  Result<std::optional<Element>> call(int64_t job_id, int64_t split_provider_index, int64_t task_id,
                                      int64_t sequence, const std::atomic<bool>& cancelled,
                                      std::chrono::milliseconds timeout) {
    auto call = std::make_shared<SplitCall>(job_id, split_provider_index, task_id, sequence);
    MutexLock lock(mutex_);
    if (closed_) return Status::Cancelled("the data worker is shutting down");
    queue_.push_back(call);
    if (wake_) {
      wake_->remote->signal(wake_->ticket);
      wake_.reset();
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!call->done && !closed_ && !cancelled.load() && cv_.wait_until(mutex_, deadline)) {
    }
    if (call->done) return std::move(call->result);
    if (closed_) return Status::Cancelled("the data worker is shutting down");
    if (cancelled.load()) return Status::Cancelled("the task is being removed");
    return Status::DeadlineExceeded("getSplit did not finish within " + std::to_string(timeout.count()) + " ms");
  }

  // Pipeline side: waits `delay`; false when cancelled or closed first.
  bool sleep(std::chrono::milliseconds delay, const std::atomic<bool>& cancelled) {
    MutexLock lock(mutex_);
    auto deadline = std::chrono::steady_clock::now() + delay;
    while (!closed_ && !cancelled.load() && cv_.wait_until(mutex_, deadline)) {
    }
    return !closed_ && !cancelled.load();
  }

  // Wakes every waiter, so that one whose `cancelled` flag was just set
  // returns.
  void wake_waiters() {
    MutexLock lock(mutex_);
    cv_.notify_all();
  }

  // Loop side: resolves with the calls posted since the last take() once
  // there is at least one; never resolves after close().
  kj::Promise<std::vector<std::shared_ptr<SplitCall>>> take() {
    MutexLock lock(mutex_);
    if (closed_) return kj::NEVER_DONE;
    if (!queue_.empty()) {
      std::vector<std::shared_ptr<SplitCall>> calls(queue_.begin(), queue_.end());
      queue_.clear();
      return calls;
    }
    auto& mailbox = async::Mailbox::current();
    auto [ticket, ready] = mailbox.expect();
    wake_ = Wake{mailbox.remote(), ticket};
    return ready.then([this]() { return take(); });
  }

  void answer(const std::shared_ptr<SplitCall>& call, Result<std::optional<Element>> result) {
    MutexLock lock(mutex_);
    call->done = true;
    call->result = std::move(result);
    cv_.notify_all();
  }

  // Fails every waiting and later call with Cancelled.
  void close() {
    MutexLock lock(mutex_);
    closed_ = true;
    queue_.clear();
    cv_.notify_all();
  }

 private:
  Mutex mutex_;
  CondVar cv_;
  bool closed_ GUARDED_BY(mutex_) = false;
  std::deque<std::shared_ptr<SplitCall>> queue_ GUARDED_BY(mutex_);
  // Set while take() waits for a call; signalled by the next call().
  struct Wake {
    std::shared_ptr<async::MailboxRemote> remote;
    uint64_t ticket;
  };
  std::optional<Wake> wake_ GUARDED_BY(mutex_);
};

namespace {

// The splits of one source of a DYNAMIC task's pipeline, from the
// dispatcher's getSplit (repetition 0, the source's split provider index;
// the dispatcher's providers repeat them for repeat()). The task's requests
// are numbered 0, 1, 2, ...: the dispatcher leases split k to request k, so
// a retry, or the same task rebuilt after this worker restarted, gets the
// same splits in the same order. Thread-safe.
class RemoteSplitProvider final : public data::SplitProvider {
 public:
  RemoteSplitProvider(std::shared_ptr<SplitBridge> bridge, SplitRetryPolicy retry, int64_t job_id, int64_t index,
                      int64_t task_id)
      : bridge_(std::move(bridge)), retry_(retry), job_id_(job_id), index_(index), task_id_(task_id) {}

  // Retries while the dispatcher is unreachable, for up to retry_.window,
  // so that a dispatcher restart does not end the task.
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);  // one request at a time: numbers stay in order
    if (ended_) return std::optional<Element>();
    auto give_up = std::chrono::steady_clock::now() + retry_.window;
    std::chrono::milliseconds backoff = retry_.initial_backoff;
    while (true) {
      // A little longer than the loop's own deadline, which answers first.
      auto result = bridge_->call(job_id_, index_, task_id_, sequence_, cancelled_,
                                  retry_.attempt_timeout + std::chrono::seconds(5));
      if (result.ok()) {
        if (result->has_value()) {
          ++sequence_;
        } else {
          ended_ = true;
        }
        return result;
      }
      Status status = result.status();
      if (!retryable(status) || std::chrono::steady_clock::now() + backoff >= give_up) {
        return status.with_context("getting split " + std::to_string(sequence_) + " of task " +
                                   std::to_string(task_id_) + " (job " + std::to_string(job_id_) +
                                   ", source " + std::to_string(index_) + ") from the dispatcher" +
                                   (retryable(status) ? ", retried for " + std::to_string(retry_.window.count()) +
                                                            " ms"
                                                      : std::string()));
      }
      if (!bridge_->sleep(backoff, cancelled_)) return Status::Cancelled("the task is being removed");
      backoff = std::min(backoff * 2, retry_.max_backoff);
    }
  }
  // The dispatcher keeps track of repetitions; a source that starts over
  // gets endOfSplits for repetition 0, as TF's DataServiceSplitProvider does.
  void reset() override {}
  int64_t num_splits() const override { return -1; }  // known to the dispatcher only

  // Makes waiting and later get_next calls return Cancelled.
  void cancel() {
    cancelled_.store(true);
    bridge_->wake_waiters();
  }

 private:
  const std::shared_ptr<SplitBridge> bridge_;
  const SplitRetryPolicy retry_;
  const int64_t job_id_;
  const int64_t index_;
  const int64_t task_id_;
  std::atomic<bool> cancelled_{false};
  Mutex mutex_;
  int64_t sequence_ GUARDED_BY(mutex_) = 0;  // the next request's number
  bool ended_ GUARDED_BY(mutex_) = false;    // the dispatcher said endOfSplits
};

// The wire's bound on split providers (schemas/data_dispatcher.capnp).
constexpr int64_t kMaxSplitProviders = wire::MAX_SPLIT_PROVIDERS;

}  // namespace

// One task on this worker. Destroying it joins the pipeline's threads, so
// that happens on the pool (or on the loop once the SplitBridge is closed).
struct WorkerTask {
  int64_t task_id = 0;
  int64_t job_id = 0;
  Status error;  // why the pipeline could not be built; consumers get it
  std::vector<std::unique_ptr<RemoteSplitProvider>> splits;  // DYNAMIC only; outlive runner
  std::unique_ptr<TaskRunner> runner;           // null when error is set
  std::unique_ptr<data::WireCompressor> compressor;  // the dataset's compression; never null

  // Makes the pipeline's waiting and later split requests return Cancelled.
  void cancel_splits() {
    for (auto& s : splits) s->cancel();
  }

  ~WorkerTask() {
    cancel_splits();
    runner.reset();  // before `splits`, which its pipeline uses
  }
};

namespace {

// Runs on the pool: deserializes and starts the task's pipeline. Never
// fails; a task that cannot run carries its error.
std::shared_ptr<WorkerTask> build_task(const TaskSpec& spec, const DataWorkerConfig& config,
                                       const FunctionRegistry* functions, const std::shared_ptr<SplitBridge>& bridge) {
  auto task = std::make_shared<WorkerTask>();
  task->task_id = spec.task_id;
  task->job_id = spec.job_id;
  task->compressor = std::make_unique<data::WireCompressor>(spec.compression);
  auto build = [&]() -> Status {
    if (spec.num_consumers < 0) {
      return Status::InvalidArgument("numConsumers " + std::to_string(spec.num_consumers) + " is negative");
    }
    if (spec.cross_trainer_cache_bytes < 0) {
      return Status::InvalidArgument("crossTrainerCacheBytes " + std::to_string(spec.cross_trainer_cache_bytes) +
                                     " is negative");
    }
    CAPSTAN_ASSIGN_OR_RETURN(data::Dataset dataset, data::Dataset::deserialize(spec.definition));
    // The job's own budget, within this worker's.
    data::Options job_options = dataset.options();
    if (job_options.memory_budget <= 0 || job_options.memory_budget > config.task_memory_bytes) {
      job_options.memory_budget = config.task_memory_bytes;
      dataset = dataset.with_options(job_options);
    }
    std::unique_ptr<data::Iterator> iterator;
    if (spec.mode == wire::ProcessingMode::DYNAMIC) {
      if (spec.num_split_providers < 1 || spec.num_split_providers > kMaxSplitProviders) {
        return Status::InvalidArgument("numSplitProviders " + std::to_string(spec.num_split_providers) +
                                       " is not in [1, " + std::to_string(kMaxSplitProviders) + "]");
      }
      std::vector<data::SplitProvider*> providers;
      for (int64_t k = 0; k < spec.num_split_providers; ++k) {
        task->splits.push_back(std::make_unique<RemoteSplitProvider>(bridge, config.split_retry, spec.job_id, k,
                                                                    spec.task_id));
        providers.push_back(task->splits.back().get());
      }
      CAPSTAN_ASSIGN_OR_RETURN(iterator, dataset.make_iterator(functions, std::move(providers)));
    } else {
      CAPSTAN_ASSIGN_OR_RETURN(iterator, dataset.make_iterator(functions));
    }
    TaskRunner::Options options;
    options.buffer_bytes = config.element_buffer_bytes;
    options.num_consumers = spec.num_consumers;
    options.cross_trainer_cache = spec.cross_trainer_cache;
    if (spec.cross_trainer_cache_bytes > 0) options.cache_bytes = spec.cross_trainer_cache_bytes;
    task->runner = std::make_unique<TaskRunner>(std::move(iterator), options);
    return Status::Ok();
  };
  Status status;
  try {
    status = build();
  } catch (const std::exception& e) {
    status = Status::Internal(e.what());
  }
  task->error = status.with_context("task " + std::to_string(spec.task_id) + " (job " + std::to_string(spec.job_id) +
                                    ", dataset " + spec.dataset_id + ")");
  return task;
}

// Drops the loop's reference on the pool: the last reference joins the
// task's threads (an in-flight getElements may hold the last one).
void destroy_on_pool(boost::asio::thread_pool& pool, std::shared_ptr<WorkerTask> task) {
  task->cancel_splits();
  boost::asio::post(pool, [task = std::move(task)]() mutable { task.reset(); });
}

}  // namespace

// ---- Shared memory (data/shm_region.h) ----------------------------------------

namespace {

// Whether `t` would travel in shared memory.
bool shm_eligible(const Tensor& t) { return t.dtype() != DType::kString && t.byte_size() >= data::shm::kMinTensorBytes; }

// Whether the reply has a tensor that would travel in shared memory.
bool has_shm_tensor(const TaskRunner::Reply& reply) {
  for (const Element& e : reply.elements) {
    for (const Tensor& t : e.components) {
      if (shm_eligible(t)) return true;
    }
  }
  return false;
}

// Copies the reply's large tensors into `region` while it has room, leaving
// an empty tensor of the same dtype in each one's place (pool thread).
std::vector<PlacedTensor> place_in_region(data::shm::ShmRegion& region, TaskRunner::Reply* reply) {
  std::vector<PlacedTensor> placed;
  for (size_t e = 0; e < reply->elements.size(); ++e) {
    auto& components = reply->elements[e].components;
    for (size_t c = 0; c < components.size(); ++c) {
      const Tensor& t = components[c];
      if (!shm_eligible(t)) continue;
      auto at = region.allocate(t.byte_size());
      if (!at) continue;  // the region is full: this one goes by TCP
      std::memcpy(region.at(*at), t.data(), t.byte_size());
      placed.push_back(PlacedTensor{static_cast<uint32_t>(e), static_cast<uint32_t>(c), t.dtype(), t.shape(), *at,
                                    t.byte_size()});
      // What the element carries in its place: an empty tensor of the dtype.
      auto empty = Tensor::zeros(t.dtype(), {0});
      if (empty.ok()) components[c] = *empty;
    }
  }
  return placed;
}

}  // namespace

DataWorker::DataWorker(DataWorkerConfig config, DispatcherPeer& dispatcher, kj::Timer& timer,
                       boost::asio::thread_pool& pool, const FunctionRegistry* functions,
                       std::shared_ptr<spdlog::logger> log)
    : config_(std::move(config)),
      dispatcher_(dispatcher),
      timer_(timer),
      pool_(pool),
      functions_(functions),
      log_(std::move(log)),
      splits_(std::make_shared<SplitBridge>()),
      heartbeats_(config_.heartbeat_interval, config_.max_heartbeat_backoff),
      background_(*this) {
  background_.add(serve_splits());
}

DataWorker::~DataWorker() {
  // Pipeline threads waiting for a split return Cancelled now, so joining
  // them here, on the loop, cannot wait for the loop.
  splits_->close();
  auto tasks = tasks_.take_all();
  for (auto& task : tasks) {
    task->cancel_splits();
  }
  tasks.clear();  // an in-flight get_elements may still hold a task; it drops it on the pool
  stats_->tasks.store(0);
}

void DataWorker::taskFailed(kj::Exception&& exception) {
  log_->error("data worker task failed: {}", async::from_exception(exception).to_string());
}

void DataWorker::update_task_gauge() { stats_->tasks.store(static_cast<int64_t>(tasks_.size())); }

// ---- Heartbeats --------------------------------------------------------------

void DataWorker::start(std::string address) {
  address_ = std::move(address);
  background_.add(heartbeat_loop());
}

kj::Promise<void> DataWorker::heartbeat_loop() {
  return heartbeat_once()
      .then([this](Status status) {
        if (status.ok()) {
          bool was_down = heartbeats_.succeeded(heartbeat_asked_);
          if (!heartbeat_ok_once_) {
            log_->info("heartbeating to the dispatcher at {} as {} every {} ms", dispatcher_.address(), address_,
                       config_.heartbeat_interval.count());
            heartbeat_ok_once_ = true;
          } else if (was_down) {
            log_->info("the dispatcher at {} answers heartbeats again", dispatcher_.address());
          }
          // finishTask calls that failed while the dispatcher was away.
          for (int64_t id : tasks_.finishes_to_retry()) report_finished(id);
        } else {
          stats_->heartbeat_failures.fetch_add(1);
          if (heartbeats_.failed()) {
            log_->warn("heartbeat to the dispatcher at {} failed ({}); tasks keep serving, retrying with backoff",
                       dispatcher_.address(), status.to_string());
          }
        }
        return timer_.afterDelay(to_kj(heartbeats_.delay()));
      })
      .then([this]() { return heartbeat_loop(); });
}

kj::Promise<Status> DataWorker::heartbeat_once() {
  return dispatcher_.worker_heartbeat(address_, tasks_.current_ids())
      .then([this](Result<HeartbeatReply> reply) -> Status {
        if (!reply.ok()) return reply.status();
        heartbeat_asked_ = reply->interval;
        if (!reply->new_tasks.empty() || !reply->tasks_to_delete.empty()) {
          log_->debug("heartbeat: {} new task(s), {} to delete", reply->new_tasks.size(),
                      reply->tasks_to_delete.size());
        }
        for (TaskSpec& spec : reply->new_tasks) start_task(std::move(spec));
        for (int64_t id : reply->tasks_to_delete) delete_task(id);
        update_task_gauge();
        return Status::Ok();
      })
      .catch_([](kj::Exception&& e) { return async::from_exception(e); });
}

void DataWorker::end_sent(int64_t task_id) {
  if (!tasks_.mark_finished(task_id)) return;
  log_->info("task {}: end of sequence; telling the dispatcher", task_id);
  report_finished(task_id);
}

void DataWorker::report_finished(int64_t task_id) {
  if (!tasks_.start_finish(task_id)) return;  // one call in flight at a time
  background_.add(dispatcher_.finish_task(address_, task_id)
                      .catch_([](kj::Exception&& e) { return async::from_exception(e); })
                      .then([this, task_id](Status status) {
                        if (status.ok()) {
                          tasks_.finish_done(task_id);
                        } else if (retryable(status)) {
                          tasks_.finish_failed(task_id);
                          log_->debug("finishTask for task {} failed ({}); retrying after the next heartbeat",
                                      task_id, status.to_string());
                        } else {
                          tasks_.finish_done(task_id);
                          log_->warn("the dispatcher refused finishTask for task {}: {}", task_id,
                                     status.to_string());
                        }
                      }));
}

// ---- Tasks -------------------------------------------------------------------

void DataWorker::start_task(TaskSpec spec) {
  const int64_t id = spec.task_id;
  if (!tasks_.assign(id)) return;  // serving or building already
  if (!data::known_compression(spec.compression)) {
    // A newer dispatcher's codec: sent raw (WireCompressor is inactive for
    // it), which every reader understands.
    log_->warn("task {}: unknown compression {}; sending raw", id, data::compression_name(spec.compression));
  }
  log_->info("task {}: job {}, dataset {}, {} mode{}{}; building its pipeline", id, spec.job_id, spec.dataset_id,
             mode_name(spec.mode),
             spec.num_consumers > 0 ? ", " + std::to_string(spec.num_consumers) + " coordinated consumers" : "",
             spec.cross_trainer_cache ? ", cross-trainer cache" : "");
  background_.add(
      async::run_on_pool(pool_,
                       [spec = std::move(spec), config = config_, functions = functions_, bridge = splits_]() {
                         return build_task(spec, config, functions, bridge);
                       })
          .then(
              [this, id](std::shared_ptr<WorkerTask> task) {
                Status error = task->error;
                if (auto dropped = tasks_.built(id, std::move(task))) {
                  destroy_on_pool(pool_, std::move(dropped));  // deleted while building
                } else if (error.ok()) {
                  log_->info("task {}: serving", id);
                } else {
                  log_->error("{}; its consumers get this error", error.to_string());
                }
                update_task_gauge();
              },
              [this, id](kj::Exception&& e) {
                // Not built: the dispatcher assigns it again in a heartbeat reply.
                tasks_.build_failed(id);
                update_task_gauge();
                log_->error("task {}: building failed: {}", id, async::from_exception(e).to_string());
              }));
}

void DataWorker::delete_task(int64_t task_id) {
  chains_.erase(chains_.lower_bound(ChainKey{task_id, INT64_MIN}),
                chains_.lower_bound(ChainKey{task_id + 1, INT64_MIN}));
  if (auto task = tasks_.remove(task_id)) {
    log_->info("task {}: deleted by the dispatcher", task_id);
    destroy_on_pool(pool_, std::move(task));
  }
}

// ---- Splits ------------------------------------------------------------------

kj::Promise<void> DataWorker::serve_splits() {
  return splits_->take().then([this](std::vector<std::shared_ptr<SplitCall>> calls) {
    for (auto& call : calls) background_.add(fetch_split(std::move(call)));
    return serve_splits();
  });
}

kj::Promise<void> DataWorker::fetch_split(std::shared_ptr<SplitCall> call) {
  SplitRequest request{call->job_id, call->split_provider_index, call->task_id, call->sequence};
  return rpc::with_deadline(timer_, dispatcher_.get_split(request), config_.split_retry.attempt_timeout, "getSplit")
      .catch_([](kj::Exception&& e) { return Result<std::optional<Element>>(async::from_exception(e)); })
      .then([this, bridge = splits_, call](Result<std::optional<Element>> split) {
        if (split.ok() && split->has_value()) stats_->splits_fetched.fetch_add(1);
        bridge->answer(call, std::move(split));
      });
}

// ---- Shared memory -----------------------------------------------------------

void DataWorker::shm_regions(const ShmRequest& shm, std::shared_ptr<data::shm::ShmRegion>* use,
                             std::optional<ShmAsk>* ask) {
  const uint64_t client = shm.client;
  if (client == 0) return;
  auto now = std::chrono::steady_clock::now();
  // A consumer that went away (or gave its region up after a failed
  // request) leaves its region idle: the worker's side goes after a while.
  for (auto it = shm_clients_.begin(); it != shm_clients_.end();) {
    it = now - it->second.used > kShmIdle ? shm_clients_.erase(it) : std::next(it);
  }
  auto it = shm_clients_.find(client);
  if (it != shm_clients_.end() && shm.region != 0 && it->second.region->token() == shm.region) {
    it->second.used = now;
    it->second.region->close_fd();  // the consumer has mapped it
    *use = it->second.region;
    return;
  }
  // Only a consumer on this host can map a region; others keep to TCP.
  if (data::shm::boot_id().empty() || shm.boot_id != data::shm::boot_id()) return;
  *ask = ShmAsk{client, shm.region_bytes};
}

std::shared_ptr<data::shm::ShmRegion> DataWorker::shm_offer(const ShmAsk& ask) {
  auto now = std::chrono::steady_clock::now();
  const uint64_t client = ask.client;
  auto it = shm_clients_.find(client);
  // Mapped already (a request sent before the consumer mapped it): no
  // second region. A consumer that gives its region up asks under a new id.
  if (it != shm_clients_.end() && it->second.region->fd() < 0) return nullptr;
  if (it == shm_clients_.end()) {
    if (shm_clients_.size() >= kMaxShmRegions) return nullptr;
    // What ShmRegion::create makes of it (at least kMinBytes), so the total stays under its cap.
    size_t bytes = static_cast<size_t>(
        std::clamp<int64_t>(ask.bytes, static_cast<int64_t>(data::shm::kMinBytes), kMaxShmRegionBytes));
    int64_t total = 0;
    for (const auto& [id, c] : shm_clients_) total += static_cast<int64_t>(c.region->size());
    if (total + static_cast<int64_t>(bytes) > kMaxShmTotalBytes) return nullptr;  // this consumer reads by TCP
    auto created = data::shm::ShmRegion::create(bytes);
    if (!created.ok()) {
      if (!shm_failure_logged_) {
        log_->warn("no shared memory for consumers on this host ({}); they read by TCP", created.status().to_string());
        shm_failure_logged_ = true;
      }
      return nullptr;
    }
    it = shm_clients_.emplace(client, ShmClient{*created, now}).first;
  }
  it->second.used = now;
  return it->second.region;
}

// ---- getElements -------------------------------------------------------------

kj::Promise<Result<ElementsReply>> DataWorker::get_elements(ElementsRequest request) {
  const int64_t task_id = request.task_id;
  std::shared_ptr<WorkerTask> task;
  ElementsReply out;
  switch (tasks_.lookup(task_id, &task)) {
    case TaskTable<WorkerTask>::State::kServing:
      break;
    case TaskTable<WorkerTask>::State::kBuilding:
      return Result<ElementsReply>(std::move(out));  // no elements yet: the consumer asks again
    case TaskTable<WorkerTask>::State::kFinishedAndDeleted:
      out.reply.end_of_sequence = true;
      return Result<ElementsReply>(std::move(out));
    case TaskTable<WorkerTask>::State::kUnknown:
      // A consumer can hear of a task before this worker's next heartbeat
      // does; the code tells it so.
      return Result<ElementsReply>(Status::NotFound("no task " + std::to_string(task_id) + " on this worker"));
  }
  TaskRunner::Request get = std::move(request.get);
  if (get.max_elements <= 0) {
    return Result<ElementsReply>(
        Status::InvalidArgument("maxElements must be positive, got " + std::to_string(get.max_elements)));
  }
  if (get.max_bytes < 0) {
    return Result<ElementsReply>(
        Status::InvalidArgument("maxBytes must not be negative, got " + std::to_string(get.max_bytes)));
  }
  if (get.max_bytes == 0) get.max_bytes = TaskRunner::Request{}.max_bytes;  // the runner's default
  get.wait = config_.get_elements_wait;
  out.job_id = task->job_id;
  if (!task->error.ok()) {
    // The task's pipeline could not be built: the consumer's error to raise.
    out.reply.pipeline_error = task->error;
    return Result<ElementsReply>(std::move(out));
  }

  // A consumer's numbered requests to a task reach the runner in their
  // order, one after the other, however many it keeps in flight: each waits
  // for the one before on the loop (the pool would run them in any order).
  std::optional<ChainKey> key;
  kj::Promise<void> before = kj::READY_NOW;
  if (get.sequence > 0) {
    key = ChainKey{task_id, get.client_id};
    auto it = chains_.find(*key);
    if (it != chains_.end()) before = it->second.tail.addBranch().catch_([](kj::Exception&&) {});
  }
  auto slot = std::make_shared<std::optional<Result<ElementsReply>>>();
  // Shared memory with a consumer on this host: the region this reply's
  // large tensors go to (placed on the pool), or the consumer's ask for one,
  // answered once a reply has a tensor worth it (none for small elements).
  std::shared_ptr<data::shm::ShmRegion> region;
  std::optional<ShmAsk> ask;
  shm_regions(request.shm, &region, &ask);
  auto large = std::make_shared<bool>(false);  // the reply has a tensor for shared memory
  kj::ForkedPromise<void> ran =
      before
          .then([this, task, get, slot, local_consumer = request.local_consumer, region, large,
                 asking = ask.has_value()]() {
            return async::run_on_pool(pool_,
                                    [task, get, local_consumer, region, large, asking]() -> Result<ElementsReply> {
                                      auto reply = task->runner->get(get);
                                      if (!reply.ok()) return reply.status();
                                      ElementsReply served;
                                      served.job_id = task->job_id;
                                      served.from_runner = true;
                                      // Placed in the region the consumer mapped, or,
                                      // with none yet, whether to offer one.
                                      if (region) served.placed = place_in_region(*region, &*reply);
                                      if (!region && asking) *large = has_shm_tensor(*reply);
                                      // What the reply sends compressed (data/compression.h).
                                      served.frames = task->compressor->frames(reply->elements, local_consumer);
                                      served.reply = std::move(*reply);
                                      return served;
                                    })
                .then([slot](Result<ElementsReply> reply) { slot->emplace(std::move(reply)); });
          })
          .fork();
  kj::Promise<void> mine = ran.addBranch();
  uint64_t generation = ++chain_generation_;
  if (key) chains_.insert_or_assign(*key, RequestChain{generation, kj::mv(ran)});
  return mine
      .then([this, key, generation, slot, ask, large]() {
        if (key) {
          auto it = chains_.find(*key);
          if (it != chains_.end() && it->second.generation == generation) chains_.erase(it);  // the last one
        }
        Result<ElementsReply> reply = std::move(**slot);
        if (reply.ok() && ask && *large) reply->offer = shm_offer(*ask);
        return reply;
      })
      .catch_([](kj::Exception&& e) { return Result<ElementsReply>(async::from_exception(e)); });
}

}  // namespace capstan::data_worker
