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
// released. Not kept (yet): strategies. The journal is not compacted: it
// grows with every closure (its arguments and value).
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>

#include "capstan_schemas/coordinator_journal.capnp.h"
#include "daemons/coordinator/coordinator.h"
#include "journal/journal.h"
#include "rpc/errors.h"
#include "rpc/pool.h"
#include "rpc/optimizer_codec.h"
#include "rpc/tensor_codec.h"

namespace capstan::coordinator {
namespace {

using Update = wire::journal::CoordinatorUpdate;

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

std::string serialize(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

}  // namespace

Status Coordinator::open_journal() {
  if (config_.work_dir.empty()) return Status::Ok();
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> records, journal::read_all(config_.work_dir));
  for (const auto& record : records) {
    CAPSTAN_RETURN_IF_ERROR(apply_journal_record(record).with_context("replaying the journal in " +
                                                                      config_.work_dir));
  }
  journal_ = std::make_shared<JournalFile>();
  CAPSTAN_ASSIGN_OR_RETURN(journal_->writer, journal::JournalWriter::open(config_.work_dir));
  (void)queue_.take_cancelled_runs();  // runs of the coordinator that is gone
  if (!records.empty()) {
    log_->info("replayed the journal in {}: {} variable(s), {} per-worker dataset(s), {} closure(s) queued again, "
               "{} result(s) kept{}",
               config_.work_dir, variables_.size(), datasets_.size(), queue_.queued(), queue_.finished(),
               last_checkpoint_.empty() ? "" : ", last checkpoint " + last_checkpoint_);
  }
  return Status::Ok();
}

Status Coordinator::append_now(const std::string& record) {
  std::lock_guard<std::mutex> lock(journal_->mutex);
  return journal_->writer->append(record);
}

void Coordinator::journal_closure_change(std::string record) {
  if (!journal_) return;
  journal_queue_.push_back(std::move(record));
  ++journal_enqueued_;
  flush_journal();
}

void Coordinator::flush_journal() {
  if (journal_flushing_ || journal_queue_.empty()) return;
  journal_flushing_ = true;
  auto batch = std::make_shared<std::vector<std::string>>(std::exchange(journal_queue_, {}));
  const int64_t upto = journal_enqueued_;
  tasks_.add(rpc::run_on_pool(pool_, [file = journal_, batch]() {
               std::lock_guard<std::mutex> lock(file->mutex);
               return file->writer->append_batch(*batch);
             }).then([this, upto](Status written) {
    journal_flushing_ = false;
    if (!written.ok() && journal_broken_.ok()) {
      journal_broken_ = written.with_context("journaling the closure queue in " + config_.work_dir);
      log_->error("{}: closures scheduled from now on are answered with this error; restart the coordinator",
                  journal_broken_.to_string());
    }
    journal_durable_ = upto;
    while (!journal_waiters_.empty() && journal_waiters_.begin()->first <= upto) {
      journal_waiters_.begin()->second->fulfill(Status(journal_broken_));
      journal_waiters_.erase(journal_waiters_.begin());
    }
    flush_journal();
  }));
}

kj::Promise<Status> Coordinator::journal_synced() {
  if (!journal_ || journal_durable_ >= journal_enqueued_) return Status(journal_broken_);
  auto paf = kj::newPromiseAndFulfiller<Status>();
  journal_waiters_.emplace(journal_enqueued_, kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void Coordinator::journal_scheduled(int64_t id, const std::string& function, const std::string& args,
                                    uint64_t client_id, int64_t request_seq) {
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initScheduleClosure();
  out.setId(id);
  out.setFunction(function);
  out.setArgs(kj::arrayPtr(reinterpret_cast<const kj::byte*>(args.data()), args.size()));
  out.setClientId(client_id);
  out.setRequestSeq(request_seq);
  journal_closure_change(serialize(message));
}

void Coordinator::journal_finished(int64_t id) {
  if (!journal_) return;
  auto state = queue_.state(id);
  if (!state.ok() || (*state != ClosureQueue::State::kDone && *state != ClosureQueue::State::kFailed)) return;
  auto value = queue_.value(id);
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initClosureFinished();
  out.setId(id);
  if (value.ok()) {
    out.setValue(kj::arrayPtr(reinterpret_cast<const kj::byte*>(value->data()), value->size()));
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
        Variable v;
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
        placer_.set_counter(std::max(placer_.counter(), in.getPlacerCounter()));
        ++placement_version_;
        variables_[v.name] = std::move(v);
        return Status::Ok();
      }
      case Update::ADD_DATASET: {
        auto in = update.getAddDataset();
        PerWorkerDataset d;
        d.definition.assign(reinterpret_cast<const char*>(in.getDefinition().begin()), in.getDefinition().size());
        d.function = text(in.getFunction());
        d.name = text(in.getName());
        d.uid = in.getUid();
        datasets_[in.getId()] = std::move(d);
        next_dataset_id_ = std::max(next_dataset_id_, in.getId() + 1);
        return Status::Ok();
      }
      case Update::LAST_CHECKPOINT:
        last_checkpoint_ = text(update.getLastCheckpoint());
        return Status::Ok();
      case Update::SCHEDULE_CLOSURE: {
        auto in = update.getScheduleClosure();
        if (in.getId() <= 0) return Status::DataLoss("a journaled closure has id " + std::to_string(in.getId()));
        queue_.restore_scheduled(in.getId(), text(in.getFunction()),
                                 std::string(reinterpret_cast<const char*>(in.getArgs().begin()), in.getArgs().size()));
        if (in.getClientId() != 0) {
          auto& seen = requests_[in.getClientId()];
          seen[in.getRequestSeq()] = in.getId();
          if (seen.size() > kRememberedRequests) seen.erase(seen.begin());
        }
        return Status::Ok();
      }
      case Update::CLOSURE_FINISHED: {
        auto in = update.getClosureFinished();
        if (in.getErrorCode() == 0) {
          queue_.restore_finished(in.getId(), std::string(reinterpret_cast<const char*>(in.getValue().begin()),
                                                          in.getValue().size()));
        } else {
          if (in.getErrorCode() < 0 || in.getErrorCode() > 16) {
            return Status::DataLoss("a journaled closure error has code " + std::to_string(in.getErrorCode()));
          }
          queue_.restore_finished(in.getId(),
                                  Status(static_cast<StatusCode>(in.getErrorCode()), text(in.getErrorMessage())));
        }
        return Status::Ok();
      }
      case Update::ERROR_TAKEN:
        (void)queue_.take_error();
        return Status::Ok();
      case Update::RELEASE_CLOSURE:
        queue_.release(update.getReleaseClosure());
        return Status::Ok();
    }
    return Status::DataLoss("a journal record of a kind this coordinator does not know (a newer version wrote it)");
  } catch (const kj::Exception& e) {
    return Status::DataLoss("a journal record does not parse: " + rpc::from_exception(e).message());
  }
}

Status Coordinator::journal_variable(const Variable& variable) {
  if (!journal_) return Status::Ok();
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initCreateVariable();
  out.setName(variable.name);
  out.setDtype(rpc::to_wire(variable.dtype));
  auto shape = out.initShape(static_cast<unsigned>(variable.shape.size()));
  for (unsigned d = 0; d < variable.shape.size(); ++d) shape.set(d, variable.shape[d]);
  rpc::optimizer_to_wire(variable.optimizer, out.initOptimizer());
  auto shards = out.initShards(static_cast<unsigned>(variable.shards.size()));
  for (unsigned i = 0; i < variable.shards.size(); ++i) {
    shards[i].setName(variable.shards[i].name);
    shards[i].setPsTask(variable.shards[i].ps_task);
    shards[i].setFirstRow(variable.shards[i].first_row);
    shards[i].setRows(variable.shards[i].rows);
  }
  out.setPlacerCounter(placer_.counter());
  return append_now(serialize(message)).with_context("journaling variable '" + variable.name + "'");
}

Status Coordinator::journal_dataset(int64_t id, const PerWorkerDataset& dataset) {
  if (!journal_) return Status::Ok();
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<Update>().initAddDataset();
  out.setId(id);
  out.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(dataset.definition.data()),
                                 dataset.definition.size()));
  out.setFunction(dataset.function);
  out.setName(dataset.name);
  out.setUid(dataset.uid);
  return append_now(serialize(message)).with_context("journaling per-worker dataset " + std::to_string(id));
}

void Coordinator::set_last_checkpoint(const std::string& path) {
  if (path == last_checkpoint_) return;
  last_checkpoint_ = path;
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setLastCheckpoint(path);
  Status logged = append_now(serialize(message));
  if (!logged.ok()) {
    // Recovery after a restart falls back to checkpoint_dir's newest.
    log_->warn("journaling the last checkpoint {}: {}", path, logged.to_string());
  }
}

}  // namespace capstan::coordinator
