// ClusterCoordinator's implementation state, shared by the SDK files that
// talk to the coordinator (cluster.cc, strategy.cc). Not installed.
#ifndef CAPSTAN_SDK_SRC_TRAINING_CLUSTER_IMPL_H_
#define CAPSTAN_SDK_SRC_TRAINING_CLUSTER_IMPL_H_

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capstan/trace.h"
#include "capstan/training.h"
#include "async/status_exception.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/sync_channel.h"
#include "sync/mutex.h"
#include "training/variable_router.h"

namespace capstan {

// RemoteValues whose last copy went, by local id: added from any thread
// (where the program drops them), taken on the loop thread. Shared with
// each RemoteValue, which may outlive the ClusterCoordinator.
struct DroppedValues {
  void add(int64_t local) {
    MutexLock lock(mutex);
    locals.push_back(local);
  }
  std::vector<int64_t> take() {
    MutexLock lock(mutex);
    return std::exchange(locals, {});
  }
  Mutex mutex;
  std::vector<int64_t> locals GUARDED_BY(mutex);
};

struct RemoteValue::Holder {
  Holder(std::shared_ptr<DroppedValues> dropped, int64_t local) : dropped(std::move(dropped)), local(local) {}
  ~Holder() { dropped->add(local); }
  const std::shared_ptr<DroppedValues> dropped;
  const int64_t local;
};

struct ClusterCoordinator::Impl {
  Impl(std::string address, ClientOptions options)
      : channel(std::move(address), std::move(options), "capstan-cluster") {
    loop().run_sync([this]() {
      tasks = kj::heap<kj::TaskSet>(task_errors);
      tasks->add(release_timer());
    });
    router = std::make_unique<VariableRouter>(loop(), channel.connect_options(), channel.codec(),
                                              channel.options().call_timeout,
                                              placements_from(channel.connection(), loop().timer()));
  }
  ~Impl() {
    router.reset();
    loop().run_sync([this]() {
      tasks = nullptr;
      pending_schedules.clear();
      pipelined.clear();
      scheduled.clear();
      ack_waiters.clear();
      pending_releases.clear();
    });
  }

  async::LoopThread& loop() { return channel.loop(); }
  rpc::Connection& connection() { return channel.connection(); }
  kj::TimePoint connect_deadline() { return channel.connect_deadline(); }
  template <typename T, typename Make>
  Result<T> call(const std::string& what, Make make, bool bounded = true) {
    return channel.call<T, wire::Coordinator>(what, std::move(make), bounded);
  }

  // ---- Pipelined schedule ----
  // schedule() does not wait for the coordinator's reply, nor for the loop
  // thread: it posts the closure to the loop and returns a local id at once
  // (as TF's schedule returns a RemoteValue). On the loop, the closures
  // posted while it was busy go out together in one scheduleMany call, as
  // soon as the posts are drained; a failed reply is raised by the next
  // schedule/join/done, as closure errors are.
  // A scheduleMany call, from its first closure's schedule() to its answer:
  // until the answer, a fetch of one of its closures goes through its
  // `values` capability (pipelined on the call), not waiting for the
  // closure id; a fetch made before the call is sent waits for `sent`.
  struct SentBatch {
    SentBatch() {
      auto paf = kj::newPromiseAndFulfiller<void>();
      sent = paf.promise.fork();
      on_sent = kj::mv(paf.fulfiller);
    }
    // After the call went out (values set), or failed, or was answered.
    void mark_sent() {
      if (on_sent->isWaiting()) on_sent->fulfill();
    }
    bool was_sent() { return !on_sent->isWaiting(); }
    kj::Maybe<wire::ClosureValues::Client> values;
    kj::ForkedPromise<void> sent = nullptr;
    kj::Own<kj::PromiseFulfiller<void>> on_sent;
    uint32_t size = 0;  // closures in the call
  };
  struct Pipelined {
    std::shared_ptr<SentBatch> batch;
    uint32_t index = 0;
  };
  // Closures per scheduleMany call (the coordinator's limit).
  static constexpr uint32_t kMaxSchedulesPerCall = 4096;
  // A closure's arguments as schedule() hands them to the loop: encoded
  // (rpc::element_to_bytes, on the calling thread), which the coordinator
  // keeps and forwards as they are; or, past the inline limit, the element
  // itself, whose tensors the coordinator pulls in chunks.
  struct Args {
    std::string encoded;
    std::optional<Element> element;
  };
  struct PendingSchedule {
    int64_t local = 0;
    std::string function;
    Args args;
    kj::Own<kj::PromiseFulfiller<int64_t>> id;
    std::shared_ptr<SentBatch> batch;  // the call it goes in
  };
  // Loop thread only.
  // `trace_key` (0: none): the schedule span's flow key, bound to the
  // closure's id when it comes (capstan/trace.h).
  void enqueue_schedule(int64_t local, std::string function, Args args, uint64_t trace_key) {
    auto paf = kj::newPromiseAndFulfiller<int64_t>();
    ++unacked;
    scheduled.emplace(local, Scheduled{paf.promise.fork()});
    if (!dropped_early.empty() && dropped_early.erase(local) > 0) release_local(local, /*dropped=*/true);
    tasks->add(scheduled.at(local).id_promise.addBranch().then(
        [this, local, trace_key](int64_t id) {
          if (trace_key != 0) trace::Recorder::get().bind_flow(trace_key, static_cast<uint64_t>(id));
          schedule_answered(local, id);
          ack();
        },
        [this, local](kj::Exception&& e) {
          record_schedule_error(async::from_exception(e));
          schedule_answered(local, 0);
          ack();
        }));
    // Nothing pending: the flush is not scheduled yet either.
    const bool first = pending_schedules.empty();
    std::shared_ptr<SentBatch> batch = first ? nullptr : pending_schedules.back().batch;
    if (batch == nullptr || batch->size == kMaxSchedulesPerCall) batch = std::make_shared<SentBatch>();
    pipelined[local] = Pipelined{batch, batch->size++};
    pending_schedules.push_back(PendingSchedule{local, std::move(function), std::move(args), kj::mv(paf.fulfiller),
                                                std::move(batch)});
    // After the posts drained in this turn of the loop.
    if (first) tasks->add(kj::evalLater([this]() { flush_schedules(); }));
  }
  void flush_schedules();  // cluster.cc
  kj::Promise<Element> fetch_value(int64_t local);  // cluster.cc

  // ---- Releases (cluster.cc) ----
  // A RemoteValue dropped, or fetched once: its closure id goes to the
  // coordinator with the next scheduleMany call, or in a release call
  // within kReleaseDelay when none goes. A release call (empty if need be)
  // also goes when the coordinator has not heard from this client for
  // kHeartbeat, so that it knows the program lives (client_grace_ms).
  // The entry of a dropped value goes once its id is known and released.
  void release_local(int64_t local, bool dropped);
  // The schedule of `local` was answered: `id`, or 0 for an error.
  void schedule_answered(int64_t local, int64_t id);
  // Takes the RemoteValues dropped since the last call.
  void take_dropped();
  // Up to `max` closure ids to release, taken from pending_releases.
  std::vector<int64_t> take_releases(size_t max);
  // Sends the pending releases in a release call (also when there are
  // none and the coordinator has not heard from this client for a
  // heartbeat period: `heartbeat`).
  void send_releases(bool heartbeat);
  kj::Promise<void> release_timer();
  static constexpr auto kReleaseDelay = 1000 * kj::MILLISECONDS;
  // The coordinator counts on it (Coordinator::kClientHeartbeat, and
  // client_grace_ms must be at least three of them): change both together.
  static constexpr auto kHeartbeat = 5000 * kj::MILLISECONDS;
  static constexpr size_t kMaxReleasesPerCall = 1 << 16;  // the coordinator's limit
  void ack() {
    if (outstanding.fetch_sub(1) >= kMaxOutstanding) outstanding.notify_all();
    if (--unacked == 0) {
      for (auto& w : ack_waiters) w->fulfill();
      ack_waiters.clear();
    }
  }
  kj::Promise<void> all_acked() {
    if (unacked == 0) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    ack_waiters.add(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }
  // Any thread.
  void record_schedule_error(Status error) {
    MutexLock lock(schedule_error_mutex);
    if (schedule_error.ok()) schedule_error = std::move(error);
  }
  Status take_schedule_error() {
    MutexLock lock(schedule_error_mutex);
    Status error = schedule_error;
    schedule_error = Status::Ok();
    return error;
  }

  // A coordinator with a journal (its schedule replies say `durable`) keeps
  // its closures and results across a restart: a call whose link broke is
  // sent again once the client has reconnected (within connect_timeout).
  // Schedules carry (client_id, local id), so a retry never queues twice.
  template <typename T, typename Make>
  kj::Promise<T> retrying(Make make, kj::Maybe<kj::TimePoint> give_up = nullptr) {
    return make().catch_([this, make, give_up](kj::Exception&& e) mutable -> kj::Promise<T> {
      if (e.getType() != kj::Exception::Type::DISCONNECTED || !durable) return kj::mv(e);
      kj::TimePoint now = loop().timer().now();
      kj::TimePoint until = now + channel.options().connect_timeout.count() * kj::MILLISECONDS;
      KJ_IF_MAYBE(t, give_up) { until = *t; }
      if (now >= until) return kj::mv(e);
      return loop().timer().afterDelay(100 * kj::MILLISECONDS).then([this, make, until]() mutable {
        return retrying<T>(kj::mv(make), until);
      });
    });
  }

  struct TaskErrors : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}  // recorded by the tasks themselves
  };

  rpc::SyncChannel channel;
  // Names this client's schedule requests (random, not 0).
  const uint64_t client_id = [] {
    std::random_device random;
    uint64_t id = (static_cast<uint64_t>(random()) << 32) | random();
    return id == 0 ? 1 : id;
  }();
  std::atomic<int64_t> next_local_id{1};
  // Schedules without an answer yet, from schedule() to ack(). schedule()
  // waits while there are kMaxOutstanding: the coordinator answers only
  // while its queue has room (max_queued_closures), so a program that
  // schedules faster than the workers run blocks there, as TF's schedule
  // does when its queue is full, and neither side's memory grows.
  std::atomic<int64_t> outstanding{0};
  static constexpr int64_t kMaxOutstanding = 16384;
  const std::shared_ptr<DroppedValues> dropped = std::make_shared<DroppedValues>();
  // Loop thread only.
  bool durable = false;
  // A schedule() until its RemoteValue is dropped and its release sent.
  struct Scheduled {
    kj::ForkedPromise<int64_t> id_promise;  // the coordinator's closure id
    bool answered = false;
    int64_t id = 0;         // once answered; 0 when the schedule failed
    uint64_t incarnation = 0;  // the coordinator's that answered (see `incarnation`)
    bool released = false;  // dropped, or fetched once: the id is (to be) released
    bool dropped = false;   // no RemoteValue left: forgotten once released
  };
  std::map<int64_t, Scheduled> scheduled;
  std::vector<int64_t> pending_releases;  // closure ids not sent yet, all of `incarnation`
  // The coordinator's incarnation in its last scheduleMany answer: random
  // per process without a journal, whose closure ids start again at 1. An
  // id of another incarnation is not released (it would name another
  // closure); 0: a durable coordinator, whose ids outlive restarts.
  uint64_t incarnation = 0;
  // Queues `entry`'s id for release unless it is of another incarnation.
  void queue_release(const Scheduled& entry);
  // RemoteValues dropped before their schedule() reached the loop (a
  // program that drops the value at once may beat its own post).
  std::set<int64_t> dropped_early;
  bool releasing = false;                 // a release call is on its way
  kj::TimePoint last_heard = kj::origin<kj::TimePoint>();  // the last call carrying client_id
  int64_t unacked = 0;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> ack_waiters;
  std::vector<PendingSchedule> pending_schedules;
  std::map<int64_t, Pipelined> pipelined;  // by local id, from schedule() to the call's answer
  Mutex schedule_error_mutex;
  Status schedule_error GUARDED_BY(schedule_error_mutex);
  TaskErrors task_errors;
  kj::Own<kj::TaskSet> tasks;
  // Closure names the workers have, to refuse unknown ones at schedule().
  Mutex names_mutex;
  std::set<std::string> closure_names GUARDED_BY(names_mutex);
  // Until then schedule() lets any name through unasked: the coordinator
  // had no worker (so no names) when last asked. It checks each name again
  // itself, and its error comes back at the next schedule() or join().
  std::chrono::steady_clock::time_point names_unknown_until GUARDED_BY(names_mutex);
  static constexpr auto kNamesUnknownFor = std::chrono::milliseconds(200);
  std::unique_ptr<VariableRouter> router;
};

}  // namespace capstan

#endif  // CAPSTAN_SDK_SRC_TRAINING_CLUSTER_IMPL_H_
