#include "daemons/data_worker/service.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include "capstan/data/dataset.h"
#include "daemons/data_worker/task_runner.h"
#include "data/compression.h"
#include "rpc/errors.h"
#include "rpc/mailbox.h"
#include "rpc/pool.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

#include <unistd.h>

#include <cstring>

namespace capstan::data_service {
namespace {

// How long a DYNAMIC task keeps asking for its next split while the
// dispatcher is unreachable (a restart takes a few seconds).
constexpr std::chrono::seconds kSplitRetryWindow{30};
// One getSplit attempt on the loop: connecting plus the call.
constexpr std::chrono::seconds kSplitAttemptTimeout{10};
constexpr std::chrono::seconds kCallTimeout{10};
constexpr std::chrono::seconds kConnectTimeout{5};
constexpr std::chrono::milliseconds kMaxHeartbeatBackoff{5000};
// How long getElements waits for a first element before answering with none.
constexpr std::chrono::milliseconds kGetElementsWait{100};
// Shared-memory regions: at most this many consumers at once, each region
// at most this large, dropped after this long without a request.
constexpr size_t kMaxShmRegions = 32;
constexpr int64_t kMaxShmRegionBytes = int64_t{1} << 30;
// All regions together: consumers that never release their records (or
// pretend to have mapped a region) cannot pin more of the host than this.
constexpr int64_t kMaxShmTotalBytes = int64_t{4} << 30;
constexpr std::chrono::seconds kShmIdle{60};

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

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
// on a condition variable), so the service may join pipeline threads
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
    auto& mailbox = rpc::Mailbox::current();
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
    std::shared_ptr<rpc::MailboxRemote> remote;
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
  RemoteSplitProvider(std::shared_ptr<SplitBridge> bridge, int64_t job_id, int64_t index, int64_t task_id)
      : bridge_(std::move(bridge)), job_id_(job_id), index_(index), task_id_(task_id) {}

  // Retries while the dispatcher is unreachable, for up to kSplitRetryWindow,
  // so that a dispatcher restart does not end the task.
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);  // one request at a time: numbers stay in order
    if (ended_) return std::optional<Element>();
    auto give_up = std::chrono::steady_clock::now() + kSplitRetryWindow;
    std::chrono::milliseconds backoff{100};
    while (true) {
      // A little longer than the loop's own deadline, which answers first.
      auto result = bridge_->call(job_id_, index_, task_id_, sequence_, cancelled_,
                                  kSplitAttemptTimeout + std::chrono::seconds(5));
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
        return status.with_context("getting a split of job " + std::to_string(job_id_) + " from the dispatcher");
      }
      if (!bridge_->sleep(backoff, cancelled_)) return Status::Cancelled("the task is being removed");
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
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
  const int64_t job_id_;
  const int64_t index_;
  const int64_t task_id_;
  std::atomic<bool> cancelled_{false};
  Mutex mutex_;
  int64_t sequence_ GUARDED_BY(mutex_) = 0;  // the next request's number
  bool ended_ GUARDED_BY(mutex_) = false;    // the dispatcher said endOfSplits
};

// What the pool needs from a TaskDef to build its pipeline.
struct TaskSpec {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string dataset_id;
  std::string definition;
  wire::ProcessingMode mode = wire::ProcessingMode::OFF;
  int64_t num_consumers = 0;
  bool cross_trainer_cache = false;
  int64_t cross_trainer_cache_bytes = 0;
  int64_t num_split_providers = 0;
  int64_t memory_budget = 0;  // the worker's task_memory_mib, in bytes
  wire::ElementCompression compression = wire::ElementCompression::AUTO;
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
std::shared_ptr<WorkerTask> build_task(const TaskSpec& spec, const FunctionRegistry* functions,
                                       const std::shared_ptr<SplitBridge>& bridge, int64_t buffer_bytes) {
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
    if (job_options.memory_budget <= 0 || job_options.memory_budget > spec.memory_budget) {
      job_options.memory_budget = spec.memory_budget;
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
        task->splits.push_back(std::make_unique<RemoteSplitProvider>(bridge, spec.job_id, k, spec.task_id));
        providers.push_back(task->splits.back().get());
      }
      CAPSTAN_ASSIGN_OR_RETURN(iterator, dataset.make_iterator(functions, std::move(providers)));
    } else {
      CAPSTAN_ASSIGN_OR_RETURN(iterator, dataset.make_iterator(functions));
    }
    TaskRunner::Options options;
    options.buffer_bytes = buffer_bytes;
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

Result<DataWorkerConfig> DataWorkerConfig::from(const daemon::Config& config) {
  for (const char* key : {"heartbeat_interval_ms", "element_buffer_mib", "task_memory_mib"}) {
    if (config.get_int(key) <= 0) {
      return Status::InvalidArgument(std::string(key) + ": " + std::to_string(config.get_int(key)) +
                                     " must be positive");
    }
  }
  DataWorkerConfig out;
  out.heartbeat_interval = std::chrono::milliseconds(config.get_int("heartbeat_interval_ms"));
  out.element_buffer_bytes = config.get_int("element_buffer_mib") << 20;
  if (config.get_int("task_memory_mib") > (int64_t{1} << 40)) {
    return Status::InvalidArgument("task_memory_mib: " + std::to_string(config.get_int("task_memory_mib")) +
                                   " is more than 2^40 MiB");
  }
  out.task_memory_bytes = config.get_int("task_memory_mib") << 20;
  return out;
}

DataWorkerService::JobCounters& DataWorkerService::job_counters(int64_t job_id) {
  auto it = job_counters_.find(job_id);
  if (it != job_counters_.end()) return it->second;
  // At most kMaxJobSeries jobs get series of their own; later ones share
  // job="other", so a worker serving many short jobs keeps /metrics bounded.
  constexpr size_t kMaxJobSeries = 64;
  const bool own = job_counters_.size() < kMaxJobSeries;
  const daemon::MetricLabels job = {{"job", own ? std::to_string(job_id) : std::string("other")}};
  JobCounters counters{
      ctx_.metrics.counter("capstan_data_worker_job_elements_served_total", "Elements sent to consumers, by job.", job),
      ctx_.metrics.counter("capstan_data_worker_job_bytes_served_total", "Bytes of elements sent, by job.", job),
      ctx_.metrics.counter("capstan_data_worker_job_starved_requests_total",
                           "Requests that waited and got no element (the pipeline is behind its consumers), by job.",
                           job)};
  if (!own) {
    if (!other_job_counters_) other_job_counters_ = counters;
    return *other_job_counters_;
  }
  return job_counters_.emplace(job_id, counters).first->second;
}

DataWorkerService::DataWorkerService(daemon::DaemonContext& ctx)
    : NodeService(ctx),
      config_(DataWorkerConfig::from(ctx.config).value()),  // checked by main() before
      heartbeat_interval_(config_.heartbeat_interval),
      element_buffer_bytes_(config_.element_buffer_bytes),
      elements_served_(ctx.metrics.counter("capstan_data_worker_elements_served_total",
                                           "Elements sent to consumers by getElements.")),
      bytes_served_(ctx.metrics.counter("capstan_data_worker_bytes_served_total",
                                        "Bytes of the elements sent to consumers.")),
      heartbeat_failures_(ctx.metrics.counter("capstan_data_worker_heartbeat_failures_total",
                                              "Heartbeats to the dispatcher that failed.")),
      splits_fetched_(ctx.metrics.counter("capstan_data_worker_splits_fetched_total",
                                          "Splits of DYNAMIC tasks received from the dispatcher.")),
      shm_bytes_(ctx.metrics.counter("capstan_data_worker_shm_bytes_total",
                                     "Bytes of tensors sent through consumers' shared-memory regions "
                                     "(data/shm_region.h).")),
      compressed_raw_bytes_(ctx.metrics.counter("capstan_data_worker_compressed_raw_bytes_total",
                                                "Bytes of the tensors sent compressed (data/compression.h).")),
      compressed_wire_bytes_(ctx.metrics.counter("capstan_data_worker_compressed_wire_bytes_total",
                                                 "What those tensors took on the wire, compressed.")),
      tasks_gauge_(ctx.metrics.gauge("capstan_data_worker_tasks", "Tasks on this worker (building included).")),
      splits_(std::make_shared<SplitBridge>()),
      heartbeats_(heartbeat_interval_, kMaxHeartbeatBackoff),
      background_(*this) {
  using Plot = daemon::StatusBoard::Plot;
  ctx.status.plot("elements/s served", Plot::kRate, [c = elements_served_]() { return c->value(); });
  ctx.status.plot("MB/s served", Plot::kRate, [c = bytes_served_]() { return c->value() / 1e6; });
  ctx.status.plot("tasks", Plot::kLevel, [g = tasks_gauge_]() { return g->value(); });
  std::string address;
  for (const auto& peer : ctx.peers) {
    if (peer.role == wire::Role::DATA_DISPATCHER) address = peer.address;
  }
  dispatcher_ = kj::heap<rpc::Connection>(ctx.loop->io(), ctx.loop->timer(), address, ctx.peer_options);
  background_.add(heartbeat_loop());
  background_.add(serve_splits());
}

DataWorkerService::~DataWorkerService() {
  // Pipeline threads waiting for a split return Cancelled now, so joining
  // them here, on the loop, cannot wait for the loop.
  splits_->close();
  auto tasks = tasks_.take_all();
  for (auto& task : tasks) {
    task->cancel_splits();
  }
  tasks.clear();  // an in-flight getElements may still hold a task; it drops it on the pool
  tasks_gauge_->set(0);
}

void DataWorkerService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("data worker task failed: {}", rpc::from_exception(exception).to_string());
}

void DataWorkerService::update_task_gauge() { tasks_gauge_->set(static_cast<double>(tasks_.size())); }

// ---- Heartbeats --------------------------------------------------------------

kj::Promise<void> DataWorkerService::heartbeat_loop() {
  kj::Timer& timer = ctx_.loop->timer();
  if (address_.empty()) {
    // The daemon learns its advertised address after the service is built
    // and becomes ready (the dispatcher reachable) only after that, so the
    // address is safe to read once ready() is true.
    if (!ctx_.identity.ready()) {
      if (!waiting_logged_) {
        ctx_.log->info("waiting for the dispatcher at {} before the first heartbeat", dispatcher_->address());
        waiting_logged_ = true;
      }
      return timer.afterDelay(50 * kj::MILLISECONDS).then([this]() { return heartbeat_loop(); });
    }
    address_ = ctx_.identity.rpc_address();
  }
  return heartbeat_once()
      .then(
          [this]() {
            bool was_down = heartbeats_.succeeded();
            if (!heartbeat_ok_once_) {
              ctx_.log->info("heartbeating to the dispatcher at {} as {} every {} ms", dispatcher_->address(), address_,
                             heartbeat_interval_.count());
              heartbeat_ok_once_ = true;
            } else if (was_down) {
              ctx_.log->info("the dispatcher at {} answers heartbeats again", dispatcher_->address());
            }
            // finishTask calls that failed while the dispatcher was away.
            for (int64_t id : tasks_.finishes_to_retry()) report_finished(id);
          },
          [this](kj::Exception&& e) {
            heartbeat_failures_->inc();
            if (heartbeats_.failed()) {
              ctx_.log->warn("heartbeat to the dispatcher at {} failed ({}); tasks keep serving, retrying with backoff",
                             dispatcher_->address(), rpc::from_exception(e).to_string());
            }
          })
      .then([this]() { return ctx_.loop->timer().afterDelay(to_kj(heartbeats_.delay())); })
      .then([this]() { return heartbeat_loop(); });
}

kj::Promise<void> DataWorkerService::heartbeat_once() {
  kj::Timer& timer = ctx_.loop->timer();
  return dispatcher_->service<wire::DataDispatcher>(timer.now() + to_kj(kConnectTimeout))
      .then([this](wire::DataDispatcher::Client dispatcher) {
        auto request = dispatcher.workerHeartbeatRequest();
        request.setWorkerAddress(address_);
        std::vector<int64_t> ids = tasks_.current_ids();
        auto list = request.initCurrentTasks(static_cast<unsigned>(ids.size()));
        for (unsigned i = 0; i < ids.size(); ++i) list.set(i, ids[i]);
        return rpc::with_deadline(
            ctx_.loop->timer(),
            kj::Promise<capnp::Response<wire::DataDispatcher::WorkerHeartbeatResults>>(request.send()), kCallTimeout,
            "workerHeartbeat");
      })
      .then([this](capnp::Response<wire::DataDispatcher::WorkerHeartbeatResults>&& response) {
        auto added = response.getNewTasks();
        auto removed = response.getTasksToDelete();
        if (added.size() > 0 || removed.size() > 0) {
          ctx_.log->debug("heartbeat: {} new task(s), {} to delete", added.size(), removed.size());
        }
        for (auto def : added) start_task(def);
        for (int64_t id : removed) delete_task(id);
        update_task_gauge();
      });
}

void DataWorkerService::report_finished(int64_t task_id) {
  if (!tasks_.start_finish(task_id)) return;  // one call in flight at a time
  kj::Timer& timer = ctx_.loop->timer();
  background_.add(
      dispatcher_->service<wire::DataDispatcher>(timer.now() + to_kj(kConnectTimeout))
          .then([this, task_id](wire::DataDispatcher::Client dispatcher) {
            auto request = dispatcher.finishTaskRequest();
            request.setWorkerAddress(address_);
            request.setTaskId(task_id);
            return rpc::with_deadline(
                ctx_.loop->timer(),
                kj::Promise<capnp::Response<wire::DataDispatcher::FinishTaskResults>>(request.send()), kCallTimeout,
                "finishTask");
          })
          .then(
              [this, task_id](capnp::Response<wire::DataDispatcher::FinishTaskResults>&&) {
                tasks_.finish_done(task_id);
              },
              [this, task_id](kj::Exception&& e) {
                Status status = rpc::from_exception(e);
                if (retryable(status)) {
                  tasks_.finish_failed(task_id);
                  ctx_.log->debug("finishTask for task {} failed ({}); retrying after the next heartbeat", task_id,
                                  status.to_string());
                  return;
                }
                tasks_.finish_done(task_id);
                ctx_.log->warn("the dispatcher refused finishTask for task {}: {}", task_id, status.to_string());
              }));
}

// ---- Tasks -------------------------------------------------------------------

void DataWorkerService::start_task(wire::TaskDef::Reader def) {
  int64_t id = def.getTaskId();
  if (!tasks_.assign(id)) return;  // serving or building already
  TaskSpec spec;
  spec.task_id = id;
  spec.job_id = def.getJobId();
  spec.dataset_id = text(def.getDatasetId());
  spec.definition.assign(reinterpret_cast<const char*>(def.getDefinition().begin()), def.getDefinition().size());
  spec.mode = def.getProcessingMode();
  spec.num_consumers = def.getNumConsumers();
  spec.cross_trainer_cache = def.getCrossTrainerCache();
  spec.cross_trainer_cache_bytes = def.getCrossTrainerCacheBytes();
  spec.num_split_providers = def.getNumSplitProviders();
  spec.compression = def.getCompression();
  if (!data::known_compression(spec.compression)) {
    // A newer dispatcher's codec: sent raw (WireCompressor is inactive for
    // it), which every reader understands.
    ctx_.log->warn("task {}: unknown compression {}; sending raw", id, data::compression_name(spec.compression));
  }
  ctx_.log->info("task {}: job {}, dataset {}, {} mode{}{}; building its pipeline", id, spec.job_id,
                 spec.dataset_id, mode_name(spec.mode),
                 spec.num_consumers > 0 ? ", " + std::to_string(spec.num_consumers) + " coordinated consumers" : "",
                 spec.cross_trainer_cache ? ", cross-trainer cache" : "");
  const FunctionRegistry* functions = ctx_.functions;
  std::shared_ptr<SplitBridge> bridge = splits_;
  int64_t buffer_bytes = element_buffer_bytes_;
  spec.memory_budget = config_.task_memory_bytes;
  background_.add(
      rpc::run_on_pool(ctx_.pool,
                       [spec = std::move(spec), functions, bridge, buffer_bytes]() {
                         return build_task(spec, functions, bridge, buffer_bytes);
                       })
          .then(
              [this, id](std::shared_ptr<WorkerTask> task) {
                Status error = task->error;
                if (auto dropped = tasks_.built(id, std::move(task))) {
                  destroy_on_pool(ctx_.pool, std::move(dropped));  // deleted while building
                } else if (error.ok()) {
                  ctx_.log->info("task {}: serving", id);
                } else {
                  ctx_.log->error("{}; its consumers get this error", error.to_string());
                }
                update_task_gauge();
              },
              [this, id](kj::Exception&& e) {
                // Not built: the dispatcher assigns it again in a heartbeat reply.
                tasks_.build_failed(id);
                update_task_gauge();
                ctx_.log->error("task {}: building failed: {}", id, rpc::from_exception(e).to_string());
              }));
}

void DataWorkerService::delete_task(int64_t task_id) {
  chains_.erase(chains_.lower_bound(ChainKey{task_id, INT64_MIN}), chains_.lower_bound(ChainKey{task_id + 1, INT64_MIN}));
  if (auto task = tasks_.remove(task_id)) {
    ctx_.log->info("task {}: deleted by the dispatcher", task_id);
    destroy_on_pool(ctx_.pool, std::move(task));
  }
}

// ---- Splits ------------------------------------------------------------------

kj::Promise<void> DataWorkerService::serve_splits() {
  return splits_->take().then([this](std::vector<std::shared_ptr<SplitCall>> calls) {
    for (auto& call : calls) background_.add(fetch_split(std::move(call)));
    return serve_splits();
  });
}

kj::Promise<void> DataWorkerService::fetch_split(std::shared_ptr<SplitCall> call) {
  kj::Timer& timer = ctx_.loop->timer();
  auto fetched = dispatcher_->service<wire::DataDispatcher>(timer.now() + to_kj(kConnectTimeout))
                     .then([call](wire::DataDispatcher::Client dispatcher) {
                       auto request = dispatcher.getSplitRequest();
                       request.setJobId(call->job_id);
                       request.setRepetition(0);
                       request.setSplitProviderIndex(call->split_provider_index);
                       request.setTaskId(call->task_id);
                       request.setSequence(call->sequence);
                       return request.send();
                     })
                     .then([](capnp::Response<wire::DataDispatcher::GetSplitResults>&& response)
                               -> kj::Promise<std::optional<Element>> {
                       if (response.getEndOfSplits()) return std::optional<Element>();
                       return rpc::read_element(response.getSplit()).then([](Element&& split) {
                         return std::optional<Element>(std::move(split));
                       });
                     });
  std::shared_ptr<SplitBridge> bridge = splits_;
  return rpc::with_deadline(timer, kj::mv(fetched), kSplitAttemptTimeout, "getSplit")
      .then(
          [this, bridge, call](std::optional<Element>&& split) {
            if (split.has_value()) splits_fetched_->inc();
            bridge->answer(call, std::move(split));
          },
          [bridge, call](kj::Exception&& e) { bridge->answer(call, rpc::from_exception(e)); });
}

// ---- getElements -------------------------------------------------------------


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

void DataWorkerService::shm_regions(wire::GetElementsRequest::Shm::Reader shm,
                                    std::shared_ptr<data::shm::ShmRegion>* use, std::optional<ShmAsk>* ask) {
  const uint64_t client = shm.getClient();
  if (client == 0) return;
  auto now = std::chrono::steady_clock::now();
  // A consumer that went away (or gave its region up after a failed
  // request) leaves its region idle: the worker's side goes after a while.
  for (auto it = shm_clients_.begin(); it != shm_clients_.end();) {
    it = now - it->second.used > kShmIdle ? shm_clients_.erase(it) : std::next(it);
  }
  auto it = shm_clients_.find(client);
  if (it != shm_clients_.end() && shm.getRegion() != 0 && it->second.region->token() == shm.getRegion()) {
    it->second.used = now;
    it->second.region->close_fd();  // the consumer has mapped it
    *use = it->second.region;
    return;
  }
  // Only a consumer on this host can map a region; others keep to TCP.
  if (data::shm::boot_id().empty() || text(shm.getBootId()) != data::shm::boot_id()) return;
  *ask = ShmAsk{client, shm.getRegionBytes()};
}

std::shared_ptr<data::shm::ShmRegion> DataWorkerService::shm_offer(const ShmAsk& ask) {
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
        ctx_.log->warn("no shared memory for consumers on this host ({}); they read by TCP", created.status().to_string());
        shm_failure_logged_ = true;
      }
      return nullptr;
    }
    it = shm_clients_.emplace(client, ShmClient{*created, now}).first;
  }
  it->second.used = now;
  return it->second.region;
}

void DataWorkerService::write_shm(wire::DataWorker::GetElementsResults::Builder results,
                                  const std::vector<PlacedTensor>& placed,
                                  const std::shared_ptr<data::shm::ShmRegion>& offer) {
  if (offer) {
    int fd = offer->fd();
    if (fd >= 0) {
      auto o = results.initShmOffer();
      o.setPid(static_cast<int64_t>(getpid()));
      o.setFd(fd);
      o.setToken(offer->token());
      o.setBytes(offer->size());
    }
  }
  if (placed.empty()) return;
  auto list = results.initShmTensors(static_cast<unsigned>(placed.size()));
  for (unsigned i = 0; i < placed.size(); ++i) {
    const PlacedTensor& p = placed[i];
    list[i].setElement(p.element);
    list[i].setComponent(p.component);
    list[i].setDtype(rpc::to_wire(p.dtype));
    auto shape = list[i].initShape(static_cast<unsigned>(p.shape.size()));
    for (unsigned d = 0; d < p.shape.size(); ++d) shape.set(d, p.shape[d]);
    list[i].setOffset(p.offset);
    list[i].setLength(p.length);
  }
}

kj::Promise<void> DataWorkerService::getElements(GetElementsContext context) {
  auto request = context.getParams().getRequest();
  int64_t task_id = request.getTaskId();
  std::shared_ptr<WorkerTask> task;
  switch (tasks_.lookup(task_id, &task)) {
    case TaskTable<WorkerTask>::State::kServing:
      break;
    case TaskTable<WorkerTask>::State::kBuilding:
      return kj::READY_NOW;  // no elements yet: the consumer asks again
    case TaskTable<WorkerTask>::State::kFinishedAndDeleted:
      context.getResults().setEndOfSequence(true);
      return kj::READY_NOW;
    case TaskTable<WorkerTask>::State::kUnknown:
      // A consumer can hear of a task before this worker's next heartbeat
      // does; the code tells it so.
      rpc::throw_status(Status::NotFound("no task " + std::to_string(task_id) + " on this worker"));
  }
  if (request.getMaxElements() <= 0) {
    rpc::throw_status(
        Status::InvalidArgument("maxElements must be positive, got " + std::to_string(request.getMaxElements())));
  }
  if (request.getMaxBytes() < 0) {
    rpc::throw_status(
        Status::InvalidArgument("maxBytes must not be negative, got " + std::to_string(request.getMaxBytes())));
  }
  if (!task->error.ok()) {
    // The task's pipeline could not be built: the consumer's error to raise.
    rpc::status_to_wire(task->error, context.getResults().initPipelineError());
    return kj::READY_NOW;
  }

  TaskRunner::Request get;
  get.consumer_index = request.getConsumerIndex();
  get.round = request.getRoundIndex();
  get.trainer_id = text(request.getTrainerId());
  get.max_elements = request.getMaxElements();
  get.client_id = request.getJobClientId();
  get.sequence = request.getRequestSequence();
  get.received = request.getReceived();
  get.acknowledged = request.getAcknowledged();
  if (request.getMaxBytes() > 0) get.max_bytes = request.getMaxBytes();  // 0: the runner's default
  get.wait = kGetElementsWait;
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
  auto slot = std::make_shared<std::optional<Result<TaskRunner::Reply>>>();
  // What the reply sends compressed (data/compression.h), decided and
  // compressed on the pool.
  auto frames = std::make_shared<std::vector<data::ElementFrames>>();
  const bool local_consumer = request.getLocalConsumer();
  // At most what this worker's own reader takes in one message.
  const uint64_t inline_limit = std::min<uint64_t>(request.getInlineLimit(), ctx_.codec.whole_chunk_limit);
  // Shared memory with a consumer on this host: the region this reply's
  // large tensors go to (placed on the pool), or the consumer's ask for one,
  // answered once a reply has a tensor worth it (none for small elements).
  std::shared_ptr<data::shm::ShmRegion> region;
  std::optional<ShmAsk> ask;
  shm_regions(request.getShm(), &region, &ask);
  auto placed = std::make_shared<std::vector<PlacedTensor>>();
  auto large = std::make_shared<bool>(false);  // the reply has a tensor for shared memory
  kj::ForkedPromise<void> ran = before
                                    .then([this, task, get, slot, frames, local_consumer, region, placed, large,
                                           asking = ask.has_value()]() {
                                      return rpc::run_on_pool(ctx_.pool, [task, get, frames, local_consumer, region,
                                                                          placed, large, ask = asking]() {
                                               auto reply = task->runner->get(get);
                                               // Placed in the region the consumer mapped, or, with
                                               // none yet, whether to offer one.
                                               if (reply.ok() && region) *placed = place_in_region(*region, &*reply);
                                               if (reply.ok() && !region && ask) *large = has_shm_tensor(*reply);
                                               if (reply.ok()) *frames = task->compressor->frames(reply->elements, local_consumer);
                                               return reply;
                                             })
                                          .then([slot](Result<TaskRunner::Reply> reply) { slot->emplace(std::move(reply)); });
                                    })
                                    .fork();
  kj::Promise<void> mine = ran.addBranch();
  uint64_t generation = ++chain_generation_;
  if (key) chains_.insert_or_assign(*key, RequestChain{generation, kj::mv(ran)});
  return mine
      .then([this, key, generation, slot]() {
        if (key) {
          auto it = chains_.find(*key);
          if (it != chains_.end() && it->second.generation == generation) chains_.erase(it);  // the last one
        }
        return std::move(**slot);
      })
      .then([this, context, task_id, job_id = task->job_id, frames, placed, ask, large,
             inline_limit](Result<TaskRunner::Reply> reply) mutable {
        if (!reply.ok()) rpc::throw_status(reply.status());
        auto results = context.getResults();
        auto list = results.initElements(static_cast<unsigned>(reply->elements.size()));
        double bytes = 0;
        // An element goes inline when it fits in what is left of what the
        // consumer takes inline; the others' large tensors as ByteSources.
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(ctx_.codec, &references);
        const rpc::CodecOptions inline_codec = rpc::answer_codec(codec, inline_limit);
        uint64_t inline_bytes = 0;
        for (unsigned i = 0; i < reply->elements.size(); ++i) {
          const data::ElementFrames& compressed = (*frames)[i];  // one per element (WireCompressor::frames)
          const uint64_t size = reply->elements[i].byte_size();
          const bool fits = size <= inline_limit - inline_bytes;
          if (fits) inline_bytes += size;
          data::write_element(list[i], reply->elements[i], compressed, fits ? inline_codec : codec);
          bytes += static_cast<double>(size);
          for (const auto& frame : compressed) {
            if (frame == nullptr) continue;
            compressed_raw_bytes_->inc(static_cast<double>(frame->raw_size));
            compressed_wire_bytes_->inc(static_cast<double>(frame->size));
          }
        }
        write_shm(results, *placed, ask && *large ? shm_offer(*ask) : nullptr);
        for (const PlacedTensor& p : *placed) {
          bytes += static_cast<double>(p.length);
          shm_bytes_->inc(static_cast<double>(p.length));
        }
        results.setEndOfSequence(reply->end_of_sequence);
        if (!reply->pipeline_error.ok()) rpc::status_to_wire(reply->pipeline_error, results.initPipelineError());
        elements_served_->inc(static_cast<double>(reply->elements.size()));
        bytes_served_->inc(bytes);
        JobCounters& job = job_counters(job_id);
        job.elements->inc(static_cast<double>(reply->elements.size()));
        job.bytes->inc(bytes);
        // A consumer waited and got nothing: the job is input-bound here.
        if (reply->elements.empty() && !reply->end_of_sequence) job.starved->inc();
        if (reply->end_of_sequence && tasks_.mark_finished(task_id)) {
          ctx_.log->info("task {}: end of sequence; telling the dispatcher", task_id);
          report_finished(task_id);
        }
      });
}

}  // namespace capstan::data_service
