#include "daemons/data_dispatcher/service.h"

#include <cstdio>
#include <future>

#include "daemons/common/config.h"
#include "data/compression.h"
#include "async/status_exception.h"
#include "async/pool.h"
#include "rpc/tensor_codec.h"

namespace capstan::data_dispatcher {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

kj::ArrayPtr<const kj::byte> bytes_of(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

ProcessingMode mode_from_wire(wire::ProcessingMode m) {
  switch (m) {
    case wire::ProcessingMode::OFF: return ProcessingMode::kOff;
    case wire::ProcessingMode::DYNAMIC: return ProcessingMode::kDynamic;
    case wire::ProcessingMode::FILE: return ProcessingMode::kFile;
    case wire::ProcessingMode::DATA: return ProcessingMode::kData;
    case wire::ProcessingMode::FILE_OR_DATA: return ProcessingMode::kFileOrData;
    case wire::ProcessingMode::HINT: return ProcessingMode::kHint;
  }
  return ProcessingMode::kOff;
}

wire::ProcessingMode mode_to_wire(ProcessingMode m) {
  switch (m) {
    case ProcessingMode::kOff: return wire::ProcessingMode::OFF;
    case ProcessingMode::kDynamic: return wire::ProcessingMode::DYNAMIC;
    case ProcessingMode::kFile: return wire::ProcessingMode::FILE;
    case ProcessingMode::kData: return wire::ProcessingMode::DATA;
    case ProcessingMode::kFileOrData: return wire::ProcessingMode::FILE_OR_DATA;
    case ProcessingMode::kHint: return wire::ProcessingMode::HINT;
  }
  return wire::ProcessingMode::OFF;
}

void write_task_def(const TaskDef& def, wire::TaskDef::Builder out) {
  out.setTaskId(def.task_id);
  out.setJobId(def.job_id);
  out.setDatasetId(def.dataset_id);
  out.setDefinition(bytes_of(def.definition));
  out.setProcessingMode(mode_to_wire(def.processing_mode));
  out.setNumConsumers(def.num_consumers);
  out.setNumWorkers(def.num_workers);
  out.setWorkerIndex(def.worker_index);
  out.setCrossTrainerCache(def.cross_trainer_cache);
  out.setCrossTrainerCacheBytes(def.cross_trainer_cache_bytes);
  out.setNumSplitProviders(def.num_split_providers);
  out.setCompression(def.compression);
}

// The value of an OK result; an error becomes the call's exception.
template <typename T>
T take(Result<T>& result) {
  async::check(result.status());
  return std::move(*result);
}

}  // namespace

DispatcherConfig dispatcher_config_from(const daemon::Config& config) {
  DispatcherConfig out;
  out.work_dir = config.get_string("work_dir");
  out.job_gc_check_interval = std::chrono::milliseconds(config.get_int("job_gc_check_interval_ms"));
  out.job_gc_timeout = std::chrono::milliseconds(config.get_int("job_gc_timeout_ms"));
  out.client_timeout = std::chrono::milliseconds(config.get_int("client_timeout_ms"));
  out.worker_timeout = std::chrono::milliseconds(config.get_int("worker_timeout_ms"));
  out.max_heartbeats_per_s = config.get_int("max_heartbeats_per_s");
  return out;
}

DispatcherService::DispatcherService(daemon::DaemonContext& ctx) : NodeService(ctx), tasks_(*this) {
  // Replaying the journal blocks, but nothing is served yet.
  auto dispatcher = Dispatcher::open(dispatcher_config_from(ctx.config), ctx.log, clock_);
  if (!dispatcher.ok()) async::throw_status(dispatcher.status());
  dispatcher_ = std::move(*dispatcher);
  tasks_.add(gc_loop());
  register_status(ctx.status);
}

// Reads the dispatcher on its thread from the HTTP thread, and waits.
template <typename Func>
auto DispatcherService::read_dispatcher(Func func) {
  std::packaged_task<decltype(func(std::declval<Dispatcher&>()))()> task(
      [dispatcher = dispatcher_.get(), func = std::move(func)]() { return func(*dispatcher); });
  auto result = task.get_future();
  boost::asio::post(dispatcher_thread_, std::move(task));
  return result.get();
}

void DispatcherService::register_status(daemon::StatusBoard& status) {
  using Plot = daemon::StatusBoard::Plot;
  // Sampled by the status board: counts read on the dispatcher's thread.
  struct Counts {
    double jobs = 0, workers = 0, clients = 0, waiting = 0, reassigned = 0;
  };
  auto counts = [this]() {
    return read_dispatcher([](Dispatcher& d) {
      Counts c;
      for (const JobInfo& job : d.list_jobs()) {
        if (job.finished) continue;
        c.jobs += 1;
        c.clients += static_cast<double>(job.num_clients);
      }
      c.workers = static_cast<double>(d.list_workers().size());
      c.waiting = static_cast<double>(d.tasks_waiting_for_worker());
      c.reassigned = static_cast<double>(d.tasks_reassigned());
      return c;
    });
  };
  // Read once a second by the first plot, kept for the others and for
  // /metrics: the registry outlives this service (a scrape during shutdown
  // must not reach it), the status board does not.
  struct Latest {
    std::atomic<double> jobs{0}, clients{0}, workers{0}, waiting{0}, reassigned{0};
  };
  auto latest = std::make_shared<Latest>();
  status.plot("jobs (active)", Plot::kLevel, [counts, latest]() {
    Counts c = counts();
    latest->clients = c.clients;
    latest->workers = c.workers;
    latest->waiting = c.waiting;
    latest->reassigned = c.reassigned;
    return latest->jobs = c.jobs;
  });
  status.plot("consumers", Plot::kLevel, [latest]() { return latest->clients.load(); });
  status.plot("data workers", Plot::kLevel, [latest]() { return latest->workers.load(); });
  ctx_.metrics.callback_gauge("capstan_data_dispatcher_jobs", "Jobs not finished (sampled each second).",
                              [latest]() { return latest->jobs.load(); });
  ctx_.metrics.callback_gauge("capstan_data_dispatcher_consumers",
                              "Consumers of the jobs not finished (sampled each second).",
                              [latest]() { return latest->clients.load(); });
  ctx_.metrics.callback_gauge("capstan_data_dispatcher_workers", "Data workers registered (sampled each second).",
                              [latest]() { return latest->workers.load(); });
  ctx_.metrics.callback_gauge("capstan_data_dispatcher_tasks_waiting_for_worker",
                              "Tasks of lost data workers that no live worker could take yet: their consumers wait "
                              "(sampled each second).",
                              [latest]() { return latest->waiting.load(); });
  ctx_.metrics.callback_counter("capstan_data_dispatcher_tasks_reassigned_total",
                                "Tasks moved off data workers lost for worker_timeout_ms (sampled each second).",
                                [latest]() { return latest->reassigned.load(); });
  status.tables([this]() {
    struct Listing {
      std::vector<DatasetInfo> datasets;
      std::vector<JobInfo> jobs;
      std::vector<WorkerInfo> workers;
      double worker_timeout_s = 0;
    };
    Listing l = read_dispatcher([](Dispatcher& d) {
      return Listing{d.list_datasets(), d.list_jobs(), d.list_workers(),
                     std::chrono::duration<double>(d.config().worker_timeout).count()};
    });
    using Table = daemon::StatusBoard::Table;
    std::vector<Table> tables;
    Table& jobs = tables.emplace_back();
    jobs.title = "Jobs";
    jobs.columns = {"id", "name", "dataset", "sharding", "consumers", "tasks", "state"};
    for (const JobInfo& j : l.jobs) {
      jobs.rows.push_back({std::to_string(j.job_id), j.job_name.empty() ? "(anonymous)" : j.job_name, j.dataset_id,
                           std::string(processing_mode_name(j.processing_mode)), std::to_string(j.num_clients),
                           std::to_string(j.num_tasks), j.finished ? "finished" : "running"});
    }
    if (l.jobs.empty()) jobs.note = "No jobs yet (a consumer's distribute() or from_dataset_id() makes one).";
    Table& workers = tables.emplace_back();
    workers.title = "Data workers";
    workers.columns = {"address", "tasks", "last heartbeat", "state"};
    for (const WorkerInfo& w : l.workers) {
      const bool late = w.last_heartbeat_seconds_ago < 0 || w.last_heartbeat_seconds_ago > l.worker_timeout_s;
      char ago[32];
      std::snprintf(ago, sizeof(ago), "%.1f s ago", w.last_heartbeat_seconds_ago);
      workers.rows.push_back({w.address, std::to_string(w.num_tasks),
                              w.last_heartbeat_seconds_ago < 0 ? "none since the start" : ago,
                              late ? "down (no heartbeat)" : "up"});
    }
    if (l.workers.empty()) workers.note = "No data worker has registered (start data-worker --dispatcher ADDRESS).";
    Table& datasets = tables.emplace_back();
    datasets.title = "Datasets";
    datasets.columns = {"id", "fingerprint", "definition bytes", "compression"};
    for (const DatasetInfo& d : l.datasets) {
      char fingerprint[20];
      std::snprintf(fingerprint, sizeof(fingerprint), "%016llx", static_cast<unsigned long long>(d.fingerprint));
      datasets.rows.push_back({d.dataset_id, fingerprint, std::to_string(d.bytes), data::compression_name(d.compression)});
    }
    return tables;
  });
}

DispatcherService::~DispatcherService() {
  // Queued calls finish, and their changes become durable, before the
  // dispatcher goes; their replies are dropped.
  dispatcher_thread_.join();
  sync_thread_.join();
}

void DispatcherService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("dispatcher task failed: {}", async::from_exception(exception).to_string());
}

template <typename Func>
auto DispatcherService::on_dispatcher(Func func) {
  using R = decltype(func(std::declval<Dispatcher&>()));
  Dispatcher* dispatcher = dispatcher_.get();
  return async::run_on_pool(dispatcher_thread_,
                          [dispatcher, func = std::move(func)]() mutable {
                            R result = func(*dispatcher);
                            return std::make_pair(std::move(result), dispatcher->journal_ticket());
                          })
      .then([this, dispatcher](std::pair<R, uint64_t> done) -> kj::Promise<R> {
        if (dispatcher->is_durable(done.second)) return std::move(done.first);
        // The fsync runs on the sync thread while the dispatcher thread takes
        // the next calls: their changes go out together in the next fsync.
        return async::run_on_pool(sync_thread_,
                                [dispatcher, ticket = done.second]() { return dispatcher->wait_durable(ticket); })
            .then([result = std::move(done.first)](Status durable) mutable -> R {
              async::check(durable.with_context("journaling the change"));
              return std::move(result);
            });
      });
}

// ---- Datasets ---------------------------------------------------------------------

kj::Promise<void> DispatcherService::registerDataset(RegisterDatasetContext context) {
  auto bytes = context.getParams().getDefinition();
  std::string definition(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  std::string compression = text(context.getParams().getCompression());
  return on_dispatcher([definition = std::move(definition), compression = std::move(compression)](Dispatcher& d) {
           return d.register_dataset(definition, compression);
         })
      .then([context](Result<std::string> id) mutable { context.getResults().setDatasetId(take(id)); });
}

kj::Promise<void> DispatcherService::getDatasetDefinition(GetDatasetDefinitionContext context) {
  std::string id = text(context.getParams().getDatasetId());
  return on_dispatcher([id = std::move(id)](Dispatcher& d) { return d.dataset_definition(id); })
      .then([context](Result<std::string> definition) mutable {
        context.getResults().setDefinition(bytes_of(take(definition)));
      });
}

// ---- Jobs and clients --------------------------------------------------------------

kj::Promise<void> DispatcherService::getOrCreateJob(GetOrCreateJobContext context) {
  auto params = context.getParams().getParams();
  GetOrCreateJobRequest request;
  request.dataset_id = text(params.getDatasetId());
  request.job_name = text(params.getJobName());
  request.processing_mode = mode_from_wire(params.getProcessingMode());
  request.num_consumers = params.getNumConsumers();
  request.cross_trainer_cache = params.getCrossTrainerCache();
  return on_dispatcher([request = std::move(request)](Dispatcher& d) { return d.get_or_create_job(request); })
      .then([context](Result<JobClient> client) mutable {
        JobClient c = take(client);
        auto results = context.getResults();
        results.setJobId(c.job_id);
        results.setJobClientId(c.job_client_id);
      });
}

kj::Promise<void> DispatcherService::releaseJobClient(ReleaseJobClientContext context) {
  int64_t client = context.getParams().getJobClientId();
  return on_dispatcher([client](Dispatcher& d) { return d.release_job_client(client); }).then([](Status status) {
    async::check(status);
  });
}

kj::Promise<void> DispatcherService::clientHeartbeat(ClientHeartbeatContext context) {
  int64_t client = context.getParams().getJobClientId();
  uint64_t known = context.getParams().getKnownTasks();
  return on_dispatcher([client, known](Dispatcher& d) { return d.client_heartbeat(client, known); })
      .then([context](Result<ClientHeartbeatResponse> result) mutable {
        ClientHeartbeatResponse response = take(result);
        auto out = context.getResults().initTasks(static_cast<unsigned>(response.tasks.size()));
        for (unsigned i = 0; i < response.tasks.size(); ++i) {
          const TaskInfo& task = response.tasks[i];
          out[i].setTaskId(task.task_id);
          out[i].setJobId(task.job_id);
          out[i].setWorkerAddress(task.worker_address);
          out[i].setDatasetId(task.dataset_id);
          out[i].setWaitingForWorker(task.waiting_for_worker);
        }
        context.getResults().setJobFinished(response.job_finished);
        context.getResults().setTasksFingerprint(response.tasks_fingerprint);
        context.getResults().setTasksUnchanged(response.unchanged);
        context.getResults().setIntervalMs(static_cast<uint32_t>(response.interval.count()));
      });
}

// ---- Workers and tasks ----------------------------------------------------------------

kj::Promise<void> DispatcherService::workerHeartbeat(WorkerHeartbeatContext context) {
  auto params = context.getParams();
  std::string address = text(params.getWorkerAddress());
  std::vector<int64_t> current;
  for (int64_t id : params.getCurrentTasks()) current.push_back(id);
  return on_dispatcher([address = std::move(address), current = std::move(current)](Dispatcher& d) {
           return d.worker_heartbeat(address, current);
         })
      .then([context](Result<WorkerHeartbeatResponse> result) mutable {
        WorkerHeartbeatResponse response = take(result);
        auto fresh = context.getResults().initNewTasks(static_cast<unsigned>(response.new_tasks.size()));
        for (unsigned i = 0; i < response.new_tasks.size(); ++i) write_task_def(response.new_tasks[i], fresh[i]);
        auto remove = context.getResults().initTasksToDelete(static_cast<unsigned>(response.tasks_to_delete.size()));
        for (unsigned i = 0; i < response.tasks_to_delete.size(); ++i) remove.set(i, response.tasks_to_delete[i]);
        context.getResults().setIntervalMs(static_cast<uint32_t>(response.interval.count()));
      });
}

kj::Promise<void> DispatcherService::finishTask(FinishTaskContext context) {
  int64_t task_id = context.getParams().getTaskId();
  return on_dispatcher([task_id](Dispatcher& d) { return d.finish_task(task_id); }).then([](Status status) {
    async::check(status);
  });
}

kj::Promise<void> DispatcherService::getSplit(GetSplitContext context) {
  auto params = context.getParams();
  int64_t job_id = params.getJobId();
  int64_t repetition = params.getRepetition();
  int64_t index = params.getSplitProviderIndex();
  int64_t task_id = params.getTaskId();
  int64_t sequence = params.getSequence();
  return on_dispatcher([job_id, repetition, index, task_id, sequence](Dispatcher& d) {
           return d.get_split(job_id, repetition, index, task_id, sequence);
         })
      .then([context](Result<SplitResponse> result) mutable {
        SplitResponse response = take(result);
        auto results = context.getResults();
        if (response.split.has_value()) rpc::write_element_inline(results.initSplit(), *response.split);
        results.setEndOfSplits(response.end_of_splits);
      });
}

// ---- Listing (capstanctl data ...) -------------------------------------------------------

kj::Promise<void> DispatcherService::listDatasets(ListDatasetsContext context) {
  return on_dispatcher([](Dispatcher& d) { return d.list_datasets(); })
      .then([context](std::vector<DatasetInfo> datasets) mutable {
        auto out = context.getResults().initDatasets(static_cast<unsigned>(datasets.size()));
        for (unsigned i = 0; i < datasets.size(); ++i) {
          out[i].setDatasetId(datasets[i].dataset_id);
          out[i].setFingerprint(datasets[i].fingerprint);
          out[i].setBytes(datasets[i].bytes);
          out[i].setCompression(datasets[i].compression);
        }
      });
}

kj::Promise<void> DispatcherService::listJobs(ListJobsContext context) {
  return on_dispatcher([](Dispatcher& d) { return d.list_jobs(); }).then([context](std::vector<JobInfo> jobs) mutable {
    auto out = context.getResults().initJobs(static_cast<unsigned>(jobs.size()));
    for (unsigned i = 0; i < jobs.size(); ++i) {
      const JobInfo& job = jobs[i];
      out[i].setJobId(job.job_id);
      out[i].setJobName(job.job_name);
      out[i].setDatasetId(job.dataset_id);
      out[i].setProcessingMode(mode_to_wire(job.processing_mode));
      out[i].setNumClients(job.num_clients);
      out[i].setNumTasks(job.num_tasks);
      out[i].setFinished(job.finished);
    }
  });
}

kj::Promise<void> DispatcherService::listWorkers(ListWorkersContext context) {
  return on_dispatcher([](Dispatcher& d) { return d.list_workers(); })
      .then([context](std::vector<WorkerInfo> workers) mutable {
        auto out = context.getResults().initWorkers(static_cast<unsigned>(workers.size()));
        for (unsigned i = 0; i < workers.size(); ++i) {
          out[i].setAddress(workers[i].address);
          out[i].setNumTasks(workers[i].num_tasks);
          out[i].setLastHeartbeatSecondsAgo(workers[i].last_heartbeat_seconds_ago);
        }
      });
}

// ---- Garbage collection ----------------------------------------------------------------

kj::Promise<void> DispatcherService::gc_loop() {
  return ctx_.loop->timer()
      .afterDelay(dispatcher_->config().job_gc_check_interval.count() * kj::MILLISECONDS)
      .then([this]() {
        return on_dispatcher([](Dispatcher& d) {
          d.collect();
          return true;
        });
      })
      .then([this](bool) { return gc_loop(); });
}

}  // namespace capstan::data_dispatcher
