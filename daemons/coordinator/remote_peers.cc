#include "daemons/coordinator/remote_peers.h"

#include <memory>

#include "daemons/coordinator/payload.h"
#include "async/status_exception.h"
#include "rpc/errors.h"
#include "rpc/optimizer_codec.h"
#include "rpc/phase_codec.h"
#include "rpc/replica_codec.h"

namespace capstan::coordinator {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

kj::TimePoint far_future(kj::Timer& timer) { return timer.now() + 3650 * 24 * 3600 * kj::SECONDS; }

kj::Promise<Status> status_of(kj::Promise<void> call) {
  return call.then([]() { return Status::Ok(); }, [](kj::Exception&& e) { return async::from_exception(e); });
}

// The worker's error as a Result; a broken link stays a rejected promise
// (the coordinator counts the worker as lost).
template <typename T>
kj::Promise<Result<T>> result_of(kj::Promise<T> call) {
  return call.then([](T value) -> kj::Promise<Result<T>> { return Result<T>(std::move(value)); },
                   [](kj::Exception&& e) -> kj::Promise<Result<T>> {
                     if (async::is_transport_failure(e)) return kj::mv(e);
                     return Result<T>(async::from_exception(e));
                   });
}

}  // namespace

// ---- RemoteWorker ------------------------------------------------------------------

namespace {

// Drops a worker's answer once the loop has nothing else to do. Dropping it
// sends the worker the call's Finish message; done at once, that write would
// go before the answer to a client's fetch that the closure's outcome
// releases, which is the message a program waits on.
template <typename Response>
void release_later(Response response) {
  kj::evalLast([response = kj::mv(response)]() mutable {}).detach([](kj::Exception&&) {});
}

// Fills the fields runClosure's params and a runClosures ClosureRunSpec
// share (all but the strategy's). The arguments go as the program encoded
// them; only those past the inline limit go as an element, whose tensors
// the worker pulls in chunks (InvalidArgument when they are not one).
template <typename Builder>
Status write_run(Builder out, const ClosureRun& run, const rpc::CodecOptions& codec) {
  out.setClosureId(run.closure_id);
  out.setFunction(run.function);
  out.setPlacementVersion(run.placement_version);
  out.setAttempt(run.attempt);
  out.setNumWorkers(run.num_workers);
  out.setWorkerIndex(run.worker_index);
  out.setDeadlineUnixMs(run.deadline_unix_ms);
  if (run.args.size() <= codec.inline_limit) {
    out.setEncodedArgs(payload_bytes(run.args));
    return Status::Ok();
  }
  return write_payload_element(out.initArgs(), run.args, codec);
}

// A value the worker answered: its bytes as they are, or (a value past its
// inline limit, or a worker older than encodedValue) its element encoded.
kj::Promise<ClosureOutcome> outcome_of(bool encoded, capnp::Data::Reader bytes, wire::Element::Reader element) {
  if (encoded) return ClosureOutcome{payload_of(bytes), false};
  return payload_from_element(element).then(
      [](std::string value) { return ClosureOutcome{std::move(value), false}; },
      [](kj::Exception&& e) { return ClosureOutcome{async::from_exception(e), async::is_transport_failure(e)}; });
}

}  // namespace

RemoteWorker::RemoteWorker(wire::Worker::Client client, rpc::CodecOptions codec, std::string address)
    : address_(std::move(address)), client_(kj::mv(client)), codec_(std::move(codec)) {}

RemoteWorker::~RemoteWorker() noexcept = default;


kj::Promise<ClosureOutcome> RemoteWorker::run_closure(ClosureRun run) {
  auto request = client_.runClosureRequest();
  Status written = write_run<wire::Worker::RunClosureParams::Builder>(request, run, codec_);
  if (!written.ok()) return ClosureOutcome{written, false};
  request.setStrategy(run.strategy);
  request.setEpoch(run.epoch);
  if (run.step_input.has_value()) {
    const training::StepInput& in = *run.step_input;
    auto wire_input = request.initStepInput();
    wire_input.setDatasetId(in.dataset_id);
    wire_input.setStart(in.start);
    wire_input.setCount(in.count);
    wire_input.setFirst(in.first);
    wire_input.setEnd(in.end);
    wire_input.setSeed(in.seed);
    wire_input.setShuffle(in.shuffle);
    wire_input.setWeight(in.weight);
    request.setHasStepInput(true);
  }
  return request.send().then(
      [](capnp::Response<wire::Worker::RunClosureResults>&& response) {
        auto value = outcome_of(response.hasEncodedResult(), response.getEncodedResult(), response.getResult());
        const bool input_taken = response.getInputTaken();
        const PhaseTimes phases = rpc::phases_from_wire(response.getPhases());
        return value.then([response = kj::mv(response), input_taken, phases](ClosureOutcome outcome) mutable {
          outcome.input_taken = input_taken;
          outcome.phases = phases;
          release_later(kj::mv(response));
          return outcome;
        });
      },
      [](kj::Exception&& e) {
        // A broken link means the worker is gone; an error it reported
        // is the closure's.
        return kj::Promise<ClosureOutcome>(ClosureOutcome{async::from_exception(e), async::is_transport_failure(e)});
      });
}

kj::Promise<std::vector<ClosureOutcome>> RemoteWorker::run_closures(std::vector<ClosureRun> runs) {
  if (!batches_) return WorkerPeer::run_closures(std::move(runs));
  auto request = client_.runClosuresRequest();
  auto out = request.initRuns(static_cast<unsigned>(runs.size()));
  rpc::ReferenceBudget references;
  const rpc::CodecOptions codec = rpc::with_references(codec_, &references);
  for (unsigned i = 0; i < runs.size(); ++i) {
    Status written = write_run(out[i], runs[i], codec);
    if (!written.ok()) {
      // Arguments past the inline limit that are not an element (a program
      // that sent bad bytes): that closure fails, the others run again.
      std::vector<ClosureOutcome> failed(runs.size(), ClosureOutcome{Status::Aborted("not run"), false});
      failed[i].result = written;
      return failed;
    }
  }
  size_t n = runs.size();
  auto kept = std::make_shared<std::vector<ClosureRun>>(std::move(runs));
  return request.send()
      .then([n](capnp::Response<wire::Worker::RunClosuresResults>&& response) {
        auto outcomes = response.getOutcomes();
        if (outcomes.size() != n) {
          return kj::Promise<std::vector<ClosureOutcome>>(std::vector<ClosureOutcome>(
              n, ClosureOutcome{Status::Internal("the worker answered " + std::to_string(outcomes.size()) +
                                                 " outcomes for " + std::to_string(n) + " runs"),
                                true}));
        }
        auto values = kj::heapArrayBuilder<kj::Promise<ClosureOutcome>>(n);
        std::vector<PhaseTimes> phases;
        phases.reserve(n);
        for (auto outcome : outcomes) {
          phases.push_back(rpc::phases_from_wire(outcome.getPhases()));
          if (outcome.isError()) {
            values.add(ClosureOutcome{rpc::status_from_wire(outcome.getError()), false});
            continue;
          }
          bool encoded = outcome.isEncodedValue();
          values.add(outcome_of(encoded, encoded ? outcome.getEncodedValue() : capnp::Data::Reader(),
                                encoded ? wire::Element::Reader() : outcome.getValue()));
        }
        return kj::joinPromises(values.finish())
            .then([response = kj::mv(response), phases = std::move(phases)](kj::Array<ClosureOutcome> all) mutable {
              for (size_t i = 0; i < all.size(); ++i) all[i].phases = phases[i];
              release_later(kj::mv(response));
              return std::vector<ClosureOutcome>(std::make_move_iterator(all.begin()),
                                                 std::make_move_iterator(all.end()));
            });
      })
      .catch_([this, n, kept](kj::Exception&& e) -> kj::Promise<std::vector<ClosureOutcome>> {
        Status status = async::from_exception(e);
        if (e.getType() == kj::Exception::Type::UNIMPLEMENTED) {
          // (The coordinator keeps this peer alive while the call runs.)
          batches_ = false;
          return WorkerPeer::run_closures(std::move(*kept));
        }
        // A broken link: the worker is gone. Any other error of the call
        // itself is every run's.
        bool lost = async::is_transport_failure(e);
        return std::vector<ClosureOutcome>(n, ClosureOutcome{status, lost});
      });
}

kj::Promise<Status> RemoteWorker::cancel_closure(int64_t closure_id) {
  auto request = client_.cancelClosureRequest();
  request.setClosureId(closure_id);
  return status_of(request.send().ignoreResult());
}

kj::Promise<Status> RemoteWorker::ping() { return status_of(client_.infoRequest().send().ignoreResult()); }

kj::Promise<Status> RemoteWorker::create_dataset(int64_t dataset_id, std::string definition, uint64_t uid) {
  auto request = client_.createDatasetRequest();
  request.setDatasetId(dataset_id);
  request.setUid(uid);
  request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
  return status_of(request.send().ignoreResult());
}

kj::Promise<Status> RemoteWorker::create_dataset_from_function(int64_t dataset_id, std::string function,
                                                               int num_workers, int worker_index, uint64_t uid) {
  auto request = client_.createDatasetFromFunctionRequest();
  request.setDatasetId(dataset_id);
  request.setUid(uid);
  request.setFunction(function);
  request.setNumWorkers(num_workers);
  request.setWorkerIndex(worker_index);
  return status_of(request.send().ignoreResult());
}

kj::Promise<Result<training::ReplicaReport>> RemoteWorker::replica_status(std::string strategy) {
  auto request = client_.replicaStatusRequest();
  request.setStrategy(strategy);
  return result_of(request.send().then([](capnp::Response<wire::Worker::ReplicaStatusResults>&& r) {
    training::ReplicaReport report;
    report.holds = r.getHolds();
    report.step = r.getStep();
    report.checksum = r.getChecksum();
    report.input_position = r.getInputPosition();
    return report;
  }));
}

kj::Promise<Result<std::string>> RemoteWorker::prepare_replica(std::string strategy, int64_t epoch) {
  auto request = client_.prepareReplicaRequest();
  request.setStrategy(strategy);
  request.setEpoch(epoch);
  return result_of(request.send().then(
      [](capnp::Response<wire::Worker::PrepareReplicaResults>&& r) { return text(r.getAddress()); }));
}

kj::Promise<Result<training::ReplicaReport>> RemoteWorker::form_replica(training::ReplicaForm form) {
  auto request = client_.formReplicaRequest();
  request.setStrategy(form.strategy);
  request.setEpoch(form.epoch);
  request.setRank(form.rank);
  request.setSource(form.source);
  auto addresses = request.initAddresses(static_cast<unsigned>(form.addresses.size()));
  for (unsigned i = 0; i < form.addresses.size(); ++i) addresses.set(i, form.addresses[i]);
  auto variables = request.initVariables(static_cast<unsigned>(form.specs.size()));
  for (unsigned i = 0; i < form.specs.size(); ++i) rpc::spec_to_wire(form.specs[i], variables[i]);
  request.setHasSeed(form.seed.has_value());
  if (form.seed.has_value()) rpc::state_to_wire(*form.seed, request.initSeed(), codec_);
  rpc::settings_to_wire(form.settings, request.initSettings());
  request.setSeedCheckpoint(form.seed_checkpoint);
  auto from_checkpoint = request.initSeedFromCheckpoint(static_cast<unsigned>(form.seed_from_checkpoint.size()));
  for (unsigned i = 0; i < from_checkpoint.size(); ++i) from_checkpoint.set(i, form.seed_from_checkpoint[i]);
  request.setInputPosition(form.input_position);
  // The request may reference the seed's buffers until it is sent.
  const int64_t form_position = form.input_position;  // formed, the member holds it
  return result_of(request.send()
                       .then([form_position](capnp::Response<wire::Worker::FormReplicaResults>&& r) {
                         training::ReplicaReport report;
                         report.holds = true;
                         report.step = r.getStep();
                         report.checksum = r.getChecksum();
                         report.input_position = form_position;
                         for (auto t : r.getTransports()) report.transports.push_back(text(t));
                         return report;
                       })
                       .attach(kj::mv(form)));
}

kj::Promise<Result<training::MirroredState>> RemoteWorker::read_replica(std::string strategy) {
  auto request = client_.readReplicaRequest();
  request.setStrategy(strategy);
  return result_of(request.send().then([](capnp::Response<wire::Worker::ReadReplicaResults>&& r) {
    return rpc::state_from_wire(r.getState()).attach(kj::mv(r));
  }));
}

kj::Promise<Result<training::SavedReplica>> RemoteWorker::save_replica(std::string strategy,
                                                                       std::string directory) {
  auto request = client_.saveReplicaRequest();
  request.setStrategy(strategy);
  request.setDirectory(directory);
  return result_of(request.send().then([](capnp::Response<wire::Worker::SaveReplicaResults>&& r) {
    training::SavedReplica saved;
    saved.file = text(r.getFile());
    saved.size = r.getSize();
    saved.crc32c = r.getCrc32c();
    saved.step = r.getStep();
    for (auto v : r.getVariables()) {
      ps::SavedShard s;
      s.name = text(v.getName());
      s.dtype = rpc::from_wire(v.getDtype());
      for (int64_t d : v.getShape()) s.shape.push_back(d);
      for (auto slot : v.getSlots()) s.slots.push_back(text(slot));
      s.step = v.getStep();
      saved.variables.push_back(std::move(s));
    }
    return saved;
  }));
}

kj::Promise<Result<std::string>> RemoteWorker::save_iterator(int64_t dataset_id) {
  auto request = client_.saveIteratorRequest();
  request.setDatasetId(dataset_id);
  return result_of(request.send().then([](capnp::Response<wire::Worker::SaveIteratorResults>&& r) {
    auto state = r.getState();
    return std::string(reinterpret_cast<const char*>(state.begin()), state.size());
  }));
}

kj::Promise<Status> RemoteWorker::restore_iterator(int64_t dataset_id, std::string state) {
  auto request = client_.restoreIteratorRequest();
  request.setDatasetId(dataset_id);
  request.setState(kj::arrayPtr(reinterpret_cast<const kj::byte*>(state.data()), state.size()));
  return status_of(request.send().ignoreResult());
}

kj::Promise<Status> RemoteWorker::abort_replica(std::string strategy, int64_t epoch, std::string reason) {
  auto request = client_.abortReplicaRequest();
  request.setStrategy(strategy);
  request.setEpoch(epoch);
  request.setReason(reason);
  return status_of(request.send().ignoreResult());
}

// ---- RemoteParameterServers ---------------------------------------------------------

RemoteParameterServers::RemoteParameterServers(kj::AsyncIoProvider& io, kj::Timer& timer,
                                               const std::vector<std::string>& addresses,
                                               const rpc::ConnectOptions& options, rpc::CodecOptions codec)
    : timer_(timer), codec_(std::move(codec)) {
  for (const auto& address : addresses) connections_.push_back(kj::heap<rpc::Connection>(io, timer, address, options));
}

RemoteParameterServers::~RemoteParameterServers() = default;

std::string RemoteParameterServers::address(int task) const {
  return connections_[static_cast<size_t>(task)]->address();
}

kj::Promise<void> RemoteParameterServers::reachable(int task) {
  return connections_[static_cast<size_t>(task)]->node(far_future(timer_)).ignoreResult();
}

kj::Promise<void> RemoteParameterServers::unreachable(int task) {
  return connections_[static_cast<size_t>(task)]->on_disconnect();
}

kj::Promise<wire::ParameterServer::Client> RemoteParameterServers::service(int task, kj::Duration timeout) {
  return connections_[static_cast<size_t>(task)]->service<wire::ParameterServer>(timer_.now() + timeout);
}

kj::Promise<Status> RemoteParameterServers::create_shard(int task, std::string name, Tensor initial,
                                                         const Optimizer& optimizer) {
  return status_of(
      service(task, 10 * kj::SECONDS).then([this, name, initial, optimizer](wire::ParameterServer::Client client) {
        auto request = client.createShardRequest();
        request.setName(name);
        rpc::write_tensor(request.initInitial(), initial, codec_);
        rpc::optimizer_to_wire(optimizer, request.initOptimizer());
        return request.send().ignoreResult();
      }));
}

kj::Promise<Status> RemoteParameterServers::create_initialized_shard(int task, std::string name,
                                                                     InitializedShard shard,
                                                                     const Optimizer& optimizer) {
  return status_of(service(task, 10 * kj::SECONDS)
                       .then([name, shard = std::move(shard), optimizer](wire::ParameterServer::Client client) {
                         auto request = client.createShardRequest();
                         request.setName(name);
                         rpc::optimizer_to_wire(optimizer, request.initOptimizer());
                         rpc::initializer_to_wire(shard.initializer, request.initInitializer());
                         request.setDtype(rpc::to_wire(shard.dtype));
                         auto shape = request.initLogicalShape(static_cast<unsigned>(shard.logical_shape.size()));
                         for (unsigned d = 0; d < shard.logical_shape.size(); ++d) {
                           shape.set(d, shard.logical_shape[d]);
                         }
                         request.setFirstRow(shard.first_row);
                         request.setRows(shard.rows);
                         return request.send().ignoreResult();
                       }));
}

kj::Promise<Result<std::set<std::string>>> RemoteParameterServers::list_shards(int task) {
  auto names = std::make_shared<std::set<std::string>>();
  auto listed = service(task, 10 * kj::SECONDS).then([names](wire::ParameterServer::Client client) {
    return client.listShardsRequest().send().then([names](capnp::Response<wire::ParameterServer::ListShardsResults>&& r) {
      for (auto info : r.getShards()) names->insert(text(info.getName()));
    });
  });
  return status_of(kj::mv(listed)).then([names](Status status) -> Result<std::set<std::string>> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*names);
  });
}

kj::Promise<Status> RemoteParameterServers::create_table(int task, std::string name, EmbeddingTableSpec spec) {
  return status_of(service(task, 10 * kj::SECONDS).then([name, spec](wire::ParameterServer::Client client) {
    auto request = client.createTableRequest();
    request.setName(name);
    rpc::table_to_wire(spec, request.initConfig());
    return request.send().ignoreResult();
  }));
}

kj::Promise<Result<TableContents>> RemoteParameterServers::export_table(int task, std::string name, int64_t since,
                                                                        int64_t begin) {
  auto contents = std::make_shared<TableContents>();
  auto exported = service(task, 120 * kj::SECONDS).then([contents, name, since, begin](wire::ParameterServer::Client client) {
    auto request = client.exportTableRequest();
    request.setName(name);
    request.setSinceVersion(since);
    request.setBeginVersion(begin);
    return request.send().then([contents](capnp::Response<wire::ParameterServer::ExportTableResults>&& r) {
      contents->step = r.getStep();
      contents->version = r.getVersion();
      return rpc::read_table_rows(r.getRows()).attach(kj::mv(r)).then([contents](ps::TableRows&& rows) {
        contents->rows = std::move(rows);
      });
    });
  });
  return status_of(kj::mv(exported)).then([contents](Status status) -> Result<TableContents> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*contents);
  });
}

kj::Promise<Result<ParameterServers::SaveStarted>> RemoteParameterServers::begin_save(
    int task, std::string directory, std::string file, std::vector<ps::SaveItem> items) {
  auto started = std::make_shared<SaveStarted>();
  auto call = service(task, 60 * kj::SECONDS)
                  .then([started, directory = std::move(directory), file = std::move(file),
                         items = std::move(items)](wire::ParameterServer::Client client) {
                    auto request = client.beginSaveRequest();
                    request.setDirectory(directory);
                    request.setFile(file);
                    auto list = request.initShards(static_cast<unsigned>(items.size()));
                    for (unsigned i = 0; i < list.size(); ++i) {
                      list[i].setName(items[i].name);
                      list[i].setTable(items[i].table);
                      list[i].setBeginVersion(items[i].begin_version);
                    }
                    return request.send().then([started](capnp::Response<wire::ParameterServer::BeginSaveResults>&& r) {
                      started->save_id = r.getSaveId();
                      for (auto shard : r.getShards()) {
                        ps::SavedShard s;
                        s.name = text(shard.getName());
                        s.dtype = rpc::from_wire(shard.getDtype());
                        for (int64_t d : shard.getShape()) s.shape.push_back(d);
                        for (auto slot : shard.getSlots()) s.slots.push_back(text(slot));
                        s.step = shard.getStep();
                        s.version = shard.getVersion();
                        started->shards.push_back(std::move(s));
                      }
                    });
                  });
  return status_of(kj::mv(call)).then([started](Status status) -> Result<SaveStarted> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*started);
  });
}

kj::Promise<Result<checkpoint::ManifestFile>> RemoteParameterServers::finish_save(int task, uint64_t save_id) {
  auto file = std::make_shared<checkpoint::ManifestFile>();
  auto call = service(task, 60 * kj::SECONDS).then([file, save_id](wire::ParameterServer::Client client) {
    auto request = client.finishSaveRequest();
    request.setSaveId(save_id);
    return request.send().then([file](capnp::Response<wire::ParameterServer::FinishSaveResults>&& r) {
      file->size = r.getSize();
      file->crc32c = r.getCrc32c();
    });
  });
  return status_of(kj::mv(call)).then([file](Status status) -> Result<checkpoint::ManifestFile> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*file);
  });
}

kj::Promise<Status> RemoteParameterServers::restore_shards(int task, std::string path,
                                                           std::vector<ps::RestoreItem> items) {
  return status_of(service(task, 60 * kj::SECONDS)
                       .then([path = std::move(path), items = std::move(items)](wire::ParameterServer::Client client) {
                         auto request = client.restoreShardsRequest();
                         request.setCheckpoint(path);
                         auto list = request.initShards(static_cast<unsigned>(items.size()));
                         for (unsigned i = 0; i < list.size(); ++i) {
                           const ps::RestoreItem& item = items[i];
                           auto out = list[i];
                           out.setName(item.name);
                           out.setVariable(item.variable);
                           out.setFirstRow(item.first_row);
                           out.setRows(item.rows);
                           out.setDtype(rpc::to_wire(item.dtype));
                           auto shape = out.initShape(static_cast<unsigned>(item.shape.size()));
                           for (unsigned d = 0; d < shape.size(); ++d) shape.set(d, item.shape[d]);
                           rpc::optimizer_to_wire(item.optimizer, out.initOptimizer());
                           if (item.table) {
                             out.setIsTable(true);
                             rpc::table_to_wire(*item.table, out.initTable());
                             out.setTablePart(item.table_part);
                             out.setTableParts(item.table_parts);
                           }
                         }
                         return request.send().ignoreResult();
                       }));
}

kj::Promise<Result<ParameterServers::PeerSent>> RemoteParameterServers::send_peer_snapshot(int task,
                                                                                           std::string holder,
                                                                                           bool full) {
  auto sent = std::make_shared<PeerSent>();
  auto call = service(task, 10 * kj::SECONDS).then([sent, task, holder = std::move(holder), full](
                                                       wire::ParameterServer::Client client) {
    auto request = client.sendPeerSnapshotRequest();
    request.setHolder(holder);
    request.setSourceTask(task);
    request.setFull(full);
    return request.send().then([sent](capnp::Response<wire::ParameterServer::SendPeerSnapshotResults>&& r) {
      sent->sequence = r.getSequence();
      sent->full = r.getFull();
      sent->shards = r.getShards();
      sent->bytes = r.getBytes();
    });
  });
  return status_of(kj::mv(call)).then([sent](Status status) -> Result<PeerSent> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return *sent;
  });
}

kj::Promise<Result<ParameterServers::PeerRestored>> RemoteParameterServers::restore_from_peer(
    int task, std::string holder, int source_task, std::vector<std::string> shards) {
  auto restored = std::make_shared<PeerRestored>();
  auto call = service(task, 60 * kj::SECONDS)
                  .then([restored, holder = std::move(holder), source_task,
                         shards = std::move(shards)](wire::ParameterServer::Client client) {
                    auto request = client.restoreFromPeerRequest();
                    request.setHolder(holder);
                    request.setSourceTask(source_task);
                    auto list = request.initShards(static_cast<unsigned>(shards.size()));
                    for (unsigned i = 0; i < list.size(); ++i) list.set(i, shards[i]);
                    return request.send().then(
                        [restored](capnp::Response<wire::ParameterServer::RestoreFromPeerResults>&& r) {
                          restored->sequence = r.getSequence();
                          restored->taken_ms = r.getTakenMs();
                          restored->shards = r.getShards();
                        });
                  });
  return status_of(kj::mv(call)).then([restored](Status status) -> Result<PeerRestored> {
    CAPSTAN_RETURN_IF_ERROR(status);
    return *restored;
  });
}

}  // namespace capstan::coordinator
