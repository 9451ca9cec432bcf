// The coordinator's journal (config.work_dir): what a restarted coordinator
// must not forget. Each change is appended (fsynced) before it is applied,
// as the dispatcher does; changes are rare (a variable created, a per-worker
// dataset added, a checkpoint saved), so the cost is off the closure path.
//
// Kept: variables with their shards' placement and optimizer (the values stay
// on the parameter servers), the placer's round robin, per-worker datasets
// with their ids and names, the checkpoint a lost parameter server is
// restored from, and the closure queue: every closure scheduled (with the
// program's request id), how each ended (its value or error), the errors
// raised to the program and the values released. Closures are frequent, so
// their records are group-committed: batches written and fsynced on the
// pool, one fsync per batch, and a schedule is answered once its record is
// durable. A restarted coordinator queues again the closures that had not
// ended (at-least-once, as when a worker dies) and keeps the values not yet
// released. Not kept (yet): strategies.
//
// Compaction: once the journal holds journal_compact_records records and
// more than twice the live ones, the state is written as a fresh journal in
// work_dir/journal-<n+1> (fsynced), work_dir/CURRENT is replaced to name it
// (write, fsync, rename, fsync the directory), and the old one is deleted.
// A crash at any point leaves CURRENT naming a complete journal. Without
// CURRENT (a coordinator from before compaction) the journal is work_dir
// itself.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstring>

#include "capstan_schemas/coordinator_journal.capnp.h"
#include "daemons/coordinator/coordinator.h"
#include "async/status_exception.h"
#include "rpc/optimizer_codec.h"
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

}  // namespace

Status Coordinator::open_journal() {
  if (config_.work_dir.empty()) return Status::Ok();
  DurableLog::Compaction compaction;
  compaction.min_records = config_.journal_compact_records;
  compaction.live_records = [this]() {
    return static_cast<int64_t>(variables_.size() + datasets_.size()) + queue_.size() + 2;
  };
  compaction.snapshot = [this]() { return snapshot_records(); };
  std::vector<std::string> records;
  CAPSTAN_ASSIGN_OR_RETURN(journal_, DurableLog::open(config_.work_dir, pool_, log_, std::move(compaction), &records));
  for (const auto& record : records) {
    CAPSTAN_RETURN_IF_ERROR(apply_journal_record(record).with_context("replaying the journal in " + config_.work_dir));
  }
  (void)queue_.take_cancelled_runs();  // runs of the coordinator that is gone
  CAPSTAN_RETURN_IF_ERROR(journal_->compact_if_due());
  if (!records.empty()) {
    log_->info("replayed the journal in {}: {} variable(s), {} per-worker dataset(s), {} closure(s) queued again, "
               "{} result(s) kept{}",
               config_.work_dir, variables_.size(), datasets_.size(), queue_.queued(), queue_.finished(),
               last_checkpoint_.empty() ? "" : ", last checkpoint " + last_checkpoint_);
  }
  return Status::Ok();
}

void Coordinator::journal_closure_change(std::string record) {
  if (journal_) journal_->enqueue(std::move(record));
}

std::vector<std::string> Coordinator::snapshot_records() const {
  std::vector<std::string> out;
  for (const auto& [name, variable] : variables_.all()) out.push_back(variable_record(variable));
  for (const auto& [id, dataset] : datasets_.all()) out.push_back(dataset_record(id, dataset));
  if (!last_checkpoint_.empty()) {
    capnp::MallocMessageBuilder message;
    message.initRoot<Update>().setLastCheckpoint(last_checkpoint_);
    out.push_back(serialize(message));
  }
  ClosureQueue::Snapshot queue = queue_.snapshot();
  for (const auto& entry : queue.entries) {
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
    out.push_back(serialize(message));
  }
  capnp::MallocMessageBuilder message;
  auto state = message.initRoot<Update>().initClosureQueue();
  state.setErrorCode(static_cast<int32_t>(queue.pending_error.code()));
  state.setErrorMessage(queue.pending_error.message());
  state.setNextId(queue.next_id);
  out.push_back(serialize(message));
  return out;
}

kj::Promise<Status> Coordinator::journal_synced() {
  if (!journal_) return Status::Ok();
  return journal_->synced();
}

void Coordinator::journal_scheduled(int64_t id, const std::string& function, const std::string& args,
                                    uint64_t client_id, int64_t request_seq) {
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initScheduleClosure();
  out.setId(id);
  out.setFunction(function);
  out.setArgs(bytes_of(args));
  out.setClientId(client_id);
  out.setRequestSeq(request_seq);
  journal_closure_change(serialize(message));
}

void Coordinator::journal_finished(int64_t id, const Status& error) {
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initClosureFinished();
  out.setId(id);
  auto state = queue_.state(id);
  Result<std::string> value = state.ok() ? queue_.value(id) : Result<std::string>(std::string());
  if (!error.ok()) value = error;
  if (value.ok()) {
    out.setValue(bytes_of(*value));
  } else {
    out.setErrorCode(static_cast<int32_t>(value.status().code()));
    out.setErrorMessage(value.status().message());
  }
  journal_closure_change(serialize(message));
}

void Coordinator::journal_released(int64_t id) {
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setReleaseClosure(id);
  journal_closure_change(serialize(message));
}

Status Coordinator::take_closure_error() {
  Status error = queue_.take_error();
  if (!error.ok() && journal_) {
    capnp::MallocMessageBuilder message;
    message.initRoot<Update>().setErrorTaken();
    journal_closure_change(serialize(message));
  }
  return error;
}

Status Coordinator::apply_journal_record(const std::string& record) {
  if (record.size() % sizeof(capnp::word) != 0) return Status::DataLoss("a journal record is not whole words");
  auto words = kj::heapArray<capnp::word>(record.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), record.data(), record.size());
  try {
    capnp::FlatArrayMessageReader message(words);
    auto update = message.getRoot<Update>();
    switch (update.which()) {
      case Update::CREATE_VARIABLE: {
        auto in = update.getCreateVariable();
        PlacedVariable v;
        v.name = text(in.getName());
        v.dtype = rpc::from_wire(in.getDtype());
        for (int64_t d : in.getShape()) v.shape.push_back(d);
        CAPSTAN_ASSIGN_OR_RETURN(v.optimizer, rpc::optimizer_from_wire(in.getOptimizer()));
        for (auto s : in.getShards()) {
          if (s.getPsTask() < 0 || s.getPsTask() >= ps_.size()) {
            return Status::FailedPrecondition(
                "variable '" + v.name + "' has a shard on ps:" + std::to_string(s.getPsTask()) + " but this " +
                "coordinator has " + std::to_string(ps_.size()) + " parameter server(s): start it with the same ps list");
          }
          v.shards.push_back({text(s.getName()), s.getPsTask(), s.getFirstRow(), s.getRows()});
        }
        if (in.getIsTable()) {
          CAPSTAN_ASSIGN_OR_RETURN(EmbeddingTableSpec spec, rpc::table_from_wire(in.getTable()));
          spec.name = v.name;
          v.table = std::move(spec);
        }
        variables_.restore(std::move(v), in.getPlacerCounter());
        return Status::Ok();
      }
      case Update::ADD_DATASET: {
        auto in = update.getAddDataset();
        PerWorkerDataset d;
        d.definition = string_of(in.getDefinition());
        d.function = text(in.getFunction());
        d.name = text(in.getName());
        d.uid = in.getUid();
        datasets_.restore(in.getId(), std::move(d));
        return Status::Ok();
      }
      case Update::LAST_CHECKPOINT:
        last_checkpoint_ = text(update.getLastCheckpoint());
        return Status::Ok();
      case Update::SCHEDULE_CLOSURE: {
        auto in = update.getScheduleClosure();
        if (in.getId() <= 0) return Status::DataLoss("a journaled closure has id " + std::to_string(in.getId()));
        queue_.restore_scheduled(in.getId(), text(in.getFunction()), string_of(in.getArgs()),
                                 {in.getClientId(), in.getRequestSeq()});
        if (in.getClientId() != 0) {
          clients_.remember(in.getClientId(), in.getRequestSeq(), in.getId());
          // Its program gets client_grace from the restart to come back.
          client_seen(in.getClientId());
        }
        return Status::Ok();
      }
      case Update::CLOSURE_FINISHED: {
        auto in = update.getClosureFinished();
        if (in.getErrorCode() == 0) {
          queue_.restore_finished(in.getId(), string_of(in.getValue()));
        } else {
          Status error;
          CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &error));
          queue_.restore_finished(in.getId(), std::move(error));
        }
        return Status::Ok();
      }
      case Update::ERROR_TAKEN:
        (void)queue_.take_error();
        return Status::Ok();
      case Update::RELEASE_CLOSURE:
        // An id this journal never scheduled was refused when it was
        // released; older coordinators journaled such ids: nothing to do.
        (void)queue_.release(update.getReleaseClosure());
        return Status::Ok();
      case Update::CLOSURE_STATE: {
        auto in = update.getClosureState();
        uint8_t state = in.getState();
        if (state > 4 || state == 1) return Status::DataLoss("a journaled closure has state " + std::to_string(state));
        Status error;
        CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &error));
        ClosureQueue::Snapshot::Entry entry;
        entry.closure.id = in.getClosure().getId();
        entry.closure.function = text(in.getClosure().getFunction());
        entry.closure.args = string_of(in.getClosure().getArgs());
        entry.state = static_cast<ClosureQueue::State>(state);
        entry.value = string_of(in.getValue());
        entry.error = std::move(error);
        entry.owner = {in.getClosure().getClientId(), in.getClosure().getRequestSeq()};
        entry.released = in.getReleased();
        if (entry.owner.client != 0) {
          clients_.remember(entry.owner.client, entry.owner.request_seq, entry.closure.id);
          client_seen(entry.owner.client);
        }
        queue_.restore_entry(std::move(entry));
        return Status::Ok();
      }
      case Update::CLOSURE_QUEUE: {
        auto in = update.getClosureQueue();
        Status error;
        CAPSTAN_RETURN_IF_ERROR(status_of(in.getErrorCode(), in.getErrorMessage(), &error));
        queue_.restore_pending(std::move(error), in.getNextId());
        return Status::Ok();
      }
    }
    return Status::DataLoss("a journal record of a kind this coordinator does not know (a newer version wrote it)");
  } catch (const kj::Exception& e) {
    return Status::DataLoss("a journal record does not parse: " + async::from_exception(e).message());
  }
}

Status Coordinator::journal_variable(const PlacedVariable& variable) {
  if (!journal_) return Status::Ok();
  return journal_->append_now(variable_record(variable)).with_context("journaling variable '" + variable.name + "'");
}

std::string Coordinator::variable_record(const PlacedVariable& variable) const {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initCreateVariable();
  out.setName(variable.name);
  out.setDtype(rpc::to_wire(variable.dtype));
  auto shape = out.initShape(static_cast<unsigned>(variable.shape.size()));
  for (unsigned d = 0; d < variable.shape.size(); ++d) shape.set(d, variable.shape[d]);
  rpc::optimizer_to_wire(variable.optimizer, out.initOptimizer());
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
  out.setPlacerCounter(variables_.placer_counter());
  return serialize(message);
}

Status Coordinator::journal_dataset(int64_t id, const PerWorkerDataset& dataset) {
  if (!journal_) return Status::Ok();
  return journal_->append_now(dataset_record(id, dataset)).with_context("journaling per-worker dataset " + std::to_string(id));
}

std::string Coordinator::dataset_record(int64_t id, const PerWorkerDataset& dataset) const {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initAddDataset();
  out.setId(id);
  out.setDefinition(bytes_of(dataset.definition));
  out.setFunction(dataset.function);
  out.setName(dataset.name);
  out.setUid(dataset.uid);
  return serialize(message);
}

void Coordinator::set_last_checkpoint(const std::string& path) {
  if (path == last_checkpoint_) return;
  last_checkpoint_ = path;
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setLastCheckpoint(path);
  Status logged = journal_->append_now(serialize(message));
  if (!logged.ok()) {
    // Recovery after a restart falls back to checkpoint_dir's newest.
    log_->warn("journaling the last checkpoint {}: {}", path, logged.to_string());
  }
}

}  // namespace capstan::coordinator
