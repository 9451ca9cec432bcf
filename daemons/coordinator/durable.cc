// The coordinator's journal (config.work_dir), as the Coordinator replays and
// compacts it: what is kept, and the records, are in coordinator_journal.h.
//
// Compaction: once the journal holds journal_compact_records records and
// more than twice the live ones, the state is written as a fresh journal in
// work_dir/journal-<n+1> (fsynced), work_dir/CURRENT is replaced to name it
// (write, fsync, rename, fsync the directory), and the old one is deleted.
// A crash at any point leaves CURRENT naming a complete journal. Without
// CURRENT (a coordinator from before compaction) the journal is work_dir
// itself.
#include <type_traits>
#include <utility>
#include <variant>

#include "daemons/coordinator/coordinator.h"

namespace capstan::coordinator {

Status Coordinator::open_journal() {
  if (config_.work_dir.empty()) return Status::Ok();
  DurableLog::Compaction compaction;
  compaction.min_records = config_.journal_compact_records;
  compaction.live_records = [this]() {
    return static_cast<int64_t>(variables_.size() + datasets_.size() + strategies_.size()) +
           queue_.size() + 2;
  };
  compaction.snapshot = [this]() { return snapshot_records(); };
  std::vector<std::string> records;
  CAPSTAN_RETURN_IF_ERROR(journal_.open(config_.work_dir, pool_, log_, std::move(compaction), &records));
  strategies_.set_journal([this](const Strategies::Journaled& strategy) { return journal_.strategy(strategy); });
  for (const auto& record : records) {
    CAPSTAN_RETURN_IF_ERROR(apply_journal_record(record).with_context("replaying the journal in " + config_.work_dir));
  }
  (void)queue_.take_cancelled_runs();  // runs of the coordinator that is gone
  CAPSTAN_RETURN_IF_ERROR(journal_.compact_if_due());
  if (!records.empty()) {
    log_->info("replayed the journal in {}: {} variable(s), {} per-worker dataset(s), {} strateg{}, {} closure(s) "
               "queued again, {} result(s) kept{}",
               config_.work_dir, variables_.size(), datasets_.size(), strategies_.size(),
               strategies_.size() == 1 ? "y" : "ies", queue_.queued(), queue_.finished(),
               policy_.last().empty() ? "" : ", last checkpoint " + policy_.last());
  }
  return Status::Ok();
}

std::vector<std::string> Coordinator::snapshot_records() const {
  std::vector<std::string> out;
  for (const auto& [name, variable] : variables_.all()) {
    out.push_back(variable_record(variable, variables_.placer_counter()));
  }
  for (const auto& [id, dataset] : datasets_.all()) out.push_back(dataset_record(id, dataset));
  for (const auto& strategy : strategies_.journaled_state()) out.push_back(strategy_record(strategy));
  if (!policy_.last().empty()) out.push_back(last_checkpoint_record(policy_.last()));
  ClosureQueue::Snapshot queue = queue_.snapshot();
  for (const auto& entry : queue.entries) out.push_back(closure_state_record(entry));
  out.push_back(queue_state_record(queue.pending_error, queue.next_id));
  return out;
}

kj::Promise<Status> Coordinator::journal_synced() { return journal_.synced(); }

Status Coordinator::take_closure_error() {
  Status error = queue_.take_error();
  if (!error.ok()) journal_.error_taken();
  return error;
}

Status Coordinator::apply_journal_record(const std::string& record) {
  CAPSTAN_ASSIGN_OR_RETURN(JournalRecord decoded, decode_record(record, ps_.size()));
  std::visit(
      [this](auto& r) {
        using Record = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<Record, VariableCreated>) {
          variables_.restore(std::move(r.variable), r.placer_counter);
        } else if constexpr (std::is_same_v<Record, DatasetAdded>) {
          datasets_.restore(r.id, std::move(r.dataset));
        } else if constexpr (std::is_same_v<Record, LastCheckpointSet>) {
          policy_.restore_last(std::move(r.path));
        } else if constexpr (std::is_same_v<Record, ClosureScheduled>) {
          queue_.restore_scheduled(r.id, std::move(r.function), std::move(r.args), r.owner);
          if (r.owner.client != 0) {
            clients_.remember(r.owner.client, r.owner.request_seq, r.id);
            // Its program gets client_grace from the restart to come back.
            client_seen(r.owner.client);
          }
        } else if constexpr (std::is_same_v<Record, ClosureFinished>) {
          queue_.restore_finished(r.id, std::move(r.result));
        } else if constexpr (std::is_same_v<Record, ErrorTaken>) {
          (void)queue_.take_error();
        } else if constexpr (std::is_same_v<Record, ClosureReleased>) {
          // An id this journal never scheduled was refused when it was
          // released; older coordinators journaled such ids: nothing to do.
          (void)queue_.release(r.id);
        } else if constexpr (std::is_same_v<Record, ClosureSnapshot>) {
          const ClosureQueue::Owner owner = r.entry.owner;
          if (owner.client != 0) {
            clients_.remember(owner.client, owner.request_seq, r.entry.closure.id);
            client_seen(owner.client);
          }
          queue_.restore_entry(std::move(r.entry));
        } else if constexpr (std::is_same_v<Record, StrategyJournaled>) {
          strategies_.restore_from_journal(std::move(r.strategy));
        } else {
          static_assert(std::is_same_v<Record, QueueSnapshot>);
          queue_.restore_pending(std::move(r.pending_error), r.next_id);
        }
      },
      decoded);
  return Status::Ok();
}

}  // namespace capstan::coordinator
