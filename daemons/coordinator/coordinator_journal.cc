#include "daemons/coordinator/coordinator_journal.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <utility>

#include "async/status_exception.h"
#include "capstan_schemas/coordinator_journal.capnp.h"
#include "rpc/optimizer_codec.h"
#include "rpc/replica_codec.h"
#include "rpc/tensor_codec.h"

namespace capstan::coordinator {
namespace {

using Update = wire::journal::CoordinatorUpdate;

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// A journaled status into *out (OK for code 0); DataLoss for a code no
// status has.
Status status_of(int32_t code, capnp::Text::Reader message, Status* out) {
  if (code < 0 || code > 16) return Status::DataLoss("a journaled error has code " + std::to_string(code));
  *out = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), text(message));
  return Status::Ok();
}

std::string serialize(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

kj::ArrayPtr<const kj::byte> bytes_of(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

std::string string_of(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

Result<JournalRecord> decode_variable(Update::Variable::Reader in, int num_ps) {
  VariableCreated out;
  PlacedVariable& v = out.variable;
  v.name = text(in.getName());
  v.dtype = rpc::from_wire(in.getDtype());
  for (int64_t d : in.getShape()) v.shape.push_back(d);
  CAPSTAN_ASSIGN_OR_RETURN(v.optimizer, rpc::optimizer_from_wire(in.getOptimizer()));
  for (auto s : in.getShards()) {
    if (s.getPsTask() < 0 || s.getPsTask() >= num_ps) {
      return Status::FailedPrecondition("variable '" + v.name + "' has a shard on ps:" + std::to_string(s.getPsTask()) +
                                        " but this " + "coordinator has " + std::to_string(num_ps) +
                                        " parameter server(s): start it with the same ps list");
    }
    v.shards.push_back({text(s.getName()), s.getPsTask(), s.getFirstRow(), s.getRows()});
  }
  if (in.getIsTable()) {
    CAPSTAN_ASSIGN_OR_RETURN(EmbeddingTableSpec spec, rpc::table_from_wire(in.getTable()));
    spec.name = v.name;
    v.table = std::move(spec);
  }
  if (in.hasInitializer()) {
    auto initializer = rpc::initializer_from_wire(in.getInitializer());
    if (!initializer.ok()) return Status::DataLoss("variable '" + v.name + "': " + initializer.status().message());
    v.initializer = *initializer;
  }
  v.awaiting_value = in.getAwaitingValue();
  out.placer_counter = in.getPlacerCounter();
  return JournalRecord(std::move(out));
}

Result<JournalRecord> decode_closure_state(Update::ClosureState::Reader in) {
  uint8_t state = in.getState();
  if (state > 4 || state == 1) return Status::DataLoss("a journaled closure has state " + std::to_string(state));
  Status error;
  CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &error));
  ClosureSnapshot out;
  ClosureQueue::Snapshot::Entry& entry = out.entry;
  entry.closure.id = in.getClosure().getId();
  entry.closure.function = text(in.getClosure().getFunction());
  entry.closure.args = string_of(in.getClosure().getArgs());
  entry.state = static_cast<ClosureQueue::State>(state);
  entry.value = string_of(in.getValue());
  entry.error = std::move(error);
  entry.owner = {in.getClosure().getClientId(), in.getClosure().getRequestSeq()};
  entry.released = in.getReleased();
  return JournalRecord(std::move(out));
}

Result<JournalRecord> decode_strategy(Update::Strategy::Reader in) {
  StrategyJournaled out;
  Strategies::Journaled& s = out.strategy;
  s.name = text(in.getName());
  auto damaged = [&s](const Status& why) {
    return Status::DataLoss("journaled strategy '" + s.name + "': " + why.message());
  };
  for (auto spec : in.getSpecs()) {
    auto read = rpc::spec_from_wire(spec);
    if (!read.ok()) return damaged(read.status());
    s.specs.push_back(std::move(*read));
  }
  s.config.min_replicas = in.getMinReplicas();
  auto settings = rpc::settings_from_wire(in.getSettings());
  if (!settings.ok()) return damaged(settings.status());
  s.config.settings = *settings;
  if (in.hasInitialValues()) {
    auto element = rpc::element_from_bytes(string_of(in.getInitialValues()));
    if (!element.ok()) return damaged(element.status());
    if (element->components.size() != s.specs.size()) {
      return damaged(Status::DataLoss(std::to_string(element->components.size()) + " initial value(s) for " +
                                      std::to_string(s.specs.size()) + " variable(s)"));
    }
    training::MirroredState initial;
    for (size_t i = 0; i < s.specs.size(); ++i) {
      Tensor& value = element->components[i];
      if (value.dtype() != s.specs[i].dtype || value.shape() != s.specs[i].shape) {
        return damaged(Status::DataLoss("the initial value of '" + s.specs[i].name + "' is not its spec's dtype and shape"));
      }
      initial.variables.push_back({s.specs[i].name, std::move(value), {}});
    }
    s.initial = std::move(initial);
  }
  s.seed_checkpoint = text(in.getSeedCheckpoint());
  for (auto name : in.getSeedFromCheckpoint()) s.seed_from_checkpoint.push_back(text(name));
  s.epoch = in.getEpoch();
  for (int32_t task : in.getMemberTasks()) s.member_tasks.push_back(task);
  s.steps = in.getSteps();
  if (in.getHasInput()) {
    StepInputConfig input;
    input.dataset_id = in.getInputDatasetId();
    input.global_batch = in.getGlobalBatch();
    input.per_replica_batch = in.getPerReplicaBatch();
    input.seed = in.getInputSeed();
    input.shuffle = in.getInputShuffle();
    Status valid = Strategies::check_input(s.name, input);
    if (!valid.ok()) return damaged(Status::DataLoss(valid.message()));
    s.input = input;
  }
  if (s.name.empty() || s.specs.empty() || s.epoch < 0 || s.steps < 0) {
    return damaged(Status::DataLoss("a strategy record without a name or variables, or with a negative epoch or step"));
  }
  return JournalRecord(std::move(out));
}

// One record of the kind `update` holds.
Result<JournalRecord> decode_update(Update::Reader update, int num_ps) {
  switch (update.which()) {
    case Update::CREATE_VARIABLE:
      return decode_variable(update.getCreateVariable(), num_ps);
    case Update::ADD_DATASET: {
      auto in = update.getAddDataset();
      DatasetAdded out;
      out.id = in.getId();
      out.dataset.definition = string_of(in.getDefinition());
      out.dataset.function = text(in.getFunction());
      out.dataset.name = text(in.getName());
      out.dataset.uid = in.getUid();
      out.dataset.step_input = in.getStepInput();
      return JournalRecord(std::move(out));
    }
    case Update::LAST_CHECKPOINT:
      return JournalRecord(LastCheckpointSet{text(update.getLastCheckpoint())});
    case Update::SCHEDULE_CLOSURE: {
      auto in = update.getScheduleClosure();
      if (in.getId() <= 0) return Status::DataLoss("a journaled closure has id " + std::to_string(in.getId()));
      return JournalRecord(ClosureScheduled{in.getId(), text(in.getFunction()), string_of(in.getArgs()),
                                            {in.getClientId(), in.getRequestSeq()}});
    }
    case Update::CLOSURE_FINISHED: {
      auto in = update.getClosureFinished();
      ClosureFinished out;
      out.id = in.getId();
      if (in.getErrorCode() == 0) {
        out.result = string_of(in.getValue());
      } else {
        Status error;
        CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &error));
        out.result = std::move(error);
      }
      return JournalRecord(std::move(out));
    }
    case Update::ERROR_TAKEN:
      return JournalRecord(ErrorTaken{});
    case Update::RELEASE_CLOSURE:
      return JournalRecord(ClosureReleased{update.getReleaseClosure()});
    case Update::CLOSURE_STATE:
      return decode_closure_state(update.getClosureState());
    case Update::CLOSURE_QUEUE: {
      auto in = update.getClosureQueue();
      QueueSnapshot out;
      CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &out.pending_error));
      out.next_id = in.getNextId();
      return JournalRecord(std::move(out));
    }
    case Update::STRATEGY:
      return decode_strategy(update.getStrategy());
  }
  return Status::DataLoss("a journal record of a kind this coordinator does not know (a newer version wrote it)");
}

}  // namespace

Result<JournalRecord> decode_record(const std::string& record, int num_ps) {
  if (record.size() % sizeof(capnp::word) != 0) return Status::DataLoss("a journal record is not whole words");
  auto words = kj::heapArray<capnp::word>(record.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), record.data(), record.size());
  try {
    capnp::FlatArrayMessageReader message(words);
    return decode_update(message.getRoot<Update>(), num_ps);
  } catch (const kj::Exception& e) {
    return Status::DataLoss("a journal record does not parse: " + async::from_exception(e).message());
  }
}

std::string variable_record(const PlacedVariable& variable, int64_t placer_counter) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initCreateVariable();
  out.setName(variable.name);
  out.setDtype(rpc::to_wire(variable.dtype));
  auto shape = out.initShape(static_cast<unsigned>(variable.shape.size()));
  for (unsigned d = 0; d < variable.shape.size(); ++d) shape.set(d, variable.shape[d]);
  rpc::optimizer_to_wire(variable.optimizer, out.initOptimizer());
  if (variable.initializer.kind != Initializer::Kind::kNone) {
    rpc::initializer_to_wire(variable.initializer, out.initInitializer());
  }
  out.setAwaitingValue(variable.awaiting_value);
  if (variable.table) {
    out.setIsTable(true);
    rpc::table_to_wire(*variable.table, out.initTable());
  }
  auto shards = out.initShards(static_cast<unsigned>(variable.shards.size()));
  for (unsigned i = 0; i < variable.shards.size(); ++i) {
    shards[i].setName(variable.shards[i].name);
    shards[i].setPsTask(variable.shards[i].ps_task);
    shards[i].setFirstRow(variable.shards[i].first_row);
    shards[i].setRows(variable.shards[i].rows);
  }
  out.setPlacerCounter(placer_counter);
  return serialize(message);
}

std::string dataset_record(int64_t id, const PerWorkerDataset& dataset) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initAddDataset();
  out.setId(id);
  out.setDefinition(bytes_of(dataset.definition));
  out.setFunction(dataset.function);
  out.setName(dataset.name);
  out.setUid(dataset.uid);
  out.setStepInput(dataset.step_input);
  return serialize(message);
}

std::string last_checkpoint_record(const std::string& path) {
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setLastCheckpoint(path);
  return serialize(message);
}

std::string closure_state_record(const ClosureQueue::Snapshot::Entry& entry) {
  capnp::MallocMessageBuilder message;
  auto out_state = message.initRoot<Update>().initClosureState();
  auto closure = out_state.initClosure();
  closure.setId(entry.closure.id);
  closure.setFunction(entry.closure.function);
  closure.setArgs(bytes_of(entry.closure.args));
  closure.setClientId(entry.owner.client);
  closure.setRequestSeq(entry.owner.request_seq);
  out_state.setState(static_cast<uint8_t>(entry.state));
  out_state.setReleased(entry.released);
  out_state.setValue(bytes_of(entry.value));
  out_state.setErrorCode(static_cast<int32_t>(entry.error.code()));
  out_state.setErrorMessage(entry.error.message());
  return serialize(message);
}

std::string queue_state_record(const Status& pending_error, int64_t next_id) {
  capnp::MallocMessageBuilder message;
  auto state = message.initRoot<Update>().initClosureQueue();
  state.setErrorCode(static_cast<int32_t>(pending_error.code()));
  state.setErrorMessage(pending_error.message());
  state.setNextId(next_id);
  return serialize(message);
}

std::string strategy_record(const Strategies::Journaled& strategy) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initStrategy();
  out.setName(strategy.name);
  auto specs = out.initSpecs(static_cast<unsigned>(strategy.specs.size()));
  for (unsigned i = 0; i < strategy.specs.size(); ++i) rpc::spec_to_wire(strategy.specs[i], specs[i]);
  out.setMinReplicas(strategy.config.min_replicas);
  rpc::settings_to_wire(strategy.config.settings, out.initSettings());
  if (strategy.initial.has_value()) {
    Element values;
    for (const auto& v : strategy.initial->variables) values.components.push_back(v.value);
    out.setInitialValues(bytes_of(rpc::element_to_bytes(values)));
  }
  out.setSeedCheckpoint(strategy.seed_checkpoint);
  auto names = out.initSeedFromCheckpoint(static_cast<unsigned>(strategy.seed_from_checkpoint.size()));
  for (unsigned i = 0; i < strategy.seed_from_checkpoint.size(); ++i) {
    names.set(i, strategy.seed_from_checkpoint[i].c_str());
  }
  out.setEpoch(strategy.epoch);
  auto tasks = out.initMemberTasks(static_cast<unsigned>(strategy.member_tasks.size()));
  for (unsigned i = 0; i < strategy.member_tasks.size(); ++i) tasks.set(i, strategy.member_tasks[i]);
  out.setSteps(strategy.steps);
  if (strategy.input.has_value()) {
    out.setHasInput(true);
    out.setInputDatasetId(strategy.input->dataset_id);
    out.setGlobalBatch(strategy.input->global_batch);
    out.setPerReplicaBatch(strategy.input->per_replica_batch);
    out.setInputSeed(strategy.input->seed);
    out.setInputShuffle(strategy.input->shuffle);
  }
  return serialize(message);
}

Status CoordinatorJournal::open(const std::string& work_dir, boost::asio::thread_pool& pool,
                                std::shared_ptr<spdlog::logger> log, DurableLog::Compaction compaction,
                                std::vector<std::string>* replay) {
  CAPSTAN_ASSIGN_OR_RETURN(log_, DurableLog::open(work_dir, pool, std::move(log), std::move(compaction), replay));
  return Status::Ok();
}

Status CoordinatorJournal::broken() const { return log_ ? log_->broken() : Status::Ok(); }

kj::Promise<Status> CoordinatorJournal::synced() {
  if (!log_) return Status::Ok();
  return log_->synced();
}

Status CoordinatorJournal::compact_if_due() { return log_ ? log_->compact_if_due() : Status::Ok(); }

Status CoordinatorJournal::variable(const PlacedVariable& variable, int64_t placer_counter) {
  if (!log_) return Status::Ok();
  return log_->append_now(variable_record(variable, placer_counter))
      .with_context("journaling variable '" + variable.name + "'");
}

Status CoordinatorJournal::dataset(int64_t id, const PerWorkerDataset& dataset) {
  if (!log_) return Status::Ok();
  return log_->append_now(dataset_record(id, dataset))
      .with_context("journaling per-worker dataset " + std::to_string(id));
}

Status CoordinatorJournal::last_checkpoint(const std::string& path) {
  if (!log_) return Status::Ok();
  return log_->append_now(last_checkpoint_record(path));
}

Status CoordinatorJournal::strategy(const Strategies::Journaled& strategy) {
  if (!log_) return Status::Ok();
  return log_->append_now(strategy_record(strategy)).with_context("journaling strategy '" + strategy.name + "'");
}

void CoordinatorJournal::scheduled(int64_t id, const std::string& function, const std::string& args,
                                   ClosureQueue::Owner owner) {
  if (!log_) return;
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initScheduleClosure();
  out.setId(id);
  out.setFunction(function);
  out.setArgs(bytes_of(args));
  out.setClientId(owner.client);
  out.setRequestSeq(owner.request_seq);
  log_->enqueue(serialize(message));
}

void CoordinatorJournal::finished(int64_t id, const Status& error, const ClosureQueue& queue) {
  if (!log_) return;
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initClosureFinished();
  out.setId(id);
  auto state = queue.state(id);
  Result<std::string> value = state.ok() ? queue.value(id) : Result<std::string>(std::string());
  if (!error.ok()) value = error;
  if (value.ok()) {
    out.setValue(bytes_of(*value));
  } else {
    out.setErrorCode(static_cast<int32_t>(value.status().code()));
    out.setErrorMessage(value.status().message());
  }
  log_->enqueue(serialize(message));
}

void CoordinatorJournal::released(int64_t id) {
  if (!log_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setReleaseClosure(id);
  log_->enqueue(serialize(message));
}

void CoordinatorJournal::error_taken() {
  if (!log_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setErrorTaken();
  log_->enqueue(serialize(message));
}

}  // namespace capstan::coordinator
