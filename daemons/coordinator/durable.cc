// The coordinator's journal (config.work_dir): what a restarted coordinator
// must not forget. Each change is appended (fsynced) before it is applied,
// as the dispatcher does; changes are rare (a variable created, a per-worker
// dataset added, a checkpoint saved), so the cost is off the closure path.
//
// Kept: variables with their shards' placement and optimizer (the values stay
// on the parameter servers), the placer's round robin, per-worker datasets
// with their ids and names, and the checkpoint a lost parameter server is
// restored from. Not kept (yet): the closure queue and unfetched results,
// strategies, and the workers' iterator positions.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>

#include "capstan_schemas/coordinator_journal.capnp.h"
#include "daemons/coordinator/coordinator.h"
#include "journal/journal.h"
#include "rpc/errors.h"
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
  CAPSTAN_ASSIGN_OR_RETURN(journal_, journal::JournalWriter::open(config_.work_dir));
  if (!records.empty()) {
    log_->info("replayed the journal in {}: {} variable(s), {} per-worker dataset(s){}", config_.work_dir,
               variables_.size(), datasets_.size(),
               last_checkpoint_.empty() ? "" : ", last checkpoint " + last_checkpoint_);
  }
  return Status::Ok();
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
  return journal_->append(serialize(message)).with_context("journaling variable '" + variable.name + "'");
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
  return journal_->append(serialize(message)).with_context("journaling per-worker dataset " + std::to_string(id));
}

void Coordinator::set_last_checkpoint(const std::string& path) {
  if (path == last_checkpoint_) return;
  last_checkpoint_ = path;
  if (!journal_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<Update>().setLastCheckpoint(path);
  Status logged = journal_->append(serialize(message));
  if (!logged.ok()) {
    // Recovery after a restart falls back to checkpoint_dir's newest.
    log_->warn("journaling the last checkpoint {}: {}", path, logged.to_string());
  }
}

}  // namespace capstan::coordinator
