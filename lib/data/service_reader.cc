#include "data/service_reader.h"
#include "data/iterator_state.h"

#include <capnp/message.h>
#include <kj/async.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "capstan/client.h"
#include "capstan/data/service.h"
#include "capstan/trace.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "capstan_schemas/data_worker.capnp.h"
#include "data/compression.h"
#include "data/definition.h"
#include "data/shm_region.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "rpc/errors.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

namespace capstan::data::service {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How long every task of a first-come read may have ended, the job not, before
// the tasks are asked again (the dispatcher says the job finished within a
// heartbeat or two of the last end).
constexpr std::chrono::seconds kAskEndedTasksAfter{1};

constexpr uint8_t kMaxProcessingMode = static_cast<uint8_t>(wire::ProcessingMode::HINT);
// Largest reply a worker should send (it always sends at least one element).
constexpr int64_t kMaxReplyBytes = 16 << 20;
// The same, once the worker's shared-memory region is mapped: the tensors
// in it do not cross the socket, and smaller replies keep the records in
// flight few, so that the worker's ring (which goes back to its front once
// it can) cycles through pages still in the CPU's caches. Measured with
// data_service_bench (1 MiB elements, 3 alternated runs): with 2 requests
// in flight, 16 MiB replies ~15 GB/s, 8 MiB ~17.5 GB/s, 4 MiB ~16.8 GB/s;
// with 1 (as now, see fetch_windowed), 16 MiB 23.7 and 8 MiB 24.3 GB/s
// (medians of 5).
constexpr int64_t kMaxSharedMemoryReplyBytes = 8 << 20;
// What a data worker keeps unacknowledged per consumer and task
// (TaskRunner::kMaxRequestsInFlight).
constexpr int kMaxOutstandingRequests = 16;
constexpr int64_t kMaxSharedMemoryBytes = int64_t{16} << 30;

const char* mode_name(uint8_t mode) {
  switch (mode) {
    case 0: return "off";
    case 1: return "dynamic";
    case 2: return "file";
    case 3: return "data";
    case 4: return "file_or_data";
    case 5: return "hint";
    default: return "invalid";
  }
}

// Worth another try later: the peer is away, slow or busy.
bool transient(StatusCode code) {
  return code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded ||
         code == StatusCode::kResourceExhausted;
}

// A reply's tensor in shared memory, to put in its element's place.
struct ShmPlaced {
  uint32_t element;
  uint32_t component;
  Tensor tensor;
};

// The tensors of a reply's shmTensors list, from `view` (the region the
// request named). InvalidArgument for anything that does not fit it.
Status read_shm_tensors(capnp::List<wire::ShmTensor>::Reader list, shm::ShmView* view,
                        std::vector<ShmPlaced>* out) {
  if (list.size() == 0) return Status::Ok();
  if (view == nullptr) {
    return Status::InvalidArgument("a data worker sent " + std::to_string(list.size()) +
                                   " tensor(s) in shared memory for a request that named no region");
  }
  for (auto t : list) {
    Shape shape;
    for (int64_t d : t.getShape()) shape.push_back(d);
    auto tensor = view->tensor(rpc::from_wire(t.getDtype()), shape, t.getOffset(), t.getLength());
    if (!tensor.ok()) return tensor.status().with_context("a data worker's reply");
    out->push_back(ShmPlaced{t.getElement(), t.getComponent(), std::move(*tensor)});
  }
  return Status::Ok();
}

// Puts each placed tensor where its element has an empty placeholder of the
// same dtype.
Status put_shm_tensors(std::vector<Element>* elements, std::vector<ShmPlaced>* placed) {
  for (ShmPlaced& p : *placed) {
    if (p.element >= elements->size() || p.component >= (*elements)[p.element].components.size()) {
      return Status::InvalidArgument("a data worker's reply puts a shared-memory tensor at element " +
                                     std::to_string(p.element) + ", component " + std::to_string(p.component) +
                                     ", which the reply does not have");
    }
    Tensor& slot = (*elements)[p.element].components[p.component];
    if (slot.dtype() != p.tensor.dtype() || slot.num_elements() != 0) {
      return Status::InvalidArgument("a data worker's reply puts a shared-memory tensor at element " +
                                     std::to_string(p.element) + ", component " + std::to_string(p.component) +
                                     ", whose placeholder is not an empty tensor of its dtype");
    }
    slot = std::move(p.tensor);
  }
  return Status::Ok();
}

// From a worker, NotFound means it has not heard of the task yet (or lost it
// in a restart and will get it back from the dispatcher).
bool worker_transient(StatusCode code) { return transient(code) || code == StatusCode::kNotFound; }

std::string token_or_environment(const std::string& token) {
  if (!token.empty()) return token;
  auto from_env = token_from_environment();
  return from_env.ok() ? *from_env : std::string();
}

rpc::ConnectOptions connect_options(const std::string& token, const std::string& client_name,
                                    uint64_t max_message_bytes) {
  rpc::ConnectOptions options;
  options.token = token;
  options.client_name = client_name;
  options.max_message_bytes = max_message_bytes;
  return options;
}

// Calls `attempt` until it succeeds, fails for good, or `window` has passed,
// sleeping a jittered, doubling backoff between tries.
template <typename T, typename Attempt>
Result<T> retry_transient(std::chrono::milliseconds window, Attempt attempt) {
  static thread_local std::mt19937 rng(std::random_device{}());
  auto deadline = Clock::now() + window;
  std::chrono::milliseconds backoff = 50ms;
  while (true) {
    Result<T> result = attempt();
    if (result.ok() || !transient(result.status().code())) return result;
    auto delay = std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng));
    if (Clock::now() + delay >= deadline) return result;
    std::this_thread::sleep_for(delay);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 1000ms);
  }
}

// One dispatcher call on `loop` (the caller's thread blocks): connects as
// needed until the connect deadline, then bounds the call by `call_timeout`.
template <typename T, typename MakeCall>
Result<T> call_dispatcher(async::LoopThread& loop, rpc::Connection& dispatcher,
                          std::chrono::milliseconds connect_timeout,
                          std::chrono::milliseconds call_timeout, const std::string& what,
                          MakeCall& make_call) {
  try {
    return loop.run_sync([&loop, &dispatcher, connect_timeout, call_timeout, &what,
                          &make_call]() -> kj::Promise<T> {
      auto deadline = loop.timer().now() + connect_timeout.count() * kj::MILLISECONDS;
      auto promise = dispatcher.service<wire::DataDispatcher>(deadline).then(
          [&make_call](wire::DataDispatcher::Client client) { return make_call(client); });
      return rpc::with_deadline<T>(loop.timer(), kj::mv(promise), connect_timeout + call_timeout,
                                   what + " to " + dispatcher.address());
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e).with_context(what + " " + dispatcher.address());
  }
}

// ---- The reader ----------------------------------------------------------------

class ServiceReader final : public engine::IteratorBase {
 public:
  explicit ServiceReader(ReaderConfig config) : config_(std::move(config)) {}
  ~ServiceReader() noexcept override;

  Status get_next(Element* out, bool* end_of_sequence) override;
  // First-come reads of a named job: the job's id and, per task, how many
  // of its elements this reader has handed out (received, less what waits
  // in its queue). A restored reader joins the same job and reports those
  // counts in its first request to each task: a task rebuilt since (its data
  // worker restarted, as when a whole job restarts) replays its splits in
  // the same order and skips exactly those elements (the mechanism that
  // keeps data-worker restarts exactly once).
  Status save(engine::StateWriter& writer) override;
  Status restore(engine::StateReader& reader) override;
  Status can_save() const;

 private:
  struct JobIds {
    int64_t job_id = -1;
    int64_t job_client_id = -1;
  };
  // One getElements reply.
  struct Batch {
    std::vector<Element> elements;
    bool end_of_sequence = false;
    Status pipeline_error;  // the task's pipeline failed (after `elements`)
  };
  // What the consumer thread knows of a task at the start of a pass.
  struct TaskRef {
    int64_t id = 0;
    std::string address;
    bool done = false;
    Clock::time_point retry_at;  // failing: not asked again before this
  };
  struct TaskState {
    std::string address;
    bool done = false;    // the task returned endOfSequence
    bool listed = true;   // in the latest heartbeat's task list
    bool waiting = false;  // its worker was lost and none took it yet (said once)
    std::optional<Clock::time_point> failing_since;  // first failure since the last success
    int failures = 0;              // in a row
    Clock::time_point retry_at;    // failing: not asked again before this
  };

  // Consumer thread.
  Status start();
  Status next_first_come(Element* out, bool* end_of_sequence);
  Status next_round(Element* out, bool* end_of_sequence);
  // The tasks (sorted by id), and whether the job is over: finished at the
  // dispatcher (or `ignore_job_finished`) and every known task done.
  bool snapshot(std::vector<TaskRef>* tasks, bool ignore_job_finished);
  Status fatal();
  void note_result(int64_t task_id, bool failed);
  // Whether the task gave this reader its end.
  void set_done(int64_t task_id, bool done);
  // No task had data: ask for a heartbeat now and back off a little.
  void idle();
  // First-come reads of one task: the number of the last request whose
  // reply (and every earlier one) arrived, and the elements received from
  // the task. The requests in flight (in_flight_) are numbered
  // acknowledged + 1, + 2, ...
  struct Acknowledgement {
    int64_t acknowledged = 0;
    int64_t received = 0;
  };
  // One getElements call, everything copied (it may outlive the caller's
  // frame: requests in flight do).
  struct Call {
    int64_t task_id = 0;
    std::string address;
    int64_t consumer_index = -1;
    int64_t round = -1;
    int max_elements = 1;
    int64_t sequence = 0;  // 0: not numbered
    int64_t acknowledged = 0;
    int64_t received = 0;
  };
  // A read, as a span (capstan/trace.h) around fetch_untraced.
  Result<Batch> fetch(const TaskRef& task, int64_t consumer_index, int64_t round,
                      int max_elements);
  Result<Batch> fetch_untraced(const TaskRef& task, int64_t consumer_index, int64_t round, int max_elements);
  // First-come reads: the task's next reply, keeping
  // config_.max_outstanding_requests requests in flight to it.
  Result<Batch> fetch_windowed(const TaskRef& task, Acknowledgement& ack, const std::string& what);

  // Loop thread.
  kj::Promise<Batch> request_elements(Call call);
  // Shared memory with one worker (data/shm_region.h): the id this reader
  // gave itself for that worker, and the region it mapped. A failed
  // request gives the region up (replies that never arrive hold records);
  // a region that cannot be mapped turns shared memory off for the worker.
  struct WorkerShm {
    uint64_t client = 0;
    std::shared_ptr<shm::ShmView> view;
    bool off = false;
  };
  // Fills a request's shm group; what it names.
  WorkerShm shm_request(const std::string& address, wire::GetElementsRequest::Shm::Builder shm);
  // Maps the region a reply offers.
  void shm_offered(const std::string& address, const WorkerShm& used,
                   const capnp::Response<wire::DataWorker::GetElementsResults>& response);
  void abandon_shm(const std::string& address);
  kj::Promise<void> heartbeat();  // never rejects: failures land in fatal_
  kj::Promise<void> heartbeat_loop();
  // `tasks`: the job's list, or null when the dispatcher said the list it
  // has (known_tasks_) is current.
  void apply_heartbeat(const capnp::List<wire::TaskInfo>::Reader* tasks, bool job_finished);
  rpc::Connection& worker(const std::string& address);
  // Whether the worker shares this host (data::is_local_address, cached):
  // AUTO compression sends raw to it.
  bool local_worker(const std::string& address);

  // Constant after construction (token_ after start()).
  const ReaderConfig config_;
  std::string token_;

  // Consumer thread only.
  std::unique_ptr<async::LoopThread> loop_;
  bool started_ = false;
  bool ended_ = false;
  JobIds job_;
  std::deque<Element> queue_;        // received, not yet returned
  std::deque<int64_t> queue_tasks_;  // the task each element of queue_ came from
  int64_t restored_job_id_ = -1;     // restore(): the job the state was saved from
  int64_t last_task_id_ = -1;        // first come: the task read last
  std::map<int64_t, Acknowledgement> acks_;  // first come: by task id
  int64_t round_ = 0;                // coordinated reads: the next round
  bool round_in_doubt_ = false;      // a request for round_ failed in transit
  std::chrono::milliseconds idle_backoff_{0};
  // First come: since when every task has ended while the job has not.
  std::optional<Clock::time_point> all_ended_since_;

  // Loop thread only.
  kj::Own<rpc::Connection> dispatcher_;
  std::map<std::string, kj::Own<rpc::Connection>> workers_;
  std::map<std::string, bool> local_workers_;
  // First-come reads: each task's requests in flight, oldest first (see
  // fetch_windowed; they make progress while the consumer thread is away).
  std::map<int64_t, std::deque<kj::Promise<Batch>>> in_flight_;
  std::map<std::string, WorkerShm> shm_;  // by worker address
  kj::Promise<void> heartbeat_loop_ = nullptr;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> wake_;  // cuts the heartbeat wait short
  bool heartbeat_in_flight_ = false;
  // The fingerprint of the task list tasks_ was last listed from (0: none):
  // sent with each heartbeat, so an unchanged list is not sent again.
  uint64_t known_tasks_ = 0;
  // The interval the dispatcher's last reply asked for (0: none). Longer
  // than heartbeat_interval, it paces idle wake-ups too.
  std::chrono::milliseconds asked_interval_{0};

  Mutex mutex_;
  std::map<int64_t, TaskState> tasks_ GUARDED_BY(mutex_);
  bool job_finished_ GUARDED_BY(mutex_) = false;
  Status fatal_ GUARDED_BY(mutex_);
};

ServiceReader::~ServiceReader() noexcept {
  if (!loop_) return;
  try {
    loop_->run_sync([this]() -> kj::Promise<void> {
      heartbeat_loop_ = nullptr;
      wake_ = nullptr;
      if (job_.job_client_id < 0 || !dispatcher_) return kj::READY_NOW;
      // Best effort: the dispatcher forgets the client after its timeout anyway.
      auto deadline = loop_->timer().now() + 1000 * kj::MILLISECONDS;
      int64_t client_id = job_.job_client_id;
      auto release = dispatcher_->service<wire::DataDispatcher>(deadline)
                         .then([client_id](wire::DataDispatcher::Client client) {
                           auto request = client.releaseJobClientRequest();
                           request.setJobClientId(client_id);
                           return request.send().ignoreResult();
                         });
      return rpc::with_deadline<void>(loop_->timer(), kj::mv(release), 2000ms, "releaseJobClient")
          .catch_([](kj::Exception&&) {});
    });
  } catch (const kj::Exception&) {
    // Best effort.
  }
  loop_->run_sync([this]() {
    heartbeat_loop_ = nullptr;
    in_flight_.clear();
    workers_.clear();
    dispatcher_ = nullptr;
  });
  loop_->stop();
}

Status ServiceReader::get_next(Element* out, bool* end_of_sequence) {
  *end_of_sequence = false;
  if (!queue_.empty()) {
    *out = std::move(queue_.front());
    queue_.pop_front();
    queue_tasks_.pop_front();
    return Status::Ok();
  }
  if (ended_) {
    *end_of_sequence = true;
    return Status::Ok();
  }
  if (!started_) CAPSTAN_RETURN_IF_ERROR(start());
  CAPSTAN_RETURN_IF_ERROR(fatal());
  return config_.num_consumers > 0 ? next_round(out, end_of_sequence)
                                   : next_first_come(out, end_of_sequence);
}

Status ServiceReader::start() {
  if (!loop_) {
    token_ = token_or_environment(config_.token);
    loop_ = std::make_unique<async::LoopThread>("capstan-dsreader");
    loop_->run_sync([this]() {
      dispatcher_ = kj::heap<rpc::Connection>(
          loop_->io(), loop_->timer(), config_.address,
          connect_options(token_, config_.client_name, config_.max_message_bytes));
    });
  }
  if (job_.job_client_id < 0) {
    auto make_call = [this](wire::DataDispatcher::Client client) {
      auto request = client.getOrCreateJobRequest();
      auto params = request.initParams();
      params.setDatasetId(config_.dataset_id);
      params.setJobName(config_.job_name);
      params.setProcessingMode(static_cast<wire::ProcessingMode>(config_.processing_mode));
      params.setNumConsumers(config_.num_consumers);
      params.setCrossTrainerCache(config_.cross_trainer_cache);
      params.setCrossTrainerCacheBytes(config_.cross_trainer_cache_bytes);
      return request.send().then(
          [](capnp::Response<wire::DataDispatcher::GetOrCreateJobResults>&& response) {
            return JobIds{response.getJobId(), response.getJobClientId()};
          });
    };
    auto job = retry_transient<JobIds>(config_.connect_timeout, [this, &make_call]() {
      return call_dispatcher<JobIds>(*loop_, *dispatcher_, config_.connect_timeout,
                                     config_.call_timeout, "getOrCreateJob", make_call);
    });
    if (!job.ok()) return job.status();
    if (restored_job_id_ >= 0 && job->job_id != restored_job_id_) {
      return Status::FailedPrecondition(
          "data service: job '" + config_.job_name + "' is job " + std::to_string(job->job_id) +
          " now, not job " + std::to_string(restored_job_id_) + " whose position was saved (the dispatcher "
          "collected it, or lost its work_dir): the saved position cannot be restored");
    }
    job_ = *job;
  }
  // Learn the tasks before the first read, then keep heartbeating.
  loop_->run_sync([this]() { return heartbeat(); });
  CAPSTAN_RETURN_IF_ERROR(fatal());
  loop_->run_sync([this]() { heartbeat_loop_ = heartbeat_loop().eagerlyEvaluate(nullptr); });
  started_ = true;
  return Status::Ok();
}

Status ServiceReader::can_save() const {
  if (config_.num_consumers > 0 || config_.cross_trainer_cache) {
    return Status::FailedPrecondition(
        "data service: coordinated reads and the cross-trainer cache keep their positions on the workers; "
        "their iterators cannot save or restore one");
  }
  if (config_.job_name.empty()) {
    return Status::FailedPrecondition(
        "data service: saving the position of a read needs a named job (ReadOptions::job_name): an anonymous "
        "job ends with its reader, and a restored reader could not join it again");
  }
  return Status::Ok();
}

Status ServiceReader::save(engine::StateWriter& writer) {
  CAPSTAN_RETURN_IF_ERROR(can_save());
  writer.begin("data_service");
  writer.write_int(started_ ? job_.job_id : restored_job_id_);
  writer.write_bool(ended_);
  std::map<int64_t, int64_t> queued;  // by task
  for (int64_t task : queue_tasks_) ++queued[task];
  writer.write_int(static_cast<int64_t>(acks_.size()));
  for (const auto& [task, ack] : acks_) {
    writer.write_int(task);
    writer.write_int(ack.received - queued[task]);
  }
  return Status::Ok();
}

Status ServiceReader::restore(engine::StateReader& reader) {
  CAPSTAN_RETURN_IF_ERROR(can_save());
  CAPSTAN_RETURN_IF_ERROR(reader.begin("data_service"));
  int64_t tasks = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&restored_job_id_, -1, INT64_MAX, "a job id"));
  CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&ended_));
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&tasks, 0, 1 << 20, "a task count"));
  acks_.clear();
  for (int64_t i = 0; i < tasks; ++i) {
    int64_t task = 0;
    int64_t received = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&task, 0, INT64_MAX, "a task id"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&received, 0, INT64_MAX, "an element count"));
    acks_[task] = Acknowledgement{0, received};
  }
  return Status::Ok();
}

Status ServiceReader::fatal() {
  MutexLock lock(mutex_);
  return fatal_;
}

bool ServiceReader::snapshot(std::vector<TaskRef>* tasks, bool ignore_job_finished) {
  MutexLock lock(mutex_);
  tasks->clear();
  bool all_done = true;
  for (const auto& [id, state] : tasks_) {
    tasks->push_back(TaskRef{id, state.address, state.done, state.retry_at});
    all_done = all_done && state.done;
  }
  return all_done && (job_finished_ || (ignore_job_finished && !tasks_.empty()));
}

void ServiceReader::note_result(int64_t task_id, bool failed) {
  MutexLock lock(mutex_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return;
  TaskState& state = it->second;
  if (!failed) {
    state.failing_since.reset();
    state.failures = 0;
    state.retry_at = {};
    return;
  }
  auto now = Clock::now();
  if (!state.failing_since) state.failing_since = now;
  // A failing worker is asked less and less often (50 ms doubling to 2 s),
  // so the healthy ones are read at full speed meanwhile.
  state.failures = std::min(state.failures + 1, 6);
  state.retry_at = now + std::min<std::chrono::milliseconds>(std::chrono::milliseconds(25 << state.failures), 2000ms);
}

void ServiceReader::set_done(int64_t task_id, bool done) {
  MutexLock lock(mutex_);
  auto it = tasks_.find(task_id);
  if (it != tasks_.end()) it->second.done = done;
}

void ServiceReader::idle() {
  loop_->run_sync([this]() {
    if (heartbeat_in_flight_) return;
    KJ_IF_MAYBE(fulfiller, wake_) { (*fulfiller)->fulfill(); }
    wake_ = nullptr;
  });
  idle_backoff_ = std::clamp<std::chrono::milliseconds>(idle_backoff_ * 2, 1ms,
                                                        config_.max_idle_backoff);
  std::this_thread::sleep_for(idle_backoff_);
}

Status ServiceReader::next_first_come(Element* out, bool* end_of_sequence) {
  std::vector<TaskRef> tasks;
  while (true) {
    CAPSTAN_RETURN_IF_ERROR(fatal());
    if (snapshot(&tasks, /*ignore_job_finished=*/false)) {
      ended_ = true;
      *end_of_sequence = true;
      return Status::Ok();
    }
    // Round robin: start after the task read last.
    auto first = std::find_if(tasks.begin(), tasks.end(),
                              [this](const TaskRef& t) { return t.id > last_task_id_; });
    std::rotate(tasks.begin(), first, tasks.end());
    auto now = Clock::now();
    // Every task gave this reader its end, yet the dispatcher has not
    // finished the job for a while: a worker that restarted before its
    // finishTask arrived was given its task again, and the rebuilt task
    // ends only when a consumer asks it (it skips what this reader has).
    // So the ended tasks are asked again, now and then.
    bool ask_ended = false;
    if (!tasks.empty() && std::all_of(tasks.begin(), tasks.end(), [](const TaskRef& t) { return t.done; })) {
      if (!all_ended_since_) all_ended_since_ = now;
      if (now - *all_ended_since_ >= kAskEndedTasksAfter) {
        ask_ended = true;
        all_ended_since_ = now;
      }
    } else {
      all_ended_since_.reset();
    }
    for (const TaskRef& task : tasks) {
      if ((task.done && !ask_ended) || task.retry_at > now) continue;
      auto batch = fetch(task, -1, -1, config_.max_elements_per_request);
      if (!batch.ok()) {
        if (worker_transient(batch.status().code())) {
          note_result(task.id, /*failed=*/true);
          continue;
        }
        // One element's error from the task's pipeline.
        note_result(task.id, /*failed=*/false);
        last_task_id_ = task.id;
        return batch.status();
      }
      note_result(task.id, /*failed=*/false);
      if (batch->end_of_sequence) {
        set_done(task.id, true);
      } else if (task.done) {
        set_done(task.id, false);  // asked again, it had more after all
      }
      if (!batch->pipeline_error.ok() && batch->elements.empty()) {
        last_task_id_ = task.id;
        return batch->pipeline_error;
      }
      if (!batch->elements.empty()) {
        last_task_id_ = task.id;
        idle_backoff_ = 0ms;
        for (auto& element : batch->elements) {
          queue_.push_back(std::move(element));
          queue_tasks_.push_back(task.id);
        }
        *out = std::move(queue_.front());
        queue_.pop_front();
        queue_tasks_.pop_front();
        return Status::Ok();
      }
    }
    idle();
  }
}

Status ServiceReader::next_round(Element* out, bool* end_of_sequence) {
  std::vector<TaskRef> tasks;
  while (true) {
    CAPSTAN_RETURN_IF_ERROR(fatal());
    if (snapshot(&tasks, /*ignore_job_finished=*/true)) {
      ended_ = true;
      *end_of_sequence = true;
      return Status::Ok();
    }
    if (tasks.empty()) {
      idle();
      continue;
    }
    const TaskRef& task = tasks[static_cast<size_t>(round_ % static_cast<int64_t>(tasks.size()))];
    if (task.done) {
      // Every consumer got endOfSequence for this task: all skip it alike.
      ++round_;
      continue;
    }
    if (task.retry_at > Clock::now()) {
      idle();
      continue;
    }
    auto batch = fetch(task, config_.consumer_index, round_, 1);
    if (!batch.ok()) {
      StatusCode code = batch.status().code();
      if (worker_transient(code)) {
        note_result(task.id, /*failed=*/true);
        if (code != StatusCode::kNotFound) round_in_doubt_ = true;
        idle();
        continue;
      }
      note_result(task.id, /*failed=*/false);
      if (code == StatusCode::kFailedPrecondition && round_in_doubt_) {
        // Our element of this round left in a reply that never arrived.
        round_in_doubt_ = false;
        ++round_;
        continue;
      }
      return batch.status();
    }
    note_result(task.id, /*failed=*/false);
    round_in_doubt_ = false;
    if (!batch->pipeline_error.ok()) return batch->pipeline_error;
    if (!batch->elements.empty()) {
      ++round_;
      idle_backoff_ = 0ms;
      *out = std::move(batch->elements.front());
      return Status::Ok();
    }
    if (batch->end_of_sequence) {
      set_done(task.id, true);
      ++round_;
      continue;
    }
    idle();  // the round is not ready yet
  }
}

Result<ServiceReader::Batch> ServiceReader::fetch(const TaskRef& task, int64_t consumer_index,
                                                  int64_t round, int max_elements) {
  // The read in the flight recorder and a trace.
  trace::Span span(trace::Kind::kRead, "getElements", "task " + std::to_string(task.id) + " from " + task.address);
  Result<Batch> batch = fetch_untraced(task, consumer_index, round, max_elements);
  if (!batch.ok()) span.fail(batch.status().to_string());
  return batch;
}

Result<ServiceReader::Batch> ServiceReader::fetch_untraced(const TaskRef& task, int64_t consumer_index,
                                                           int64_t round, int max_elements) {
  std::string what = "getElements (task " + std::to_string(task.id) + ") from " + task.address;
  // Numbered, acknowledged requests, several in flight: first come, without
  // the cross-trainer cache (whose trainers keep their own positions on the
  // worker).
  if (consumer_index < 0 && !config_.cross_trainer_cache) return fetch_windowed(task, acks_[task.id], what);
  Call call;
  call.task_id = task.id;
  call.address = task.address;
  call.consumer_index = consumer_index;
  call.round = round;
  call.max_elements = max_elements;
  try {
    return loop_->run_sync([this, &call]() { return request_elements(call); });
  } catch (const kj::Exception& e) {
    return async::from_exception(e).with_context(what);
  }
}

Result<ServiceReader::Batch> ServiceReader::fetch_windowed(const TaskRef& task, Acknowledgement& ack,
                                                           const std::string& what) {
  const size_t most = static_cast<size_t>(std::max(1, config_.max_outstanding_requests));
  try {
    return loop_->run_sync([this, &task, &ack, most]() -> kj::Promise<Batch> {
      // Through a region this reader mapped, one request at a time: a
      // reply's bytes do not cross the socket, so its round trip is short
      // next to the worker's copy, and a second request in flight only has
      // the worker copy the next reply while the consumer still holds this
      // one, which spreads the ring's records past the CPU's cache (1 MiB
      // elements in data_service_bench: 18.7 -> 24.3 GB/s, medians of 5).
      auto shm = shm_.find(task.address);
      const size_t window = shm != shm_.end() && shm->second.view ? 1 : most;
      // The consumer thread waits in run_sync meanwhile: `ack` and `task`
      // are safe to use until the promise returned here resolves. The
      // window is filled here, when the consumer has used every element it
      // received (its queue is empty), so `acknowledged` also says what it
      // consumed (the worker holds a task's end back until then).
      auto& queue = in_flight_[task.id];
      while (queue.size() < window) {
        Call call;
        call.task_id = task.id;
        call.address = task.address;
        call.max_elements = config_.max_elements_per_request;
        call.sequence = ack.acknowledged + static_cast<int64_t>(queue.size()) + 1;
        call.acknowledged = ack.acknowledged;
        call.received = ack.received;
        queue.push_back(request_elements(kj::mv(call)).eagerlyEvaluate(nullptr));
      }
      kj::Promise<Batch> oldest = kj::mv(queue.front());
      queue.pop_front();
      int64_t task_id = task.id;
      return oldest.then(
          [this, &ack, task_id](Batch&& batch) {
            ++ack.acknowledged;
            ack.received += static_cast<int64_t>(batch.elements.size());
            // The task has no more: the requests after it neither.
            if (batch.end_of_sequence) in_flight_.erase(task_id);
            return kj::mv(batch);
          },
          [this, task_id](kj::Exception&& e) -> Batch {
            // The requests after this one are dropped and sent again, with
            // the same numbers, once this one is: the worker keeps every
            // reply we did not acknowledge.
            in_flight_.erase(task_id);
            kj::throwFatalException(kj::mv(e));
          });
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e).with_context(what);
  }
}

kj::Promise<ServiceReader::Batch> ServiceReader::request_elements(Call call) {
  std::string what = "getElements (task " + std::to_string(call.task_id) + ") from " + call.address;
  auto deadline = loop_->timer().now() + config_.worker_connect_timeout.count() * kj::MILLISECONDS;
  auto promise =
      worker(call.address)
          .service<wire::DataWorker>(deadline)
          .then([this, call](wire::DataWorker::Client client) {
            auto request = client.getElementsRequest();
            auto r = request.initRequest();
            r.setTaskId(call.task_id);
            r.setJobClientId(job_.job_client_id);
            r.setConsumerIndex(call.consumer_index);
            r.setRoundIndex(call.round);
            r.setMaxElements(call.max_elements);
            r.setMaxBytes(kMaxReplyBytes);
            // Tensors inline in the reply, up to half what this reader takes
            // in one message (the rest leaves room for the reply around
            // them): a reply costs one round trip, not one more per tensor
            // to pull it (1 MiB elements over loopback: ~0.82 -> ~0.94 of
            // raw TCP in data_service_bench).
            r.setInlineLimit(config_.max_message_bytes / 2);
            r.setTrainerId(config_.trainer_id);
            r.setLocalConsumer(local_worker(call.address));
            if (call.sequence > 0) {
              r.setRequestSequence(call.sequence);
              r.setAcknowledged(call.acknowledged);
              r.setReceived(call.received);
            }
            WorkerShm used = shm_request(call.address, r.initShm());
            if (used.view) r.setMaxBytes(kMaxSharedMemoryReplyBytes);
            return request.send().then(
                [this, used, address = call.address](capnp::Response<wire::DataWorker::GetElementsResults>&& response) {
                  shm_offered(address, used, response);
                  return std::make_pair(kj::mv(response), used.view);
                });
          })
          .then([](std::pair<capnp::Response<wire::DataWorker::GetElementsResults>, std::shared_ptr<shm::ShmView>>&&
                       received_reply) {
            auto& response = received_reply.first;
            std::shared_ptr<shm::ShmView> view = received_reply.second;
            bool end = response.getEndOfSequence();
            Status pipeline_error;
            // An unknown code (a newer or hostile worker) is UNKNOWN.
            if (response.hasPipelineError()) pipeline_error = rpc::status_from_wire(response.getPipelineError());
            // The tensors in shared memory, read now (the response goes
            // once the elements are read).
            std::vector<ShmPlaced> placed;
            if (response.hasShmTensors()) {
              Status shm_error = read_shm_tensors(response.getShmTensors(), view.get(), &placed);
              if (!shm_error.ok()) return kj::Promise<Batch>(async::to_exception(shm_error));
            }
            auto elements = response.getElements();
            auto reads = kj::heapArrayBuilder<kj::Promise<Element>>(elements.size());
            uint64_t decompressed = 0;  // the reply's compressed tensors, bounded (data/compression.h)
            for (auto element : elements) reads.add(data::read_element(element, &decompressed));
            return kj::joinPromises(reads.finish())
                .then([end, pipeline_error, placed = kj::mv(placed)](kj::Array<Element>&& received) mutable {
                  Batch batch;
                  batch.end_of_sequence = end;
                  batch.pipeline_error = pipeline_error;
                  for (auto& element : received) batch.elements.push_back(std::move(element));
                  Status put = put_shm_tensors(&batch.elements, &placed);
                  if (!put.ok()) async::throw_status(put);
                  return batch;
                })
                .attach(kj::mv(received_reply));
          });
  std::string address = call.address;
  return rpc::with_deadline<Batch>(loop_->timer(), kj::mv(promise),
                                   config_.worker_connect_timeout + config_.call_timeout, what)
      .catch_([this, address](kj::Exception&& e) -> Batch {
        // The replies of this region that will never be read would hold
        // their records for good: start over with a fresh region.
        abandon_shm(address);
        kj::throwFatalException(kj::mv(e));
      });
}

ServiceReader::WorkerShm ServiceReader::shm_request(const std::string& address,
                                                    wire::GetElementsRequest::Shm::Builder shm) {
  if (config_.shared_memory_bytes <= 0) return {};
  WorkerShm& state = shm_[address];
  if (state.off) return {};
  if (state.client == 0) {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    while (state.client == 0) state.client = rng();
  }
  shm.setClient(state.client);
  shm.setBootId(shm::boot_id());
  shm.setRegionBytes(config_.shared_memory_bytes);
  if (state.view) shm.setRegion(state.view->token());
  return state;
}

void ServiceReader::shm_offered(const std::string& address, const WorkerShm& used,
                                const capnp::Response<wire::DataWorker::GetElementsResults>& response) {
  if (!response.hasShmOffer() || used.client == 0) return;
  WorkerShm& state = shm_[address];
  if (state.off || state.client != used.client) return;  // given up meanwhile
  auto offer = response.getShmOffer();
  if (state.view && state.view->token() == offer.getToken()) return;
  auto view = shm::ShmView::open(offer.getPid(), offer.getFd(), offer.getToken(), offer.getBytes());
  if (view.ok()) {
    state.view = *view;
  } else {
    state.off = true;  // not on this host after all, or not reachable: TCP to this worker
    state.view = nullptr;
  }
}

void ServiceReader::abandon_shm(const std::string& address) {
  auto it = shm_.find(address);
  if (it == shm_.end() || it->second.off) return;
  it->second = WorkerShm{};
}

bool ServiceReader::local_worker(const std::string& address) {
  auto it = local_workers_.find(address);
  if (it == local_workers_.end()) it = local_workers_.emplace(address, data::is_local_address(address)).first;
  return it->second;
}

rpc::Connection& ServiceReader::worker(const std::string& address) {
  auto it = workers_.find(address);
  if (it == workers_.end()) {
    it = workers_
             .emplace(address, kj::heap<rpc::Connection>(
                                   loop_->io(), loop_->timer(), address,
                                   connect_options(token_, config_.client_name,
                                                   config_.max_message_bytes)))
             .first;
  }
  return *it->second;
}

kj::Promise<void> ServiceReader::heartbeat() {
  heartbeat_in_flight_ = true;
  auto deadline = loop_->timer().now() + config_.connect_timeout.count() * kj::MILLISECONDS;
  int64_t client_id = job_.job_client_id;
  auto call = dispatcher_->service<wire::DataDispatcher>(deadline)
                  .then([client_id, known = known_tasks_](wire::DataDispatcher::Client client) {
                    auto request = client.clientHeartbeatRequest();
                    request.setJobClientId(client_id);
                    request.setKnownTasks(known);
                    return request.send();
                  })
                  .then([this](capnp::Response<wire::DataDispatcher::ClientHeartbeatResults>&& response) {
                    asked_interval_ = std::chrono::milliseconds(response.getIntervalMs());
                    if (response.getTasksUnchanged() && known_tasks_ != 0) {
                      apply_heartbeat(nullptr, response.getJobFinished());
                      return;
                    }
                    auto tasks = response.getTasks();
                    apply_heartbeat(&tasks, response.getJobFinished());
                    known_tasks_ = response.getTasksFingerprint();
                  });
  return rpc::with_deadline<void>(loop_->timer(), kj::mv(call),
                                  config_.connect_timeout + config_.call_timeout,
                                  "clientHeartbeat to " + config_.address)
      .then([this]() { heartbeat_in_flight_ = false; },
            [this](kj::Exception&& e) {
              heartbeat_in_flight_ = false;
              Status status = async::from_exception(e);
              // A dispatcher that is restarting comes back; anything else
              // (an unknown job client, a refused token) will not.
              if (transient(status.code())) return;
              MutexLock lock(mutex_);
              if (fatal_.ok()) fatal_ = status.with_context("clientHeartbeat to " + config_.address);
            });
}

kj::Promise<void> ServiceReader::heartbeat_loop() {
  kj::Promise<void> next = loop_->timer().afterDelay(
      std::max(config_.heartbeat_interval, asked_interval_).count() * kj::MILLISECONDS);
  // An idle reader may ask early (wake_), unless the dispatcher paces a
  // large job's consumers: then it waits its turn like the rest.
  if (asked_interval_ <= config_.heartbeat_interval) {
    auto wake = kj::newPromiseAndFulfiller<void>();
    wake_ = kj::mv(wake.fulfiller);
    next = next.exclusiveJoin(kj::mv(wake.promise));
  }
  return next
      .then([this]() {
        wake_ = nullptr;
        return heartbeat();
      })
      .then([this]() { return heartbeat_loop(); });
}

void ServiceReader::apply_heartbeat(const capnp::List<wire::TaskInfo>::Reader* listed, bool job_finished) {
  auto now = Clock::now();
  MutexLock lock(mutex_);
  // An unchanged list leaves each task's `listed` as the last list set it.
  if (listed != nullptr) {
    for (auto& [id, state] : tasks_) state.listed = false;
  }
  for (auto info : listed != nullptr ? *listed : capnp::List<wire::TaskInfo>::Reader()) {
    auto [it, added] = tasks_.try_emplace(info.getTaskId());
    TaskState& state = it->second;
    state.listed = true;
    std::string address = info.getWorkerAddress().cStr();
    if (added) {
      state.address = std::move(address);
    } else if (address != state.address) {
      // The dispatcher moved the task off a lost worker: the new one
      // rebuilds it and skips what this reader's next request says it has.
      // Requests still on their way to the old one are dropped (their
      // numbers go again, to the new worker).
      if (in_flight_.erase(it->first) > 0) abandon_shm(state.address);
      state.address = std::move(address);
      state.failing_since.reset();
      state.failures = 0;
      state.retry_at = {};
    }
    const bool waiting = info.getWaitingForWorker();
    if (waiting && !state.waiting) {
      // The reader has no log of its own; this is the line a user sees.
      std::fprintf(stderr,
                   "capstan: data service job %lld: task %lld waits for a live data worker (its worker %s "
                   "stopped heartbeating and none other is alive); start one and it takes the task over\n",
                   static_cast<long long>(job_.job_id), static_cast<long long>(it->first), state.address.c_str());
    }
    state.waiting = waiting;
  }
  // A task the dispatcher dropped goes once it has nothing more for us: it
  // ended, or its worker has failed us for longer than worker_drop_after.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    const TaskState& state = it->second;
    bool gone = !state.listed &&
                (state.done || (state.failing_since &&
                                now - *state.failing_since > config_.worker_drop_after));
    if (gone && in_flight_.erase(it->first) > 0) abandon_shm(state.address);
    it = gone ? tasks_.erase(it) : std::next(it);
  }
  job_finished_ = job_finished;
}

}  // namespace

// ---- The op ---------------------------------------------------------------------

ReaderConfig config_from_op(wire::Op::Reader op) {
  auto d = op.getDataService();
  ReaderConfig config;
  config.address = d.getAddress().cStr();
  config.dataset_id = d.getDatasetId().cStr();
  config.processing_mode = d.getProcessingMode();
  config.job_name = d.getJobName().cStr();
  config.consumer_index = d.getConsumerIndex();
  config.num_consumers = d.getNumConsumers();
  config.trainer_id = d.getTrainerId().cStr();
  config.cross_trainer_cache = d.getCrossTrainerCache();
  config.cross_trainer_cache_bytes = d.getCrossTrainerCacheBytes();
  config.max_elements_per_request = d.getMaxElementsPerRequest();
  config.max_outstanding_requests = d.getMaxOutstandingRequests();
  config.shared_memory_bytes = d.getSharedMemoryBytes();
  config.token = d.getToken().cStr();
  return config;
}

Status validate_data_service(wire::Op::Reader op) {
  auto invalid = [](const std::string& message) {
    return Status::InvalidArgument("data_service: " + message);
  };
  ReaderConfig c = config_from_op(op);
  std::string host;
  uint16_t port = 0;
  Status address = rpc::parse_host_port(c.address, &host, &port);
  if (!address.ok() || host.empty()) {
    return invalid("dispatcher address '" + c.address + "' is not host:port");
  }
  if (c.dataset_id.empty()) return invalid("dataset_id is empty");
  if (c.processing_mode > kMaxProcessingMode) {
    return invalid("unknown processing_mode " + std::to_string(c.processing_mode));
  }
  if (c.num_consumers < 0) {
    return invalid("num_consumers must be >= 0, got " + std::to_string(c.num_consumers));
  }
  if (c.num_consumers > 0) {
    if (c.consumer_index < 0 || c.consumer_index >= c.num_consumers) {
      return invalid("consumer_index must be in [0, " + std::to_string(c.num_consumers) +
                     ") with num_consumers " + std::to_string(c.num_consumers) + ", got " +
                     std::to_string(c.consumer_index));
    }
    if (c.job_name.empty()) return invalid("coordinated reads (num_consumers > 0) need a job_name");
  } else if (c.consumer_index != -1) {
    return invalid("consumer_index " + std::to_string(c.consumer_index) +
                   " is set but num_consumers is not");
  }
  if (c.cross_trainer_cache) {
    if (c.job_name.empty()) return invalid("the cross-trainer cache needs a job_name");
    if (c.trainer_id.empty()) return invalid("the cross-trainer cache needs a trainer_id");
    if (c.cross_trainer_cache_bytes <= 0) {
      return invalid("cross_trainer_cache_bytes must be positive, got " +
                     std::to_string(c.cross_trainer_cache_bytes));
    }
  }
  if (c.max_elements_per_request <= 0) {
    return invalid("max_elements_per_request must be positive, got " +
                   std::to_string(c.max_elements_per_request));
  }
  if (c.max_outstanding_requests < 1 || c.max_outstanding_requests > kMaxOutstandingRequests) {
    return invalid("max_outstanding_requests must be in [1, " + std::to_string(kMaxOutstandingRequests) +
                   "], got " + std::to_string(c.max_outstanding_requests));
  }
  if (c.shared_memory_bytes < 0 || c.shared_memory_bytes > kMaxSharedMemoryBytes) {
    return invalid("shared_memory_bytes must be in [0, " + std::to_string(kMaxSharedMemoryBytes) +
                   "] (0: TCP only), got " + std::to_string(c.shared_memory_bytes));
  }
  return Status::Ok();
}

std::unique_ptr<engine::IteratorBase> make_service_reader(ReaderConfig config) {
  return std::make_unique<ServiceReader>(std::move(config));
}

std::string describe_data_service_args(wire::Op::Reader op) {
  ReaderConfig c = config_from_op(op);
  std::string out = c.address + ", " + c.dataset_id + ", " +
                    mode_name(c.processing_mode);
  if (!c.job_name.empty()) out += ", job=" + c.job_name;
  if (c.num_consumers > 0) {
    out += ", consumer " + std::to_string(c.consumer_index) + " of " + std::to_string(c.num_consumers);
  }
  if (c.cross_trainer_cache) out += ", trainer=" + c.trainer_id;
  return out;
}

// ---- Registration ---------------------------------------------------------------

Result<std::string> register_definition(const std::string& dispatcher_address, const std::string& definition,
                                        const ClientOptions& options, const std::string& compression) {
  std::string host;
  uint16_t port = 0;
  CAPSTAN_RETURN_IF_ERROR(rpc::parse_host_port(dispatcher_address, &host, &port));
  CAPSTAN_RETURN_IF_ERROR(data::parse_compression(compression).status());
  async::LoopThread loop("capstan-register");
  std::string token = token_or_environment(options.token);
  kj::Own<rpc::Connection> dispatcher;
  loop.run_sync([&loop, &dispatcher, &dispatcher_address, &token, &options]() {
    dispatcher = kj::heap<rpc::Connection>(
        loop.io(), loop.timer(), dispatcher_address,
        connect_options(token, options.client_name, options.max_message_bytes));
  });
  auto make_call = [&definition, &compression](wire::DataDispatcher::Client client) {
    auto request = client.registerDatasetRequest();
    request.setDefinition(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
    request.setCompression(compression);
    return request.send().then(
        [](capnp::Response<wire::DataDispatcher::RegisterDatasetResults>&& response) {
          return std::string(response.getDatasetId().cStr());
        });
  };
  auto id = retry_transient<std::string>(options.connect_timeout, [&loop, &dispatcher, &options,
                                                                  &make_call]() {
    return call_dispatcher<std::string>(loop, *dispatcher, options.connect_timeout,
                                        options.call_timeout, "registerDataset", make_call);
  });
  loop.run_sync([&dispatcher]() { dispatcher = nullptr; });
  return id;
}

}  // namespace capstan::data::service
