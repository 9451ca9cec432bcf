#include "daemons/coordinator/service.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "daemons/coordinator/payload.h"
#include "async/status_exception.h"
#include "rpc/errors.h"
#include "rpc/optimizer_codec.h"
#include "rpc/phase_codec.h"
#include "rpc/placement_codec.h"
#include "rpc/replica_codec.h"
#include "rpc/tensor_codec.h"
#include "wire_names.h"

namespace capstan::coordinator {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

Result<placement::Partitioner> partitioner_from_wire(wire::Partitioner::Reader in) {
  std::string kind = text(in.getKind());
  placement::Partitioner p;
  if (kind.empty() || kind == "none") return p;
  if (kind == "fixed_shards") return placement::Partitioner::fixed_shards(in.getNumShards());
  if (kind == "min_size") {
    return placement::Partitioner::min_size(in.getMinShardBytes(), in.getMaxShards(), in.getBytesPerString());
  }
  if (kind == "max_size") {
    return placement::Partitioner::max_size(in.getMaxShardBytes(), in.getMaxShards(), in.getBytesPerString());
  }
  return Status::InvalidArgument("unknown partitioner '" + kind + "'");
}

}  // namespace

// The ranges here are what from() relies on: parse_config refuses a value
// outside them (exit 2, naming the key, the value and the range).
std::vector<daemon::OptionSpec> CoordinatorConfig::options() {
  using daemon::OptionSpec;
  using daemon::OptionType;
  return {
      {"ps", OptionType::kStringList,
       "host:port of each parameter server (default: the cluster spec's ps job).", std::nullopt},
      {"ps_service", OptionType::kString,
       "The parameter servers as a Kubernetes StatefulSet behind a headless Service, NAME[.NAMESPACE.svc]:PORT: "
       "task i is NAME-i.NAME[.NAMESPACE.svc]:PORT (with num_ps; instead of ps).",
       ""},
      OptionSpec{"num_ps", OptionType::kInt,
          "How many parameter servers ps_service has (its StatefulSet's replicas).", "0"}
          .in_range(0, 100000),
      OptionSpec{"closures_per_worker", OptionType::kInt,
          "Closures each worker runs at once (TF runs one; more hides round trips of short closures).",
          "1"}
          .in_range(1, std::numeric_limits<int>::max()),
      OptionSpec{"closure_batch", OptionType::kInt,
          "When the queue is deep (more closures queued than twice the lanes), a lane sends a worker up to this many "
          "closures in one call, run one after another there (fewer round trips; still one at a time per lane). "
          "1: one closure per call. Closures with closure_timeout_ms are sent one at a time.",
          "16"}
          .in_range(1, 1024),
      OptionSpec{"worker_ping_interval_ms", OptionType::kInt, "How often each worker is pinged.", "2000"}
          .at_least(1),
      OptionSpec{"worker_ping_timeout_ms", OptionType::kInt,
          "A worker that does not answer a ping this fast is dropped (its closures re-queued).", "5000"}
          .at_least(1),
      OptionSpec{"closure_timeout_ms", OptionType::kInt,
          "A closure run taking longer fails with DeadlineExceeded, which cancels the other closures as any "
          "closure error does; closures see the deadline (ClosureContext::deadline). 0: none.",
          "0"}
          .at_least(0),
      {"num_workers", OptionType::kInt,
       "Workers the per-worker datasets are sharded for (default: the cluster spec's worker job, "
       "else the workers registered).",
       "0"},
      {"work_dir", OptionType::kString,
       "Directory of the coordinator's journal: a coordinator restarted with the same one knows its variables, "
       "their placement, the per-worker datasets and the checkpoint to recover from again. Empty: nothing survives a "
       "restart.",
       ""},
      {"checkpoint_dir", OptionType::kString,
       "Where the checkpoint policy saves, and where a parameter server that restarted empty is restored from "
       "(its newest checkpoint, unless the program saved or restored one since). Empty: none.",
       ""},
      OptionSpec{"checkpoint_every_steps", OptionType::kInt,
          "Save a checkpoint into checkpoint_dir every N closures completed. 0: off.", "0"}
          .at_least(0),
      OptionSpec{"checkpoint_every_seconds", OptionType::kInt,
          "Save a checkpoint into checkpoint_dir every N seconds (when closures completed since). 0: off.", "0"}
          .at_least(0),
      OptionSpec{"checkpoint_max_to_keep", OptionType::kInt, "Checkpoints the policy keeps in checkpoint_dir.", "3"}
          .in_range(1, std::numeric_limits<int>::max()),
      {"ps_recovery", OptionType::kBool,
       "Restore a parameter server that comes back without its shards from the latest checkpoint, by itself; "
       "the program pauses meanwhile. false: calls fail with DataLoss until a checkpoint is restored by hand.",
       "true"},
      {"checkpoint_on_preemption", OptionType::kBool,
       "With checkpoint_dir: when a worker leaves (its SIGTERM) or the coordinator gets SIGTERM, save a checkpoint "
       "once the running closures have finished.",
       "true"},
      OptionSpec{"ps_recovery_timeout_ms", OptionType::kInt,
          "While a lost parameter server can be recovered, join/fetch wait this long for it before they fail with "
          "Unavailable.",
          "300000"}
          .at_least(0),
      OptionSpec{"peer_snapshot_every_seconds", OptionType::kInt,
          "Every N seconds each parameter server sends the next one in ps (the last: the first) the variable shards "
          "and table rows changed since its previous peer snapshot, and that buddy keeps them in memory. A parameter "
          "server that comes back empty gets its shards from its buddy's copy (losing the updates since that "
          "snapshot), not from the disk checkpoint, which stays the fallback. Needs 2 or more parameter servers; "
          "costs each server the memory of its buddy's shards. 0: off. At most 86400 (a day).",
          "0"}
          .in_range(0, 86400),
      OptionSpec{"client_grace_ms", OptionType::kInt,
          "A program's closure values are released when its client has not called for this long (the SDK calls at least "
          "every 5 s while it runs): a program that crashed or exited cannot fetch them any more. A client that "
          "reconnects within it (a link outage, a coordinator restart) fetches its values as before. 0: never (values "
          "stay until released one by one). At least 15000.",
          "300000"}
          .at_least(0),
      OptionSpec{"max_queued_closures", OptionType::kInt,
          "Schedule calls are answered only while fewer closures than this wait for a worker, so a program that "
          "schedules faster than the workers run blocks in schedule() (as TF's does when its queue is full) and the "
          "queue, and the coordinator's memory, stay bounded (each client adds at most 16384 closures it has no answer "
          "for).",
          "32768"}
          .at_least(1),
  };
}

Result<CoordinatorConfig> CoordinatorConfig::from(const daemon::Config& config) {
  // Each integer is in its range (options()); what is checked here spans
  // keys, or is no single range.
  CoordinatorConfig out;
  out.ps = config.has("ps") ? config.get_list("ps") : std::vector<std::string>{};
  const int64_t num_ps = config.get_int("num_ps");
  if (const std::string& service = config.get_string("ps_service"); !service.empty()) {
    if (!out.ps.empty()) {
      return Status::InvalidArgument("ps and ps_service are both set ('" + service +
                                     "'); give the parameter servers one way");
    }
    CAPSTAN_ASSIGN_OR_RETURN(out.ps, ps_addresses_of_service(service, num_ps));
  } else if (num_ps != 0) {
    return Status::InvalidArgument("num_ps: " + std::to_string(num_ps) +
                                   " is only used with ps_service; set ps_service or drop num_ps");
  }
  if (out.ps.empty()) out.ps = config.cluster().addresses("ps");
  out.closures_per_worker = static_cast<int>(config.get_int("closures_per_worker"));
  out.closure_batch = static_cast<int>(config.get_int("closure_batch"));
  out.closure_timeout = std::chrono::milliseconds(config.get_int("closure_timeout_ms"));
  out.worker_ping_interval = std::chrono::milliseconds(config.get_int("worker_ping_interval_ms"));
  out.worker_ping_timeout = std::chrono::milliseconds(config.get_int("worker_ping_timeout_ms"));
  out.work_dir = config.get_string("work_dir");
  out.checkpoint_dir = config.get_string("checkpoint_dir");
  out.checkpoint_every_steps = config.get_int("checkpoint_every_steps");
  out.checkpoint_every_seconds = std::chrono::seconds(config.get_int("checkpoint_every_seconds"));
  if ((out.checkpoint_every_steps > 0 || out.checkpoint_every_seconds.count() > 0) && out.checkpoint_dir.empty()) {
    return Status::InvalidArgument(
        "checkpoint_every_steps/checkpoint_every_seconds need checkpoint_dir (where the checkpoints go)");
  }
  out.checkpoint_max_to_keep = static_cast<int>(config.get_int("checkpoint_max_to_keep"));
  out.ps_recovery = config.get_bool("ps_recovery");
  out.checkpoint_on_preemption = config.get_bool("checkpoint_on_preemption");
  out.ps_recovery_timeout = std::chrono::milliseconds(config.get_int("ps_recovery_timeout_ms"));
  out.peer_snapshot_every_seconds = std::chrono::seconds(config.get_int("peer_snapshot_every_seconds"));
  // Well above the SDK's heartbeat, or a live program would lose its values.
  const int64_t grace = config.get_int("client_grace_ms");
  const int64_t min_grace = 3 * Coordinator::kClientHeartbeat.count();
  if (grace != 0 && grace < min_grace) {
    return Status::InvalidArgument("client_grace_ms: " + std::to_string(grace) + " must be 0 (never) or at least " +
                                   std::to_string(min_grace) + " (three of the SDK's " +
                                   std::to_string(Coordinator::kClientHeartbeat.count()) + " ms heartbeats)");
  }
  out.client_grace = std::chrono::milliseconds(grace);
  out.max_queued_closures = config.get_int("max_queued_closures");
  out.expected_workers = config.get_int("num_workers") > 0
                             ? static_cast<int>(config.get_int("num_workers"))
                             : static_cast<int>(config.cluster().addresses("worker").size());
  return out;
}

CoordinatorService::CoordinatorService(daemon::DaemonContext& ctx)
    : NodeService(ctx),
      config_(CoordinatorConfig::from(ctx.config).value()),  // checked by main() before
      parameter_servers_(ctx.loop->io(), ctx.loop->timer(), config_.ps, ctx.peer_options, ctx.codec),
      core_(config_, parameter_servers_, ctx.loop->timer(), ctx.pool, ctx.log),
      rendezvous_(ctx.loop->timer()) {
  // A restarted coordinator knows its variables, datasets and checkpoint
  // again before it serves anything; a damaged journal stops it.
  Status replayed = core_.open_journal();
  if (!replayed.ok()) async::throw_status(replayed);
  // SIGTERM: the running closures finish (and a checkpoint is saved when
  // checkpoint_dir is set) before the coordinator stops taking calls.
  ctx.on_drain.push_back([this]() { return core_.drain("SIGTERM"); });
  register_metrics(ctx.metrics, core_.stats());
  register_worker_metrics(ctx.metrics, core_.worker_times());
  register_status(ctx.status, core_.stats());
}

namespace {

double or_nan(const std::optional<double>& v) { return v.value_or(std::nan("")); }

std::string score_text(const WorkerTimes::Row& row) {
  if (!row.score) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f%s", *row.score, row.straggler ? " (straggler)" : "");
  return text;
}

}  // namespace

void CoordinatorService::register_worker_metrics(daemon::MetricsRegistry& metrics, std::shared_ptr<WorkerTimes> times) {
  // Series per worker as they appear; the observer runs on the loop thread.
  auto histograms = std::make_shared<std::map<int, std::unique_ptr<daemon::PhaseHistograms>>>();
  times->set_observer([&metrics, histograms](int task, const PhaseTimes& phases) {
    auto& series = (*histograms)[task];
    if (series == nullptr) {
      series = std::make_unique<daemon::PhaseHistograms>(
          metrics, "capstan_coordinator_worker_phase_seconds",
          "Where each closure's and synchronous step's time went, by worker (task index): queued at the coordinator, "
          "then on the worker waiting for input, the parameter servers, the collectives, and the rest (compute).",
          daemon::MetricLabels{{"worker", std::to_string(task)}});
    }
    series->observe(phases, /*with_queued=*/true);
  });
}

void CoordinatorService::register_status(daemon::StatusBoard& status, std::shared_ptr<const Coordinator::Stats> stats) {
  using S = Coordinator::Stats;
  using Plot = daemon::StatusBoard::Plot;
  status.plot("closures/s (completed)", Plot::kRate, daemon::stat_reader(stats, &S::closures_succeeded));
  status.plot("closures queued", Plot::kLevel, daemon::stat_reader(stats, &S::closures_queued));
  status.plot("closures running", Plot::kLevel, daemon::stat_reader(stats, &S::closures_running));
  status.plot("closure values kept", Plot::kLevel, daemon::stat_reader(stats, &S::results_kept));
  status.plot("synchronous steps/s", Plot::kRate, daemon::stat_reader(stats, &S::steps_completed));
  async::LoopThread* loop = ctx_.loop;
  // Each worker's straggler score and busy time per step, sampled here; the
  // sample also sets /metrics' straggler gauges.
  std::shared_ptr<WorkerTimes> times = core_.worker_times();
  daemon::MetricsRegistry* metrics = &ctx_.metrics;
  status.series([times, metrics]() {
    std::vector<daemon::StatusBoard::Series> out;
    for (auto& series : times->sample()) {
      daemon::StatusBoard::Series& plot = out.emplace_back();
      plot.title = std::move(series.title);
      for (auto& line : series.lines) plot.lines.push_back({std::move(line.label), std::move(line.points)});
    }
    for (const auto& row : times->rows()) {
      metrics
          ->gauge("capstan_coordinator_straggler_score",
                  "Each worker's busy time per step (collectives left out, smoothed) relative to the median worker's; "
                  "NaN until it has run a few steps. At or above 1.5 for 5 s, the log names it.",
                  {{"worker", std::to_string(row.task)}})
          ->set(or_nan(row.score));
    }
    return out;
  });
  // What the program reported (ClusterCoordinator::report_scalar), as kept.
  status.series([this, loop]() {
    auto reported = loop->run_sync([this]() { return core_.reported(); });
    std::vector<daemon::StatusBoard::Series> out;
    for (const auto& [tag, points] : reported) {
      daemon::StatusBoard::Series& series = out.emplace_back();
      series.title = tag + " (reported)";
      for (const auto& p : points) series.points.emplace_back(p.unix_seconds, p.value);
    }
    return out;
  });
  status.tables([this, loop, times]() {
    Coordinator::Overview o = loop->run_sync([this]() { return core_.overview(); });
    using Table = daemon::StatusBoard::Table;
    std::vector<Table> tables;
    Table& workers = tables.emplace_back();
    workers.title = "Workers";
    workers.columns = {"id", "task index", "address", "state", "runs", "busy s/step", "straggler score",
                       "where the time went"};
    std::map<int, WorkerTimes::Row> timed;
    for (const auto& row : times->rows()) timed[row.task] = row;
    for (const auto& w : o.workers) {
      std::vector<std::string> cells = {std::to_string(w.id), std::to_string(w.task_index),
                                        w.address.empty() ? "(not given)" : w.address, w.leaving ? "leaving" : "up"};
      auto row = timed.find(w.task_index);
      if (row != timed.end()) {
        char busy[32];
        std::snprintf(busy, sizeof(busy), "%.4f", row->second.busy);
        for (std::string cell : {std::to_string(row->second.runs), std::string(busy), score_text(row->second),
                                 format_phases(row->second.totals)}) {
          cells.push_back(std::move(cell));
        }
      } else {
        for (int i = 0; i < 4; ++i) cells.push_back("-");
      }
      workers.rows.push_back(std::move(cells));
    }
    if (o.workers.empty()) workers.note = "No worker has registered (start worker-server --coordinator ADDRESS).";
    Table& ps = tables.emplace_back();
    ps.title = "Parameter servers";
    ps.columns = {"task", "address", "state", "shards"};
    for (const auto& p : o.ps) {
      ps.rows.push_back({std::to_string(p.task), p.address, p.state, std::to_string(p.shards)});
    }
    if (o.ps.empty()) ps.note = "No parameter servers: start the coordinator with --ps (variables cannot be created).";
    Table& variables = tables.emplace_back();
    variables.title = "Variables";
    variables.columns = {"name", "dtype", "shape", "placement (shard: task, rows)"};
    for (const auto& v : o.placements.variables) {
      std::string placement;
      for (const auto& shard : v.shards) {
        placement += (placement.empty() ? "" : "; ") + shard.name + ": ps " + std::to_string(shard.ps_task) + ", " +
                     std::to_string(shard.first_row) + "+" + std::to_string(shard.rows);
      }
      std::string shape = v.table ? "[*, " + std::to_string(v.table->dim) + "] (embedding table)" : shape_string(v.shape);
      variables.rows.push_back({v.name, std::string(dtype_name(v.dtype)), shape, placement});
    }
    if (o.placements.variables.empty()) variables.note = "No variables yet.";
    Table& other = tables.emplace_back();
    other.title = "State";
    other.columns = {"what", "value"};
    other.rows.push_back({"per-worker datasets", std::to_string(o.per_worker_datasets)});
    other.rows.push_back({"last checkpoint", o.last_checkpoint.empty() ? "none" : o.last_checkpoint});
    return tables;
  });
}

void CoordinatorService::register_metrics(daemon::MetricsRegistry& metrics,
                                          std::shared_ptr<const Coordinator::Stats> stats) {
  auto read = [stats](const std::atomic<int64_t> Coordinator::Stats::*field) {
    return daemon::stat_reader(stats, field);
  };
  using S = Coordinator::Stats;
  metrics.callback_counter("capstan_coordinator_closures_scheduled_total", "Closures scheduled by programs.",
                           read(&S::closures_scheduled));
  metrics.callback_counter("capstan_coordinator_closures_succeeded_total", "Closures that returned a value.",
                           read(&S::closures_succeeded));
  metrics.callback_counter("capstan_coordinator_closures_failed_total",
                           "Closures that ended with an error (lost runs that were re-run are not counted).",
                           read(&S::closures_failed));
  metrics.callback_gauge("capstan_coordinator_closures_queued", "Closures waiting for a worker.",
                         read(&S::closures_queued));
  metrics.callback_gauge("capstan_coordinator_closures_running", "Closures running on workers.",
                         read(&S::closures_running));
  metrics.callback_gauge("capstan_coordinator_workers", "Workers registered.", read(&S::workers));
  metrics.callback_counter("capstan_coordinator_closures_released_total",
                           "Closure values programs let go (RemoteValues dropped, clients gone past client_grace_ms).",
                           read(&S::closures_released));
  metrics.callback_gauge("capstan_coordinator_results_kept",
                         "Finished closures whose values are kept for a fetch (programs still hold their RemoteValues).",
                         read(&S::results_kept));
  metrics.callback_gauge("capstan_coordinator_clients", "Program clients heard from within client_grace_ms.",
                         read(&S::clients));
  metrics.callback_counter("capstan_coordinator_checkpoints_saved_total", "Checkpoints saved by this coordinator.",
                           read(&S::checkpoints_saved));
  metrics.callback_counter("capstan_coordinator_steps_total",
                           "Synchronous training steps (MirroredStrategy run) completed on every replica.",
                           read(&S::steps_completed));
  metrics.callback_counter("capstan_coordinator_steps_failed_total",
                           "Synchronous training steps that failed (a replica lost, or a closure's error); their step "
                           "input goes to the next step.",
                           read(&S::steps_failed));
  metrics.callback_gauge("capstan_coordinator_step_replicas",
                         "Replicas that took part in the last synchronous step that succeeded (its workers are in "
                         "the coordinator's log at each formation).",
                         read(&S::step_replicas));
  metrics.callback_counter("capstan_coordinator_step_examples_total",
                           "Examples of the strategies' step inputs committed by synchronous steps (exactly once per "
                           "epoch).",
                           read(&S::step_examples));
  metrics.callback_counter("capstan_coordinator_ps_recoveries_total",
                           "Parameter servers restored from a checkpoint after coming back empty.",
                           read(&S::ps_recoveries));
  metrics.callback_counter("capstan_coordinator_ps_peer_recoveries_total",
                           "Parameter servers restored from their buddy's in-memory peer snapshot (of "
                           "capstan_coordinator_ps_recoveries_total).",
                           read(&S::ps_peer_recoveries));
  metrics.callback_counter("capstan_coordinator_peer_snapshots_total",
                           "Peer snapshots (deltas) a parameter server sent its buddy.", read(&S::peer_snapshots));
  metrics.callback_counter("capstan_coordinator_peer_snapshot_failures_total",
                           "Peer snapshots that failed (the next one is a full copy).",
                           read(&S::peer_snapshot_failures));
}

CoordinatorService::~CoordinatorService() = default;

// ---- Workers ---------------------------------------------------------------------

kj::Promise<void> CoordinatorService::registerWorker(RegisterWorkerContext context) {
  auto params = context.getParams();
  if (params.getAddress().size() > 1024) {
    async::check(Status::InvalidArgument("registerWorker: an address of " + std::to_string(params.getAddress().size()) +
                                       " bytes; give the worker's host:port"));
  }
  std::set<std::string> functions;
  for (auto f : params.getFunctions()) functions.insert(text(f));
  return core_
      .register_worker(params.getTaskIndex(), std::move(functions),
                       std::make_unique<RemoteWorker>(params.getWorker(), ctx_.codec, text(params.getAddress())))
      .then([this, context](int64_t id) mutable {
        context.getResults().setWorkerId(id);
        context.getResults().setTaskIndex(core_.worker_task_index(id));
      });
}

kj::Promise<void> CoordinatorService::leaveWorker(LeaveWorkerContext context) {
  auto params = context.getParams();
  return core_.leave_worker(params.getWorkerId(), text(params.getReason())).then([](Status status) {
    async::check(status);
  });
}

kj::Promise<void> CoordinatorService::workerAlive(WorkerAliveContext context) {
  context.getResults().setAlive(core_.worker_alive(context.getParams().getWorkerId()));
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::reportScalars(ReportScalarsContext context) {
  auto scalars = context.getParams().getScalars();
  if (scalars.size() > Coordinator::kReportedTags) {
    async::check(Status::InvalidArgument("reportScalars: " + std::to_string(scalars.size()) +
                                       " scalars in one call; send at most " +
                                       std::to_string(Coordinator::kReportedTags)));
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<Coordinator::ReportedScalar> reported;
  for (auto scalar : scalars) reported.push_back({text(scalar.getTag()), scalar.getValue(), scalar.getStep()});
  async::check(core_.report_scalars(reported, now));
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::numWorkers(NumWorkersContext context) {
  context.getResults().setCount(static_cast<int32_t>(core_.num_workers()));
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::workerStats(WorkerStatsContext context) {
  std::map<int, std::string> addresses;
  for (const auto& w : core_.overview().workers) addresses[w.task_index] = w.address;
  std::vector<WorkerTimes::Row> rows = core_.worker_times()->rows();
  auto out = context.getResults().initWorkers(static_cast<unsigned>(rows.size()));
  for (unsigned i = 0; i < rows.size(); ++i) {
    const WorkerTimes::Row& row = rows[i];
    out[i].setTaskIndex(row.task);
    out[i].setAddress(addresses[row.task]);
    out[i].setRuns(row.runs);
    rpc::phases_to_wire(row.totals, out[i]);
    out[i].setBusy(row.busy);
    out[i].setScore(or_nan(row.score));
    out[i].setStraggler(row.straggler);
  }
  auto totals = context.getResults().initTotals();
  totals.setTaskIndex(-1);
  rpc::phases_to_wire(core_.worker_times()->totals(), totals);
  totals.setScore(std::nan(""));
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::members(MembersContext context) {
  const CoordinatorOverview overview = core_.overview();
  auto out = context.getResults().initMembers(
      static_cast<unsigned>(1 + overview.ps.size() + overview.workers.size()));
  unsigned i = 0;
  out[i].setRole(wire::Role::COORDINATOR);
  out[i].setTaskIndex(ctx_.identity.task_index());
  out[i++].setAddress(ctx_.identity.rpc_address());
  for (const auto& ps : overview.ps) {
    out[i].setRole(wire::Role::PS);
    out[i].setTaskIndex(ps.task);
    out[i++].setAddress(ps.address);
  }
  for (const auto& w : overview.workers) {
    out[i].setRole(wire::Role::WORKER);
    out[i].setTaskIndex(w.task_index);
    out[i++].setAddress(w.address);
  }
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::closureNames(ClosureNamesContext context) {
  std::set<std::string> all = core_.closure_names();
  auto names = context.getResults().initNames(static_cast<unsigned>(all.size()));
  unsigned i = 0;
  for (const auto& n : all) names.set(i++, n);
  return kj::READY_NOW;
}

// ---- Variables ---------------------------------------------------------------------

kj::Promise<void> CoordinatorService::createVariable(CreateVariableContext context) {
  auto spec = context.getParams().getSpec();
  std::string name = text(spec.getName());
  auto partitioner = partitioner_from_wire(spec.getPartitioner());
  async::check(partitioner.status().with_context("createVariable '" + name + "'"));
  // The parameter servers check the values; an unknown kind is refused here.
  auto optimizer = rpc::optimizer_from_wire(spec.getOptimizer());
  async::check(optimizer.status().with_context("createVariable '" + name + "'"));
  VariableRequest request{name, Tensor(), *optimizer, *partitioner};
  if (spec.hasInitializer()) {
    auto initializer = rpc::initializer_from_wire(spec.getInitializer());
    async::check(initializer.status().with_context("createVariable '" + name + "'"));
    request.initializer = *initializer;
  }
  request.dtype = rpc::from_wire(spec.getDtype());
  for (int64_t d : spec.getShape()) request.shape.push_back(d);
  request.value_from_program = spec.getValueFromProgram();
  auto answer = [this, context, name](Result<VariableLocation> placed) mutable {
    async::check(placed.status());
    rpc::location_to_wire(*placed, context.getResults().initPlacement());
    context.getResults().setAwaitingValue(core_.awaiting_value(name));
  };
  if (!spec.hasInitial()) return core_.create_variable(std::move(request)).then(kj::mv(answer));
  // An older program's (or a small) value, through the coordinator.
  return rpc::read_tensor(spec.getInitial())
      .then([this, request = std::move(request)](Tensor&& initial) mutable {
        request.initial = std::move(initial);
        return core_.create_variable(std::move(request));
      })
      .then(kj::mv(answer));
}

kj::Promise<void> CoordinatorService::variableWritten(VariableWrittenContext context) {
  async::check(core_.variable_written(text(context.getParams().getName())));
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::createEmbeddingTable(CreateEmbeddingTableContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  auto spec = rpc::table_from_wire(params.getConfig());
  async::check(spec.status().with_context("createEmbeddingTable '" + name + "'"));
  spec->name = name;
  return core_.create_table(std::move(*spec)).then([context](Result<VariableLocation> placed) mutable {
    async::check(placed.status());
    rpc::location_to_wire(*placed, context.getResults().initPlacement());
  });
}

kj::Promise<void> CoordinatorService::exportEmbeddingTable(ExportEmbeddingTableContext context) {
  auto params = context.getParams();
  return core_.export_table(text(params.getName()), text(params.getSinceCheckpoint()), text(params.getPath()))
      .then([context](Result<int64_t> rows) mutable {
        async::check(rows.status());
        context.getResults().setRows(*rows);
      });
}

kj::Promise<void> CoordinatorService::placements(PlacementsContext context) {
  Placements all = core_.placements();
  auto out = context.getResults().initPlacements();
  out.setVersion(all.version);
  auto list = out.initVariables(static_cast<unsigned>(all.variables.size()));
  for (unsigned i = 0; i < all.variables.size(); ++i) rpc::location_to_wire(all.variables[i], list[i]);
  return kj::READY_NOW;
}

// ---- Closures ----------------------------------------------------------------------

// A schedule's arguments as kept: the program's encoded bytes as they are,
// or (from a client that sends a Common.Element) its encoding.
template <typename Reader>
kj::Promise<std::string> args_of(Reader request) {
  if (request.hasEncodedArgs()) {
    async::check(check_payload_frame(request.getEncodedArgs()));
    return payload_of(request.getEncodedArgs());
  }
  return payload_from_element(request.getArgs());
}

kj::Promise<void> CoordinatorService::schedule(ScheduleContext context) {
  auto params = context.getParams();
  std::string function = text(params.getFunction());
  uint64_t client_id = params.getClientId();
  int64_t request_seq = params.getRequestSeq();
  return args_of(params)
      .then([this, function, client_id, request_seq](std::string args) mutable {
        auto id = core_.schedule(function, std::move(args), client_id, request_seq);
        async::check(id.status());
        // Answered once the closure is journaled (at once without work_dir)
        // and the queue has room (the client's backpressure).
        return core_.journal_synced().then([this, id = *id](Status synced) {
          async::check(synced);
          return core_.queue_room().then([id]() { return id; });
        });
      })
      .then([this, context](int64_t id) mutable {
        context.getResults().setClosureId(id);
        context.getResults().setDurable(core_.durable());
      });
}

// The values of one scheduleMany call's entries, by index. Holds the
// service (through its capability) while a program holds it.
class CoordinatorService::BatchValues final : public wire::ClosureValues::Server {
 public:
  BatchValues(CoordinatorService& service, wire::Coordinator::Client keep, std::vector<Result<int64_t>> ids)
      : service_(service), keep_(kj::mv(keep)), ids_(std::move(ids)) {}

 protected:
  kj::Promise<void> fetch(FetchContext context) override {
    uint32_t index = context.getParams().getIndex();
    if (index >= ids_.size()) {
      async::throw_status(Status::InvalidArgument("fetch: entry " + std::to_string(index) + " of a call of " +
                                                std::to_string(ids_.size()) + " closures"));
    }
    async::check(ids_[index].status());
    return service_.fetch_value(*ids_[index], context.getParams().getEncoded(), context.getResults());
  }

 private:
  CoordinatorService& service_;
  wire::Coordinator::Client keep_;
  const std::vector<Result<int64_t>> ids_;
};

template <typename Results>
kj::Promise<void> CoordinatorService::fetch_value(int64_t id, bool encoded, Results out) {
  return core_.fetch(id).then([this, encoded, out](Result<std::string> value) mutable {
    async::check(value.status());
    // The worker's bytes as they are; a value past the inline limit goes
    // as an element, whose tensors the program pulls in chunks.
    if (encoded && value->size() <= ctx_.codec.inline_limit) {
      out.setEncodedValue(payload_bytes(*value));
      return;
    }
    async::check(write_payload_element(out.initValue(), *value, ctx_.codec));
  });
}

kj::Promise<void> CoordinatorService::scheduleMany(ScheduleManyContext context) {
  constexpr unsigned kMaxEntries = 4096;
  auto params = context.getParams();
  auto entries = params.getEntries();
  if (entries.size() > kMaxEntries) {
    async::throw_status(Status::InvalidArgument("scheduleMany: " + std::to_string(entries.size()) +
                                              " entries; at most " + std::to_string(kMaxEntries) +
                                              " per call (send the rest in another call)"));
  }
  uint64_t client_id = params.getClientId();
  // The releases first: a bad id refuses the whole call, nothing scheduled.
  if (params.hasReleases()) {
    async::check(release_ids(params.getReleases(), client_id, params.getReleaseIncarnation(), "scheduleMany"));
  }
  // Arguments are read first (a chunked one is pulled from the client), then
  // every entry is scheduled in order in one turn of the loop.
  auto reads = kj::heapArrayBuilder<kj::Promise<Result<std::string>>>(entries.size());
  for (auto entry : entries) {
    if (entry.hasEncodedArgs()) {
      // The common case: the bytes are kept as the program sent them.
      Status framed = check_payload_frame(entry.getEncodedArgs());
      reads.add(framed.ok() ? Result<std::string>(payload_of(entry.getEncodedArgs())) : Result<std::string>(framed));
      continue;
    }
    reads.add(payload_from_element(entry.getArgs())
                  .then([](std::string args) { return Result<std::string>(std::move(args)); },
                        [](kj::Exception&& e) { return Result<std::string>(async::from_exception(e)); }));
  }
  return kj::joinPromises(reads.finish())
      .then([this, context, client_id](kj::Array<Result<std::string>> args) mutable {
        auto entries = context.getParams().getEntries();
        auto outcomes = context.getResults().initOutcomes(entries.size());
        std::vector<Result<int64_t>> ids;
        ids.reserve(entries.size());
        for (unsigned i = 0; i < entries.size(); ++i) {
          Result<int64_t> id = args[i].status();
          if (args[i].ok()) {
            id = core_.schedule(text(entries[i].getFunction()), std::move(*args[i]), client_id,
                                entries[i].getRequestSeq());
          }
          if (id.ok()) {
            outcomes[i].setClosureId(*id);
          } else {
            rpc::status_to_wire(id.status(), outcomes[i].initError());
          }
          ids.push_back(std::move(id));
        }
        context.getResults().setValues(kj::heap<BatchValues>(*this, thisCap(), std::move(ids)));
        return core_.journal_synced();
      })
      .then([this, context](Status synced) mutable {
        async::check(synced);
        context.getResults().setDurable(core_.durable());
        context.getResults().setIncarnation(core_.incarnation());
        // The SDK bounds the schedules it has no answer for: holding the
        // answer while the queue is full makes a program that schedules
        // faster than the workers run wait, as TF's schedule does.
        return core_.queue_room();
      });
}

kj::Promise<void> CoordinatorService::join(JoinContext context) {
  return core_.join().then([](Status status) { async::check(status); });
}

kj::Promise<void> CoordinatorService::done(DoneContext context) {
  auto done = core_.done();
  async::check(done.status());
  context.getResults().setDone(*done);
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::fetch(FetchContext context) {
  auto params = context.getParams();
  return fetch_value(params.getClosureId(), params.getEncoded(), context.getResults());
}

Status CoordinatorService::release_ids(capnp::List<int64_t>::Reader ids, uint64_t client_id, uint64_t incarnation,
                                       const char* call) {
  // Checked before the copy: a huge list is refused without allocating for it.
  if (ids.size() > Coordinator::kMaxReleasePerCall) {
    return Status::InvalidArgument(std::string(call) + ": " + std::to_string(ids.size()) + " closure ids to release; at most " +
                                   std::to_string(Coordinator::kMaxReleasePerCall) +
                                   " per call (send the rest in another call)");
  }
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (int64_t id : ids) out.push_back(id);
  return core_.release(out, client_id, incarnation).with_context(call);
}

kj::Promise<void> CoordinatorService::release(ReleaseContext context) {
  auto params = context.getParams();
  async::check(release_ids(params.getClosureIds(), params.getClientId(), params.getIncarnation(), "release"));
  return kj::READY_NOW;
}

// ---- Per-worker datasets ------------------------------------------------------------

kj::Promise<void> CoordinatorService::createPerWorkerDataset(CreatePerWorkerDatasetContext context) {
  auto bytes = context.getParams().getDefinition();
  std::string definition(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  return core_.create_per_worker_dataset(std::move(definition), text(context.getParams().getName()))
      .then([context](Result<int64_t> id) mutable {
    async::check(id.status());
    context.getResults().setDatasetId(*id);
  });
}

kj::Promise<void> CoordinatorService::createPerWorkerDatasetFromFunction(
    CreatePerWorkerDatasetFromFunctionContext context) {
  return core_
      .create_per_worker_dataset_from_function(text(context.getParams().getFunction()),
                                               text(context.getParams().getName()))
      .then([context](Result<int64_t> id) mutable {
        async::check(id.status());
        context.getResults().setDatasetId(*id);
      });
}

// ---- Checkpoints -------------------------------------------------------------------

kj::Promise<void> CoordinatorService::saveCheckpoint(SaveCheckpointContext context) {
  auto params = context.getParams();
  return core_.save_checkpoint(text(params.getDirectory()), params.getStep(), params.getMaxToKeep())
      .then([context](Result<std::string> path) mutable {
        async::check(path.status());
        context.getResults().setPath(*path);
      });
}

kj::Promise<void> CoordinatorService::restoreCheckpoint(RestoreCheckpointContext context) {
  auto params = context.getParams();
  return core_.restore_checkpoint(text(params.getPath()), params.getStrict())
      .then([context](Result<Coordinator::Restored> restored) mutable {
        async::check(restored.status());
        auto results = context.getResults();
        results.setStep(restored->step);
        auto names = results.initNotInCheckpoint(static_cast<unsigned>(restored->not_in_checkpoint.size()));
        for (unsigned i = 0; i < restored->not_in_checkpoint.size(); ++i) names.set(i, restored->not_in_checkpoint[i]);
      });
}

kj::Promise<void> CoordinatorService::joinGroup(JoinGroupContext context) {
  auto params = context.getParams();
  return rendezvous_
      .join(text(params.getName()), params.getSize(), params.getRank(), text(params.getAddress()),
            std::chrono::milliseconds(params.getTimeoutMs()))
      .then([context](Result<GroupMembership> group) mutable {
        async::check(group.status());
        auto results = context.getResults();
        results.setGeneration(group->generation);
        results.setRank(group->rank);
        auto addresses = results.initAddresses(static_cast<unsigned>(group->addresses.size()));
        for (unsigned i = 0; i < group->addresses.size(); ++i) addresses.set(i, group->addresses[i]);
      });
}

// ---- Synchronous training --------------------------------------------------------

kj::Promise<void> CoordinatorService::createStrategy(CreateStrategyContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  StrategyConfig config;
  config.min_replicas = params.getOptions().getMinReplicas();
  auto settings = rpc::settings_from_wire(params.getOptions().getSettings());
  async::check(settings.status().with_context("createStrategy '" + name + "'"));
  config.settings = *settings;
  constexpr unsigned kMaxVariables = 100000;
  if (params.getVariables().size() > kMaxVariables) {
    async::check(Status::InvalidArgument("createStrategy '" + name + "': " +
                                       std::to_string(params.getVariables().size()) + " variables; at most " +
                                       std::to_string(kMaxVariables)));
  }
  auto variables = std::make_shared<std::vector<MirroredVariableInit>>(params.getVariables().size());
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(params.getVariables().size());
  for (unsigned i = 0; i < params.getVariables().size(); ++i) {
    auto v = params.getVariables()[i];
    auto& out = (*variables)[i];
    out.name = text(v.getName());
    auto optimizer = rpc::optimizer_from_wire(v.getOptimizer());
    async::check(optimizer.status().with_context("createStrategy '" + name + "', variable '" + out.name + "'"));
    out.optimizer = *optimizer;
    reads.add(rpc::read_tensor(v.getInitial()).then([&out](Tensor&& t) { out.initial = std::move(t); }));
  }
  return kj::joinPromises(reads.finish()).then([this, name, config, variables, context]() mutable {
    async::check(core_.create_strategy(name, std::move(*variables), config));
    context.getResults().setDurable(core_.durable());
  });
}

kj::Promise<void> CoordinatorService::runStep(RunStepContext context) {
  auto params = context.getParams();
  std::string strategy = text(params.getStrategy());
  std::string function = text(params.getFunction());
  return rpc::read_element(params.getArgs())
      .then([this, strategy, function](Element&& args) mutable {
        return core_.run_step(std::move(strategy), std::move(function), rpc::element_to_bytes(args));
      })
      .then([this, context](Result<StepOutcome> outcome) mutable {
        async::check(outcome.status());
        auto results = context.getResults();
        results.setStep(outcome->steps);
        results.setEpoch(outcome->epoch);
        auto values = results.initValues(static_cast<unsigned>(outcome->values.size()));
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(ctx_.codec, &references);
        for (unsigned i = 0; i < outcome->values.size(); ++i) {
          auto element = rpc::element_from_bytes(outcome->values[i]);
          async::check(element.status());
          rpc::write_element(values[i], *element, codec);
        }
        auto tasks = results.initTaskIndexes(static_cast<unsigned>(outcome->task_indexes.size()));
        for (unsigned i = 0; i < outcome->task_indexes.size(); ++i) tasks.set(i, outcome->task_indexes[i]);
        auto examples = results.initExamples(static_cast<unsigned>(outcome->examples.size()));
        for (unsigned i = 0; i < outcome->examples.size(); ++i) examples.set(i, outcome->examples[i]);
        results.setInputPosition(outcome->input_position);
      });
}

kj::Promise<void> CoordinatorService::distributeStepInput(DistributeStepInputContext context) {
  auto params = context.getParams();
  StepInputConfig config;
  config.global_batch = params.getGlobalBatch();
  config.per_replica_batch = params.getPerReplicaBatch();
  config.seed = params.getSeed();
  config.shuffle = params.getShuffle();
  auto definition = params.getDefinition();
  return core_
      .distribute_step_input(text(params.getStrategy()),
                             std::string(reinterpret_cast<const char*>(definition.begin()), definition.size()), config)
      .then([context](Result<int64_t> id) mutable {
        async::check(id.status());
        context.getResults().setDatasetId(*id);
      });
}

kj::Promise<void> CoordinatorService::readMirrored(ReadMirroredContext context) {
  auto params = context.getParams();
  return core_.read_mirrored(text(params.getStrategy()), text(params.getName()))
      .then([this, context](Result<std::pair<Tensor, int64_t>> read) mutable {
        async::check(read.status());
        rpc::write_tensor(context.getResults().initValue(), read->first, ctx_.codec);
        context.getResults().setStep(read->second);
      });
}

kj::Promise<void> CoordinatorService::strategyStatus(StrategyStatusContext context) {
  return core_.strategy_status(text(context.getParams().getStrategy()))
      .then([context](Result<StrategyStatus> status) mutable {
        async::check(status.status());
        auto results = context.getResults();
        results.setEpoch(status->epoch);
        results.setSteps(status->steps);
        auto replicas = results.initReplicas(static_cast<unsigned>(status->replicas.size()));
        for (unsigned i = 0; i < status->replicas.size(); ++i) {
          const auto& r = status->replicas[i];
          replicas[i].setWorkerId(r.worker_id);
          replicas[i].setTaskIndex(r.task_index);
          replicas[i].setRank(r.rank);
          replicas[i].setHolds(r.report.holds);
          replicas[i].setStep(r.report.step);
          replicas[i].setChecksum(r.report.checksum);
          if (!r.status.ok()) replicas[i].setError(r.status.to_string());
        }
      });
}

}  // namespace capstan::coordinator
