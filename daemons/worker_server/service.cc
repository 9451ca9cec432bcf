#include "daemons/worker_server/service.h"

#include <cmath>
#include <optional>
#include <string>

#include "async/status_exception.h"
#include "rpc/errors.h"
#include "rpc/phase_codec.h"
#include "rpc/placement_codec.h"
#include "async/pool.h"
#include "rpc/replica_codec.h"
#include "rpc/tensor_codec.h"

namespace capstan::worker_server {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

kj::TimePoint far_future(kj::Timer& timer) { return timer.now() + 3650 * 24 * 3600 * kj::SECONDS; }

// The IP address the other workers dial for collectives: collective_host
// when set; else `host` when it names one interface; else the address this
// machine uses to reach the coordinator (the interface the cluster shares:
// a wrong one is the classic trap of Gloo and NCCL).
std::string collective_host(daemon::DaemonContext& ctx, const std::string& coordinator) {
  std::string configured = ctx.config.get_string("collective_host");
  if (!configured.empty()) return configured;
  std::string host = ctx.config.get_string("host");
  if (host != "0.0.0.0" && host != "::" && !host.empty()) return host;
  return daemon::local_address_towards(coordinator).value_or("127.0.0.1");
}

// A run's fields that runClosure's params and a runClosures ClosureRunSpec
// share (all but the arguments, read apart, and the strategy's).
template <typename Reader>
RunClosureRequest run_request_of(Reader run) {
  RunClosureRequest request;
  request.closure_id = run.getClosureId();
  // Beyond year 2250 is no deadline (and would overflow the clock).
  if (run.getDeadlineUnixMs() > 0 && run.getDeadlineUnixMs() < int64_t{9'000'000'000'000}) {
    request.deadline = std::chrono::system_clock::time_point(std::chrono::milliseconds(run.getDeadlineUnixMs()));
  }
  request.function = text(run.getFunction());
  request.placement_version = run.getPlacementVersion();
  // A coordinator older than these fields sends 0.
  request.attempt = std::max<int>(1, static_cast<int>(run.getAttempt()));
  request.num_workers = std::max<int>(1, static_cast<int>(run.getNumWorkers()));
  request.worker_index = run.getWorkerIndex();
  return request;
}

// A closure's value as it is answered: as one flat Element message
// (rpc::element_to_bytes; the coordinator keeps these bytes as they are) to
// a run whose arguments came so, unless it is larger than `inline_limit`;
// else as an element (its tensors referenced or pulled in chunks).
struct Answer {
  bool encoded = false;
  bool input_taken = false;  // a synchronous step read its step input
  PhaseTimes phases;         // where the run's time went
  std::string bytes;
  Element element;
};

Answer answer_of(Element value, bool encoded, size_t inline_limit) {
  Answer answer;
  size_t raw = 0;
  for (const Tensor& t : value.components) raw += t.byte_size();
  if (encoded && raw <= inline_limit) {
    answer.bytes = rpc::element_to_bytes(value);
    answer.encoded = answer.bytes.size() <= inline_limit;
  }
  if (!answer.encoded) {
    answer.bytes.clear();
    answer.element = std::move(value);
  }
  return answer;
}

std::string bytes_of(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

// Decodes encoded arguments into `request` (on the pool).
Status decode_args(const std::string& encoded, RunClosureRequest& request) {
  auto args = rpc::element_from_bytes(encoded);
  if (!args.ok()) {
    return args.status().with_context("the arguments of closure " + std::to_string(request.closure_id) + " (" +
                                      request.function + ")");
  }
  request.args = std::move(*args);
  return Status::Ok();
}

}  // namespace

WorkerService::WorkerService(daemon::DaemonContext& ctx)
    : NodeService(ctx), tasks_(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  std::string address;
  for (const auto& peer : ctx.peers) {
    if (peer.role == wire::Role::COORDINATOR) address = peer.address;
  }
  coordinator_ = kj::heap<rpc::Connection>(ctx.loop->io(), ctx.loop->timer(), address, ctx.peer_options);
  rpc::Connection* coordinator = coordinator_.get();
  kj::Timer* timer = &ctx.loop->timer();
  router_ = std::make_shared<VariableRouter>(
      *ctx.loop, ctx.peer_options, ctx.codec, std::chrono::seconds(60), [coordinator, timer]() {
        auto deadline = timer->now() + 10 * kj::SECONDS;
        return coordinator->service<wire::Coordinator>(deadline).then([](wire::Coordinator::Client c) {
          return c.placementsRequest().send().then([](capnp::Response<wire::Coordinator::PlacementsResults>&& r) {
            std::vector<VariableLocation> variables;
            for (auto v : r.getPlacements().getVariables()) variables.push_back(rpc::location_from_wire(v));
            return std::make_pair(r.getPlacements().getVersion(), std::move(variables));
          });
        });
      });
  replicas_ = std::make_shared<Replicas>(collective_host(ctx, address),
                                         std::max<int64_t>(0, ctx.config.get_int("replica_memory_mib")) << 20);
  ctx.log->info("collective data address (synchronous training): {} (set collective_host to change it)",
                replicas_->host());
  worker_ = std::make_shared<Worker>(*ctx.functions, *router_, ctx.identity.task_index(), replicas_.get());
  phase_histograms_ = std::make_shared<daemon::PhaseHistograms>(
      ctx.metrics, "capstan_worker_phase_seconds",
      "Where each closure's and synchronous step's time went on this worker: waiting for input, the parameter "
      "servers, the collectives, and the rest (compute).");
  worker_->set_step_input_budget(std::max<int64_t>(0, ctx.config.get_int("step_input_memory_mib")) << 20);
  tasks_->add(register_with_coordinator());
  // The coordinator holds this service's capability (registerWorker) over
  // coordinator_, which this service owns: close it at shutdown so that the
  // service is released.
  ctx.on_stop.push_back([this]() {
    tasks_ = nullptr;
    coordinator_ = nullptr;
  });
  // SIGTERM (preemption, a rolling restart): leave the coordinator first, so
  // that the closures running here finish and none is sent any more.
  ctx.on_drain.push_back([this]() { return leave_coordinator(); });
}

kj::Promise<void> WorkerService::leave_coordinator() {
  tasks_ = kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this));  // no registering again
  if (worker_id_ == 0 || !coordinator_->connected()) return kj::READY_NOW;
  ctx_.log->info("leaving the coordinator as worker {}: the closures running here finish first", worker_id_);
  return coordinator_->service<wire::Coordinator>(ctx_.loop->timer().now() + 2 * kj::SECONDS)
      .then([this](wire::Coordinator::Client coordinator) {
        auto request = coordinator.leaveWorkerRequest();
        request.setWorkerId(worker_id_);
        request.setReason("SIGTERM");
        return request.send().ignoreResult();
      })
      .then([this]() { ctx_.log->info("left the coordinator"); },
            [this](kj::Exception&& e) {
              ctx_.log->warn("leaving the coordinator failed ({}); its running closures run again elsewhere",
                             async::from_exception(e).to_string());
            });
}

WorkerService::~WorkerService() = default;

void WorkerService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("worker task failed: {}", async::from_exception(exception).to_string());
}

kj::Promise<void> WorkerService::register_with_coordinator() {
  return coordinator_->service<wire::Coordinator>(far_future(ctx_.loop->timer()))
      .then([this](wire::Coordinator::Client coordinator) {
        auto request = coordinator.registerWorkerRequest();
        request.setWorker(thisCap());
        // Once assigned, the same index again (a new coordinator keeps the
        // worker's shard of each per-worker dataset).
        request.setTaskIndex(worker_->task_index());
        request.setAddress(ctx_.identity.rpc_address());
        auto names = worker_->function_names();
        auto list = request.initFunctions(static_cast<unsigned>(names.size()));
        for (unsigned i = 0; i < names.size(); ++i) list.set(i, names[i]);
        return request.send();
      })
      .then(
          [this](capnp::Response<wire::Coordinator::RegisterWorkerResults>&& response) {
            worker_id_ = response.getWorkerId();
            worker_->drop_stale_datasets();
            if (worker_->task_index() < 0) {
              worker_->set_task_index(response.getTaskIndex());
              ctx_.log->info("registered with the coordinator as worker {}, task index {} (assigned: started "
                             "without --task-index)",
                             worker_id_, response.getTaskIndex());
            } else {
              ctx_.log->info("registered with the coordinator as worker {}", worker_id_);
            }
            // A failed liveness check (the link broke: a partition, a
            // restart) means "register again", never the end of this loop.
            return until_dropped().catch_([this](kj::Exception&& e) {
              ctx_.log->warn("lost the coordinator ({}); registering again when it is back",
                             async::from_exception(e).to_string());
              return ctx_.loop->timer().afterDelay(1 * kj::SECONDS);
            });
          },
          [this](kj::Exception&& e) {
            ctx_.log->warn("registering with the coordinator failed: {}; retrying",
                           async::from_exception(e).to_string());
            return ctx_.loop->timer().afterDelay(1 * kj::SECONDS);
          })
      .then([this]() {
        // The coordinator went away (or refused): register again when it is
        // back. It sends its per-worker datasets before it answers; the ones
        // it does not send again are forgotten then, and a restarted durable
        // coordinator's (the same uids) keep their iterators where they were.
        worker_->mark_datasets_stale();
        return register_with_coordinator();
      });
}

kj::Promise<void> WorkerService::until_dropped() {
  auto check = ctx_.loop->timer().afterDelay(3 * kj::SECONDS).then([this]() {
    return coordinator_->service<wire::Coordinator>(ctx_.loop->timer().now() + 5 * kj::SECONDS)
        .then([this](wire::Coordinator::Client coordinator) {
          auto request = coordinator.workerAliveRequest();
          request.setWorkerId(worker_id_);
          return request.send();
        })
        .then([this](capnp::Response<wire::Coordinator::WorkerAliveResults>&& response) -> kj::Promise<void> {
          if (response.getAlive()) return until_dropped();
          ctx_.log->warn("the coordinator dropped this worker (it missed pings); registering again");
          return kj::READY_NOW;
        });
  });
  return coordinator_->on_disconnect().exclusiveJoin(kj::mv(check));
}

kj::Promise<void> WorkerService::createDataset(CreateDatasetContext context) {
  auto params = context.getParams();
  int64_t id = params.getDatasetId();
  std::string definition(reinterpret_cast<const char*>(params.getDefinition().begin()),
                         params.getDefinition().size());
  uint64_t uid = params.getUid();
  auto worker = worker_;
  return async::run_on_pool(ctx_.pool,
                          [worker, id, definition, uid]() { return worker->create_dataset(id, definition, uid); })
      .then([](Status status) { async::check(status); });
}

kj::Promise<void> WorkerService::saveIterator(SaveIteratorContext context) {
  int64_t id = context.getParams().getDatasetId();
  auto worker = worker_;
  return async::run_on_pool(ctx_.pool, [worker, id]() { return worker->save_iterator(id); })
      .then([context](Result<std::string> state) mutable {
        async::check(state.status());
        context.getResults().setState(
            kj::arrayPtr(reinterpret_cast<const kj::byte*>(state->data()), state->size()));
      });
}

kj::Promise<void> WorkerService::restoreIterator(RestoreIteratorContext context) {
  auto params = context.getParams();
  int64_t id = params.getDatasetId();
  std::string state(reinterpret_cast<const char*>(params.getState().begin()), params.getState().size());
  auto worker = worker_;
  return async::run_on_pool(ctx_.pool, [worker, id, state = std::move(state)]() {
           return worker->restore_iterator(id, state);
         })
      .then([](Status status) { async::check(status); });
}

kj::Promise<void> WorkerService::createDatasetFromFunction(CreateDatasetFromFunctionContext context) {
  auto params = context.getParams();
  int64_t id = params.getDatasetId();
  std::string name = text(params.getFunction());
  InputContext input{params.getNumWorkers(), params.getWorkerIndex()};
  uint64_t uid = params.getUid();
  auto worker = worker_;
  return async::run_on_pool(ctx_.pool, [worker, id, name, input, uid]() {
           return worker->create_dataset_from_function(id, name, input, uid);
         })
      .then([](Status status) { async::check(status); });
}

// runClosure's stepInput, checked.
Result<training::StepInput> step_input_of(wire::StepInput::Reader in) {
  training::StepInput out;
  out.dataset_id = in.getDatasetId();
  out.start = in.getStart();
  out.count = in.getCount();
  out.first = in.getFirst();
  out.end = in.getEnd();
  out.seed = in.getSeed();
  out.shuffle = in.getShuffle();
  out.weight = in.getWeight();
  constexpr int64_t kMaxCount = int64_t{1} << 24;
  if (out.first < 0 || out.start < out.first || out.count < 1 || out.count > kMaxCount ||
      out.start > out.end - out.count || !std::isfinite(out.weight) || out.weight < 0) {
    return Status::InvalidArgument("runClosure: step input positions [" + std::to_string(out.start) + ", +" +
                                   std::to_string(out.count) + ") of the step's [" + std::to_string(out.first) + ", " +
                                   std::to_string(out.end) + ") with weight " + std::to_string(out.weight) +
                                   " are not a share of a step (count 1 to " + std::to_string(kMaxCount) +
                                   ", weight finite and >= 0)");
  }
  return out;
}

kj::Promise<void> WorkerService::runClosure(RunClosureContext context) {
  auto params = context.getParams();
  RunClosureRequest request = run_request_of(params);
  async::check(worker_->check_closure(request.function));  // before reading the arguments
  request.strategy = text(params.getStrategy());
  request.epoch = params.getEpoch();
  if (params.getHasStepInput()) {
    if (request.strategy.empty()) async::check(Status::InvalidArgument("runClosure: a step input without a strategy"));
    auto input = step_input_of(params.getStepInput());
    async::check(input.status());
    request.step_input = *input;
  }
  auto worker = worker_;
  const bool encoded = params.hasEncodedArgs();
  const size_t limit = ctx_.codec.inline_limit;
  // Encoded arguments are decoded, and the value encoded, on the pool.
  struct Args {
    std::string bytes;  // encoded
    Element element;    // not encoded
  };
  kj::Promise<Args> args = encoded ? kj::Promise<Args>(Args{bytes_of(params.getEncodedArgs()), {}})
                                   : rpc::read_element(params.getArgs()).then([](Element&& read) {
                                       return Args{{}, std::move(read)};
                                     });
  return args
      .then([this, worker, request = std::move(request), encoded, limit](Args args) mutable {
        request.args = std::move(args.element);
        return async::run_on_pool(ctx_.pool, [worker, request = std::move(request), bytes = std::move(args.bytes), encoded,
                                            limit, phase_histograms = phase_histograms_]() mutable -> Result<Answer> {
          if (encoded) CAPSTAN_RETURN_IF_ERROR(decode_args(bytes, request));
          RunInfo info;
          Result<Element> value = worker->run_closure(request, &info);
          phase_histograms->observe(info.phases);
          CAPSTAN_RETURN_IF_ERROR(value.status());
          Answer answer = answer_of(std::move(*value), encoded, limit);
          answer.input_taken = info.took_step_input;
          answer.phases = info.phases;
          return answer;
        });
      })
      .then([this, context](Result<Answer> answer) mutable {
        async::check(answer.status());
        context.getResults().setInputTaken(answer->input_taken);
        rpc::phases_to_wire(answer->phases, context.getResults().initPhases());
        if (answer->encoded) {
          context.getResults().setEncodedResult(
              kj::arrayPtr(reinterpret_cast<const kj::byte*>(answer->bytes.data()), answer->bytes.size()));
          return;
        }
        rpc::write_element(context.getResults().initResult(), answer->element, ctx_.codec);
      });
}

kj::Promise<void> WorkerService::runClosures(RunClosuresContext context) {
  constexpr unsigned kMaxRuns = 1024;
  auto runs = context.getParams().getRuns();
  if (runs.size() > kMaxRuns) {
    async::throw_status(Status::InvalidArgument("runClosures: " + std::to_string(runs.size()) + " runs; at most " +
                                              std::to_string(kMaxRuns) + " per call"));
  }
  // Each run's request, or the error that keeps it from running.
  auto requests = std::make_shared<std::vector<Result<RunClosureRequest>>>();
  requests->reserve(runs.size());
  // The arguments of the runs that came encoded, by run.
  auto encoded = std::make_shared<std::vector<std::optional<std::string>>>(runs.size());
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(runs.size());
  for (unsigned i = 0; i < runs.size(); ++i) {
    auto run = runs[i];
    RunClosureRequest request = run_request_of(run);
    Status known = worker_->check_closure(request.function);
    if (!known.ok()) {
      requests->push_back(known);
      reads.add(kj::READY_NOW);
      continue;
    }
    requests->push_back(std::move(request));
    if (run.hasEncodedArgs()) {
      // Decoded on the pool with the batch.
      (*encoded)[i] = bytes_of(run.getEncodedArgs());
      reads.add(kj::READY_NOW);
      continue;
    }
    reads.add(rpc::read_element(run.getArgs())
                  .then([requests, i](Element&& args) { (*requests)[i]->args = std::move(args); },
                        [requests, i](kj::Exception&& e) { (*requests)[i] = async::from_exception(e); }));
  }
  auto worker = worker_;
  const size_t limit = ctx_.codec.inline_limit;
  return kj::joinPromises(reads.finish())
      .then([this, worker, requests, encoded, limit]() {
        // One trip to the pool for the whole batch, the runs in order.
        return async::run_on_pool(ctx_.pool, [worker, requests, encoded, limit,
                                            phase_histograms = phase_histograms_]() {
          for (size_t i = 0; i < requests->size(); ++i) {
            if (!(*encoded)[i] || !(*requests)[i].ok()) continue;
            Status decoded = decode_args(*(*encoded)[i], *(*requests)[i]);
            if (!decoded.ok()) (*requests)[i] = decoded;
          }
          std::vector<RunInfo> infos;
          std::vector<Result<Element>> values = worker->run_closures(*requests, &infos);
          std::vector<Result<Answer>> answers;
          answers.reserve(values.size());
          for (size_t i = 0; i < values.size(); ++i) {
            if ((*requests)[i].ok()) phase_histograms->observe(infos[i].phases);
            if (!values[i].ok()) {
              answers.push_back(values[i].status());
              continue;
            }
            answers.push_back(answer_of(std::move(*values[i]), (*encoded)[i].has_value(), limit));
            answers.back()->phases = infos[i].phases;
          }
          return answers;
        });
      })
      .then([this, context](std::vector<Result<Answer>> answers) mutable {
        auto out = context.getResults().initOutcomes(static_cast<unsigned>(answers.size()));
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(ctx_.codec, &references);
        for (unsigned i = 0; i < answers.size(); ++i) {
          if (!answers[i].ok()) {
            rpc::status_to_wire(answers[i].status(), out[i].initError());
            continue;
          }
          rpc::phases_to_wire(answers[i]->phases, out[i].initPhases());
          if (answers[i]->encoded) {
            const std::string& bytes = answers[i]->bytes;
            out[i].setEncodedValue(kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
          } else {
            rpc::write_element(out[i].initValue(), answers[i]->element, codec);
          }
        }
      });
}

// ---- Replicas (synchronous training) -------------------------------------------------

kj::Promise<void> WorkerService::replicaStatus(ReplicaStatusContext context) {
  std::string strategy = text(context.getParams().getStrategy());
  auto replicas = replicas_;
  return async::run_on_pool(ctx_.pool, [replicas, strategy]() { return replicas->status(strategy); })
      .then([context](training::ReplicaReport report) mutable {
        auto results = context.getResults();
        results.setHolds(report.holds);
        results.setStep(report.step);
        results.setChecksum(report.checksum);
        results.setInputPosition(report.input_position);
      });
}

kj::Promise<void> WorkerService::prepareReplica(PrepareReplicaContext context) {
  auto params = context.getParams();
  std::string strategy = text(params.getStrategy());
  int64_t epoch = params.getEpoch();
  auto replicas = replicas_;
  return async::run_on_pool(ctx_.pool, [replicas, strategy, epoch]() { return replicas->prepare(strategy, epoch); })
      .then([context](Result<std::string> address) mutable {
        async::check(address.status());
        context.getResults().setAddress(*address);
      });
}

kj::Promise<void> WorkerService::formReplica(FormReplicaContext context) {
  auto params = context.getParams();
  training::ReplicaForm form;
  form.strategy = text(params.getStrategy());
  form.epoch = params.getEpoch();
  form.rank = params.getRank();
  form.source = params.getSource();
  if (params.getAddresses().size() > 4096) {
    async::check(Status::InvalidArgument("formReplica: " + std::to_string(params.getAddresses().size()) +
                                       " members; at most 4096"));
  }
  for (auto a : params.getAddresses()) form.addresses.push_back(text(a));
  for (auto spec : params.getVariables()) {
    auto parsed = rpc::spec_from_wire(spec);
    async::check(parsed.status().with_context("formReplica"));
    form.specs.push_back(std::move(*parsed));
  }
  auto settings = rpc::settings_from_wire(params.getSettings());
  async::check(settings.status().with_context("formReplica"));
  form.settings = *settings;
  form.seed_checkpoint = text(params.getSeedCheckpoint());
  if (params.getInputPosition() < 0) {
    async::check(Status::InvalidArgument("formReplica: input position " + std::to_string(params.getInputPosition()) +
                                         " is negative"));
  }
  form.input_position = params.getInputPosition();
  for (auto name : params.getSeedFromCheckpoint()) form.seed_from_checkpoint.push_back(text(name));
  kj::Promise<void> seeded = kj::READY_NOW;
  auto shared = std::make_shared<training::ReplicaForm>(std::move(form));
  if (params.getHasSeed()) {
    seeded = rpc::state_from_wire(params.getSeed()).then([shared](training::MirroredState&& seed) {
      shared->seed = std::move(seed);
    });
  }
  auto replicas = replicas_;
  return seeded
      .then([this, replicas, shared]() {
        return async::run_on_pool(ctx_.pool, [replicas, shared]() { return replicas->form(*shared); });
      })
      .then([this, context, shared](Result<training::ReplicaReport> report) mutable {
        async::check(report.status());
        ctx_.log->info("strategy '{}': replica {} of {} in epoch {} (from rank {}; step {}); transports: {}",
                       shared->strategy, shared->rank, shared->addresses.size(), shared->epoch, shared->source,
                       report->step, [&]() {
                         std::string out;
                         for (size_t r = 0; r < report->transports.size(); ++r) {
                           out += (out.empty() ? "" : ", ") + shared->addresses[r] + " " + report->transports[r];
                         }
                         return out;
                       }());
        auto results = context.getResults();
        results.setStep(report->step);
        results.setChecksum(report->checksum);
        auto transports = results.initTransports(static_cast<unsigned>(report->transports.size()));
        for (unsigned i = 0; i < report->transports.size(); ++i) transports.set(i, report->transports[i]);
      });
}

kj::Promise<void> WorkerService::readReplica(ReadReplicaContext context) {
  std::string strategy = text(context.getParams().getStrategy());
  auto replicas = replicas_;
  return async::run_on_pool(ctx_.pool, [replicas, strategy]() { return replicas->read(strategy); })
      .then([this, context](Result<training::MirroredState> state) mutable {
        async::check(state.status());
        rpc::state_to_wire(*state, context.getResults().initState(), ctx_.codec);
      });
}

kj::Promise<void> WorkerService::saveReplica(SaveReplicaContext context) {
  auto params = context.getParams();
  std::string strategy = text(params.getStrategy());
  std::string directory = text(params.getDirectory());
  auto replicas = replicas_;
  return async::run_on_pool(ctx_.pool,
                            [replicas, strategy, directory]() { return replicas->save(strategy, directory); })
      .then([this, context, strategy](Result<training::SavedReplica> saved) mutable {
        async::check(saved.status());
        ctx_.log->info("strategy '{}': wrote {} ({} bytes, step {})", strategy, saved->file, saved->size, saved->step);
        auto results = context.getResults();
        results.setFile(saved->file);
        results.setSize(saved->size);
        results.setCrc32c(saved->crc32c);
        results.setStep(saved->step);
        auto out = results.initVariables(static_cast<unsigned>(saved->variables.size()));
        for (unsigned i = 0; i < out.size(); ++i) {
          const ps::SavedShard& v = saved->variables[i];
          out[i].setName(v.name);
          out[i].setDtype(rpc::to_wire(v.dtype));
          auto shape = out[i].initShape(static_cast<unsigned>(v.shape.size()));
          for (unsigned d = 0; d < shape.size(); ++d) shape.set(d, v.shape[d]);
          auto slots = out[i].initSlots(static_cast<unsigned>(v.slots.size()));
          for (unsigned k = 0; k < slots.size(); ++k) slots.set(k, v.slots[k]);
          out[i].setStep(v.step);
        }
      });
}

kj::Promise<void> WorkerService::abortReplica(AbortReplicaContext context) {
  auto params = context.getParams();
  // Sets a flag and wakes the group's thread: no waiting here.
  replicas_->abort(text(params.getStrategy()), params.getEpoch(), Status::Unavailable(text(params.getReason())));
  return kj::READY_NOW;
}

kj::Promise<void> WorkerService::cancelClosure(CancelClosureContext context) {
  worker_->cancel_closure(context.getParams().getClosureId());  // sets a flag: no waiting
  return kj::READY_NOW;
}

}  // namespace capstan::worker_server
