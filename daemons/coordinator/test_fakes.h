// Fakes for the coordinator's unit tests: workers and parameter servers
// that record what the coordinator asked and answer as the test says,
// CoordinatorParts (what the coordinator's parts share, for testing one part
// alone) and a Harness (an event loop, a manual clock, a coordinator over the
// fakes).
#ifndef CAPSTAN_DAEMONS_COORDINATOR_TEST_FAKES_H_
#define CAPSTAN_DAEMONS_COORDINATOR_TEST_FAKES_H_

#include <kj/async-io.h>
#include <kj/debug.h>
#include <spdlog/sinks/null_sink.h>

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "checkpoint/mirrored_files.h"
#include "checkpoint/shard_files.h"
#include "daemons/coordinator/coordinator.h"
#include "daemons/ps_server/embedding_table.h"
#include "training/initializer.h"
#include "async/mailbox.h"
#include "training/optimizer.h"

namespace capstan::coordinator {
// What a fake parameter server holds for one shard.
struct ShardContents {
  Tensor value;
  std::map<std::string, Tensor> slots;
  int64_t step = 0;
};

}  // namespace capstan::coordinator

namespace capstan::coordinator::testing {

inline Tensor floats(std::vector<float> values, Shape shape) { return Tensor::from_vector(values, shape).value(); }

inline std::vector<float> values_of(const Tensor& t) {
  auto flat = t.flat<float>();
  return {flat.begin(), flat.end()};
}

// What the coordinator did to one fake worker. Owned by the test, so it
// outlives the WorkerPeer the coordinator drops.
struct WorkerRecord {
  struct Run {
    ClosureRun run;
    kj::Own<kj::PromiseFulfiller<ClosureOutcome>> reply;
  };
  std::vector<Run> runs;  // in dispatch order (a batch's runs as each starts)
  std::vector<size_t> batches;  // the size of each run_closures call
  bool answer_pings = true;
  int pings = 0;
  std::vector<int64_t> cancels;  // closure ids, in order
  std::vector<std::pair<int64_t, std::string>> datasets;                      // id, definition
  std::vector<std::tuple<int64_t, std::string, int, int>> function_datasets;  // id, fn, workers, index
  std::vector<uint64_t> dataset_uids;  // of every dataset sent, in order
  // Synchronous training: what this worker's replica reports, and what the
  // coordinator asked of it.
  training::ReplicaReport replica;
  std::vector<training::ReplicaForm> forms;
  std::vector<std::pair<int64_t, std::string>> aborts;  // epoch, reason
  bool link_broken = false;  // replica calls reject (the link broke)
  // What save_replica writes into the checkpoint, as a worker does
  // (absent: NotFound, a worker that holds nothing), and the directories it
  // was asked to write into, in order.
  std::optional<training::MirroredState> replica_state;
  std::vector<std::string> replica_saves;
  // Per-worker iterator positions: what save_iterator answers (absent:
  // NotFound), and the states restore_iterator was given, in order.
  std::map<int64_t, std::string> iterator_positions;
  std::vector<std::pair<int64_t, std::string>> restored_iterators;
  Status restore_answer;
  size_t runs_at_save = 0;  // closures dispatched when save_iterator was last asked

  // Answers the closure dispatched `index`-th.
  void reply(size_t index, Result<std::string> result, bool worker_lost = false) {
    REQUIRE(index < runs.size());
    // A synchronous step's closure reads its step input.
    runs[index].reply->fulfill(ClosureOutcome{std::move(result), worker_lost, runs[index].run.step_input.has_value()});
  }
  // A step whose closure did not read its step input (an evaluation).
  void reply_without_input(size_t index, Result<std::string> result) {
    REQUIRE(index < runs.size());
    runs[index].reply->fulfill(ClosureOutcome{std::move(result), false, false});
  }
  size_t open_runs() {
    size_t n = 0;
    for (auto& r : runs) n += r.reply->isWaiting() ? 1 : 0;
    return n;
  }
};

class FakeWorker : public WorkerPeer {
 public:
  explicit FakeWorker(WorkerRecord& record) : record_(record) {}

  kj::Promise<ClosureOutcome> run_closure(ClosureRun run) override {
    if (record_.link_broken) return KJ_EXCEPTION(DISCONNECTED, "link broken");
    auto paf = kj::newPromiseAndFulfiller<ClosureOutcome>();
    record_.runs.push_back({std::move(run), kj::mv(paf.fulfiller)});
    return kj::mv(paf.promise);
  }
  // The default (one run after another), recording the batch.
  kj::Promise<std::vector<ClosureOutcome>> run_closures(std::vector<ClosureRun> runs) override {
    record_.batches.push_back(runs.size());
    return WorkerPeer::run_closures(std::move(runs));
  }
  kj::Promise<Status> cancel_closure(int64_t closure_id) override {
    record_.cancels.push_back(closure_id);
    return Status::Ok();
  }
  kj::Promise<Status> ping() override {
    ++record_.pings;
    if (!record_.answer_pings) return kj::NEVER_DONE;
    return Status::Ok();
  }
  kj::Promise<Status> create_dataset(int64_t dataset_id, std::string definition, uint64_t uid) override {
    record_.datasets.emplace_back(dataset_id, std::move(definition));
    record_.dataset_uids.push_back(uid);
    return Status::Ok();
  }
  kj::Promise<Status> create_dataset_from_function(int64_t dataset_id, std::string function, int num_workers,
                                                   int worker_index, uint64_t uid) override {
    record_.dataset_uids.push_back(uid);
    record_.function_datasets.emplace_back(dataset_id, std::move(function), num_workers, worker_index);
    return Status::Ok();
  }
  kj::Promise<Result<training::ReplicaReport>> replica_status(std::string) override {
    if (record_.link_broken) return KJ_EXCEPTION(DISCONNECTED, "link broken");
    return Result<training::ReplicaReport>(record_.replica);
  }
  kj::Promise<Result<std::string>> prepare_replica(std::string, int64_t epoch) override {
    if (record_.link_broken) return KJ_EXCEPTION(DISCONNECTED, "link broken");
    return Result<std::string>("fake:" + std::to_string(epoch));
  }
  // Takes the source's state: every member ends at the same step and
  // checksum (the source's, or the seed's).
  kj::Promise<Result<training::ReplicaReport>> form_replica(training::ReplicaForm form) override {
    if (record_.link_broken) return KJ_EXCEPTION(DISCONNECTED, "link broken");
    record_.forms.push_back(form);
    record_.replica.holds = true;
    record_.replica.checksum = 42;
    record_.replica.input_position = form.input_position;  // the input goes with the state
    return Result<training::ReplicaReport>(record_.replica);
  }
  kj::Promise<Result<training::MirroredState>> read_replica(std::string) override {
    if (!record_.replica.holds) return Result<training::MirroredState>(Status::NotFound("holds nothing"));
    training::MirroredState state;
    state.step = record_.replica.step;
    return Result<training::MirroredState>(state);
  }
  kj::Promise<Result<training::SavedReplica>> save_replica(std::string strategy, std::string directory) override {
    using Out = Result<training::SavedReplica>;
    if (record_.link_broken) return KJ_EXCEPTION(DISCONNECTED, "link broken");
    record_.replica_saves.push_back(directory);
    if (!record_.replica_state.has_value()) return Out(Status::NotFound("holds nothing"));
    return Out(checkpoint::write_mirrored_file(directory, checkpoint::mirrored_file_name(strategy),
                                               *record_.replica_state));
  }
  kj::Promise<Status> abort_replica(std::string, int64_t epoch, std::string reason) override {
    record_.aborts.emplace_back(epoch, std::move(reason));
    return Status::Ok();
  }
  kj::Promise<Result<std::string>> save_iterator(int64_t dataset_id) override {
    record_.runs_at_save = record_.runs.size();
    auto found = record_.iterator_positions.find(dataset_id);
    if (found == record_.iterator_positions.end()) return Result<std::string>(Status::NotFound("no iterator"));
    return Result<std::string>(found->second);
  }
  kj::Promise<Status> restore_iterator(int64_t dataset_id, std::string state) override {
    record_.restored_iterators.emplace_back(dataset_id, std::move(state));
    return record_.restore_answer;
  }

 private:
  WorkerRecord& record_;
};

class FakeParameterServers : public ParameterServers {
 public:
  struct Task {
    std::string address;
    bool up = true;
    std::map<std::string, ShardContents> shards;
    std::map<std::string, Optimizer> optimizers;
    std::map<std::string, std::shared_ptr<ps_server::EmbeddingTable>> tables;  // the real table core
    std::vector<std::string> saved;     // shards the task wrote into checkpoints itself
    std::vector<std::string> restored;  // shards the task read from checkpoints itself
    std::map<uint64_t, Result<checkpoint::ManifestFile>> saves;  // begin_save's, until finish_save
    std::vector<std::string> valued_creates;  // create_shard calls (a value sent), in order
    std::map<std::string, InitializedShard> initialized;  // create_initialized_shard calls
    // Peer snapshots: the copies this task holds, by source task (whole
    // shards: the fake sends everything each time), the sends it made
    // (true: full) and the shards it restored from a peer's copy.
    std::map<int, std::map<std::string, ShardContents>> peer_copies;
    std::vector<bool> peer_sends;
    std::vector<std::string> restored_from_peer;
    kj::Own<kj::PromiseFulfiller<void>> on_up;
    kj::Own<kj::PromiseFulfiller<void>> on_down;
  };

  explicit FakeParameterServers(int n, bool up = true) {
    for (int i = 0; i < n; ++i) {
      Task task;
      task.address = "ps" + std::to_string(i) + ":7000";
      task.up = up;
      tasks.push_back(std::move(task));
    }
  }

  void go_down(int task) {
    Task& t = tasks[static_cast<size_t>(task)];
    t.up = false;
    if (t.on_down) t.on_down->fulfill();
  }
  void come_up(int task) {
    Task& t = tasks[static_cast<size_t>(task)];
    t.up = true;
    if (t.on_up) t.on_up->fulfill();
  }
  // Down, then up without its shards (a restarted process).
  void restart_empty(int task) {
    go_down(task);
    tasks[static_cast<size_t>(task)].shards.clear();
    tasks[static_cast<size_t>(task)].optimizers.clear();
    tasks[static_cast<size_t>(task)].tables.clear();
    come_up(task);
  }

  int size() const override { return static_cast<int>(tasks.size()); }
  std::string address(int task) const override { return tasks[static_cast<size_t>(task)].address; }
  kj::Promise<void> reachable(int task) override {
    if (tasks[static_cast<size_t>(task)].up) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    tasks[static_cast<size_t>(task)].on_up = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  kj::Promise<void> unreachable(int task) override {
    auto paf = kj::newPromiseAndFulfiller<void>();
    tasks[static_cast<size_t>(task)].on_down = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  kj::Promise<Status> create_shard(int task, std::string name, Tensor initial, const Optimizer& optimizer) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Status::Unavailable(t.address + " is down");
    t.valued_creates.push_back(name);
    t.shards[name].value = std::move(initial);
    t.optimizers[name] = optimizer;
    return Status::Ok();
  }
  // Computes the rows as a ps-server does (the real initializer).
  kj::Promise<Status> create_initialized_shard(int task, std::string name, InitializedShard shard,
                                               const Optimizer& optimizer) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Status::Unavailable(t.address + " is down");
    auto rows = training::initial_rows(shard.initializer, shard.dtype, shard.logical_shape, shard.first_row,
                                       shard.rows);
    if (!rows.ok()) return rows.status();
    t.initialized[name] = shard;
    t.shards[name].value = std::move(*rows);
    t.optimizers[name] = optimizer;
    return Status::Ok();
  }
  kj::Promise<Result<std::set<std::string>>> list_shards(int task) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Result<std::set<std::string>>(Status::Unavailable(t.address + " is down"));
    std::set<std::string> names;
    for (const auto& [name, shard] : t.shards) names.insert(name);
    for (const auto& [name, table] : t.tables) names.insert(name);
    return Result<std::set<std::string>>(std::move(names));
  }
  kj::Promise<Status> create_table(int task, std::string name, EmbeddingTableSpec spec) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Status::Unavailable(t.address + " is down");
    auto table =
        ps_server::EmbeddingTable::create({spec.dtype, spec.dim, spec.initializer, spec.optimizer, spec.options});
    if (!table.ok()) return table.status();
    t.tables[name] = std::move(*table);
    return Status::Ok();
  }
  kj::Promise<Result<TableContents>> export_table(int task, std::string name, int64_t since, int64_t begin) override {
    Task& t = tasks[static_cast<size_t>(task)];
    auto it = t.tables.find(name);
    if (!t.up || it == t.tables.end()) return Result<TableContents>(Status::NotFound("no table " + name));
    auto snapshot = it->second->snapshot(since, begin);
    if (!snapshot.ok()) return Result<TableContents>(snapshot.status());
    return Result<TableContents>(TableContents{std::move(snapshot->rows), snapshot->step, snapshot->version});
  }
  // Writes the file at once (the real server does it in the background).
  kj::Promise<Result<SaveStarted>> begin_save(int task, std::string directory, std::string file,
                                              std::vector<ps::SaveItem> items) override {
    using Out = Result<SaveStarted>;
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Out(Status::Unavailable(t.address + " is down"));
    SaveStarted started;
    std::vector<checkpoint::ShardTensors> shards;
    std::vector<checkpoint::TableShardTensors> tables;
    for (const auto& item : items) {
      ps::SavedShard saved;
      saved.name = item.name;
      if (item.table) {
        auto it = t.tables.find(item.name);
        if (it == t.tables.end()) return Out(Status::NotFound("no table " + item.name));
        auto snapshot = it->second->snapshot(0, item.begin_version);
        if (!snapshot.ok()) return Out(snapshot.status());
        const auto& config = it->second->config();
        saved.dtype = config.dtype;
        saved.shape = {snapshot->rows.keys.num_elements(), config.dim};
        saved.slots = training::slot_names(config.optimizer.kind);
        saved.step = snapshot->step;
        saved.version = snapshot->version;
        tables.push_back({item.name, std::move(snapshot->rows), saved.slots});
      } else {
        auto it = t.shards.find(item.name);
        if (it == t.shards.end()) return Out(Status::NotFound("no shard " + item.name));
        saved.dtype = it->second.value.dtype();
        saved.shape = it->second.value.shape();
        saved.step = it->second.step;
        checkpoint::ShardTensors tensors{item.name, it->second.value, {}, it->second.step};
        for (const auto& [slot, tensor] : it->second.slots) {
          saved.slots.push_back(slot);
          tensors.slots.emplace_back(slot, tensor);
        }
        shards.push_back(std::move(tensors));
      }
      t.saved.push_back(item.name);
      started.shards.push_back(std::move(saved));
    }
    started.save_id = next_save++;
    t.saves.emplace(started.save_id, checkpoint::write_shard_file(directory, file, shards, tables));
    return Out(std::move(started));
  }
  kj::Promise<Result<checkpoint::ManifestFile>> finish_save(int task, uint64_t save_id) override {
    using Out = Result<checkpoint::ManifestFile>;
    Task& t = tasks[static_cast<size_t>(task)];
    auto it = t.saves.find(save_id);
    if (it == t.saves.end()) return Out(Status::NotFound("no save " + std::to_string(save_id)));
    Out file = std::move(it->second);
    t.saves.erase(it);
    return file;
  }
  kj::Promise<Result<PeerSent>> send_peer_snapshot(int task, std::string holder, bool full) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Result<PeerSent>(Status::Unavailable(t.address + " is down"));
    Task* h = by_address(holder);
    if (h == nullptr || !h->up) return Result<PeerSent>(Status::Unavailable(holder + " is down"));
    // As a real holder: a delta (not full) on a copy it lost is refused.
    if (!full && !t.peer_sends.empty() && h->peer_copies.count(task) == 0) {
      return Result<PeerSent>(Status::FailedPrecondition("no copy held: send a full one"));
    }
    h->peer_copies[task] = t.shards;
    t.peer_sends.push_back(full);
    PeerSent sent;
    sent.sequence = static_cast<int64_t>(t.peer_sends.size());
    sent.full = full;
    sent.shards = static_cast<int64_t>(t.shards.size());
    return Result<PeerSent>(sent);
  }
  kj::Promise<Result<PeerRestored>> restore_from_peer(int task, std::string holder, int source_task,
                                                      std::vector<std::string> shards) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Result<PeerRestored>(Status::Unavailable(t.address + " is down"));
    Task* h = by_address(holder);
    if (h == nullptr || !h->up) return Result<PeerRestored>(Status::Unavailable(holder + " is down"));
    auto copy = h->peer_copies.find(source_task);
    if (copy == h->peer_copies.end()) {
      return Result<PeerRestored>(Status::NotFound("no peer copy of ps:" + std::to_string(source_task)));
    }
    for (const auto& name : shards) {
      if (copy->second.count(name) == 0) return Result<PeerRestored>(Status::NotFound("no shard " + name));
    }
    for (const auto& name : shards) {
      t.shards[name] = copy->second[name];
      t.restored_from_peer.push_back(name);
    }
    PeerRestored restored;
    restored.sequence = 1;
    restored.shards = static_cast<int64_t>(shards.size());
    return Result<PeerRestored>(restored);
  }
  Task* by_address(const std::string& address) {
    for (Task& t : tasks) {
      if (t.address == address) return &t;
    }
    return nullptr;
  }
  kj::Promise<Status> restore_shards(int task, std::string path, std::vector<ps::RestoreItem> items) override {
    Task& t = tasks[static_cast<size_t>(task)];
    if (!t.up) return Status::Unavailable(t.address + " is down");
    checkpoint::CheckpointReaderOptions options;
    options.verify_checksums_on_open = false;
    auto reader = checkpoint::CheckpointReader::open(path, options);
    if (!reader.ok()) return reader.status();
    for (const auto& item : items) {
      const auto* saved = (*reader)->manifest().find_variable(item.variable);
      if (saved == nullptr) return Status::NotFound("no variable " + item.variable);
      if (item.table) {
        if (t.tables.count(item.name) == 0) {
          const EmbeddingTableSpec& spec = *item.table;
          auto table = ps_server::EmbeddingTable::create(
              {spec.dtype, spec.dim, spec.initializer, spec.optimizer, spec.options});
          if (!table.ok()) return table.status();
          t.tables[item.name] = std::move(*table);
        }
        auto rows = checkpoint::read_table_part(**reader, *saved, item.table_part, item.table_parts);
        if (!rows.ok()) return rows.status();
        Status done = t.tables[item.name]->restore(*rows, true, saved->optimizer_step, saved->table->generation);
        if (!done.ok()) return done;
      } else {
        const bool scalar = saved->shape.empty();
        auto read = checkpoint::read_shard_rows(**reader, item.variable, scalar ? 0 : item.first_row,
                                                scalar ? 1 : item.rows,
                                                saved->optimizer.kind == item.optimizer.kind);
        if (!read.ok()) return read.status();
        ShardContents& shard = t.shards[item.name];
        shard.value = std::move(read->value);
        shard.slots.clear();
        for (auto& [slot, tensor] : read->slots) shard.slots[slot] = std::move(tensor);
        shard.step = read->step;
        t.optimizers[item.name] = item.optimizer;
      }
      t.restored.push_back(item.name);
    }
    return Status::Ok();
  }

  std::vector<Task> tasks;
  uint64_t next_save = 1;
};

// What the coordinator's parts share, for a test of one part alone: an
// event loop, a manual clock, the task set (a failed task fails the test),
// the change signal, the stats and a silent log (a LoopContext over them), a
// pool, fake parameter servers with their health and variable table, a gate
// and a worker table. A test's fixture derives from it and adds the part it
// tests.
struct CoordinatorParts : private kj::TaskSet::ErrorHandler {
  // ps_up: the parameter servers answer and are marked up from the start;
  // otherwise first contact may take until `first_contact` after the start.
  explicit CoordinatorParts(int num_ps = 1, bool ps_up = true, kj::Duration first_contact = 0 * kj::SECONDS)
      : ps(num_ps, ps_up), health(ps, kStart + first_contact, std::chrono::milliseconds(30000)) {
    if (!ps_up) return;
    for (int task = 0; task < num_ps; ++task) health.set(task, PsHealth::State::kUp, Status::Ok(), kStart);
  }
  ~CoordinatorParts() { pool.join(); }
  void taskFailed(kj::Exception&& exception) override { FAIL(exception.getDescription().cStr()); }

  // Moves the clock forward by `d` in `steps` steps, running what becomes
  // ready.
  void advance(kj::Duration d, int steps = 1) {
    for (int i = 0; i < steps; ++i) {
      timer.advanceTo(timer.now() + d / steps);
      ws.poll();
    }
  }
  // Registers a fake worker over `record` (which must outlive the parts).
  int64_t add_worker(WorkerRecord& record, int task_index = -1, std::set<std::string> functions = {"train_step"}) {
    return workers.add(task_index, std::move(functions), std::make_unique<FakeWorker>(record)).id;
  }
  // Records a float variable of `size` values in one shard, "<name>/part_0"
  // on parameter server `task`, as the journal would bring it back.
  void restore_variable(const std::string& name, int64_t size, int task) {
    PlacedVariable v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = {size};
    v.shards = {{name + "/part_0", task, 0, size}};
    variables.restore(v, 1);
  }
  // Runs the loop until `promise` resolves (the pool answers through the
  // mailbox), for up to 10 s.
  template <typename T>
  T wait(kj::Promise<T>& promise) {
    for (int i = 0; i < 1000 && !promise.poll(ws); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return promise.wait(ws);
  }
  template <typename T>
  T wait(kj::Promise<T>&& promise) {
    return wait(promise);
  }

  static inline const kj::TimePoint kStart = kj::origin<kj::TimePoint>();
  std::shared_ptr<spdlog::logger> log =
      std::make_shared<spdlog::logger>("coordinator_parts", std::make_shared<spdlog::sinks::null_sink_mt>());
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::WaitScope& ws = io.waitScope;
  async::Mailbox mailbox{*io.lowLevelProvider};  // run_on_pool hands results back through it
  kj::TimerImpl timer{kStart};
  kj::TaskSet tasks{*this};
  int notified = 0;  // the change signal's notify() calls
  ChangeSignal changes{timer, [this]() { ++notified; }};
  CoordinatorStats stats;
  LoopContext context{timer, tasks, changes, stats, log};
  boost::asio::thread_pool pool{1};
  FakeParameterServers ps;
  PsHealth health;
  PsVariables variables{ps, health, pool, log, "", [](const PlacedVariable&) { return Status::Ok(); }};
  DispatchGate gate;
  // What a failed worker's closures come to (the closure queue's requeue);
  // none by default.
  std::function<size_t(int64_t)> requeue = [](int64_t) { return size_t{0}; };
  Workers workers{log, changes, [this](int64_t id) { return requeue(id); }};
};

// An event loop, a manual clock and a coordinator over fakes.
struct Harness {
  // ps_up: whether the parameter servers answer from the start.
  explicit Harness(CoordinatorConfig config = {}, int num_ps = 1, bool ps_up = true)
      : io(kj::setupAsyncIo()),
        mailbox(*io.lowLevelProvider),
        timer(kj::origin<kj::TimePoint>()),
        pool(1),
        ps(num_ps, ps_up),
        coordinator(std::make_unique<Coordinator>(
            config, ps, timer, pool,
            std::make_shared<spdlog::logger>("coordinator_test", std::make_shared<spdlog::sinks::null_sink_mt>()))) {
    settle();
  }
  // With a first worker (running "train_step"), `worker`, which must
  // outlive this.
  explicit Harness(WorkerRecord& worker, CoordinatorConfig config = {}, int num_ps = 1, bool ps_up = true)
      : Harness(std::move(config), num_ps, ps_up) {
    add_worker(worker);
  }
  ~Harness() {
    coordinator.reset();
    pool.join();
  }

  void settle() { io.waitScope.poll(); }

  // Moves the clock forward in steps, running what becomes ready.
  void advance(std::chrono::milliseconds total) {
    const auto step = std::chrono::milliseconds(100);
    for (auto t = std::chrono::milliseconds(0); t < total; t += step) {
      timer.advanceTo(timer.now() + step.count() * kj::MILLISECONDS);
      settle();
    }
  }

  int64_t add_worker(WorkerRecord& record, std::set<std::string> functions = {"train_step"}, int task_index = 0) {
    return coordinator->register_worker(task_index, std::move(functions), std::make_unique<FakeWorker>(record))
        .wait(io.waitScope);
  }
  // Schedules `n` "train_step" closures with args "0", "1", ... and (with
  // `run`) runs what follows; their ids.
  std::vector<int64_t> schedule_steps(int n, bool run = true) {
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(coordinator->schedule("train_step", std::to_string(i)).value());
    if (run) settle();
    return ids;
  }
  // Answers `record`'s closure dispatched `index`-th and runs what follows.
  void answer(WorkerRecord& record, size_t index, Result<std::string> result, bool worker_lost = false) {
    record.reply(index, std::move(result), worker_lost);
    settle();
  }
  // What join() answers, waiting for it.
  Status joined() { return coordinator->join().wait(io.waitScope); }
  // Closure `id`'s value (or error), waiting for it.
  Result<std::string> fetched(int64_t id) { return coordinator->fetch(id).wait(io.waitScope); }
  // Creates a variable that must be created.
  auto create_variable(VariableRequest request) {
    return coordinator->create_variable(std::move(request)).wait(io.waitScope).value();
  }

  kj::AsyncIoContext io;
  async::Mailbox mailbox;  // run_on_pool hands results back through it
  kj::TimerImpl timer;
  boost::asio::thread_pool pool;
  FakeParameterServers ps;
  std::unique_ptr<Coordinator> coordinator;
};

}  // namespace capstan::coordinator::testing

#endif  // CAPSTAN_DAEMONS_COORDINATOR_TEST_FAKES_H_
