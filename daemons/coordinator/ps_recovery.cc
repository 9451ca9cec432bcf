#include "daemons/coordinator/ps_recovery.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

#include "async/pool.h"
#include "async/status_exception.h"
#include "checkpoint/checkpoint.h"

namespace capstan::coordinator {
namespace {

std::string join_names(const std::set<std::string>& names, size_t at_most = 5) {
  std::string out;
  size_t n = 0;
  for (const auto& name : names) {
    if (n == at_most) {
      out += ", ... (" + std::to_string(names.size()) + " in all)";
      break;
    }
    out += (n++ == 0 ? "" : ", ") + name;
  }
  return out;
}

int64_t milliseconds(kj::Duration d) { return d / kj::MILLISECONDS; }

using State = PsHealth::State;

}  // namespace

PsRecovery::PsRecovery(const CoordinatorConfig& config, ParameterServers& ps, PsHealth& health,
                       PsVariables& variables, CheckpointPolicy& checkpoints, boost::asio::thread_pool& pool,
                       LoopContext loop)
    : config_(config),
      ps_(ps),
      health_(health),
      variables_(variables),
      checkpoints_(checkpoints),
      pool_(pool),
      loop_(std::move(loop)) {}

void PsRecovery::start() {
  for (int task = 0; task < ps_.size(); ++task) loop_.tasks.add(watch(task));
}

std::optional<kj::TimePoint> PsRecovery::pause_deadline() const {
  // Something to recover from, should a parameter server come back empty.
  const bool recoverable = config_.ps_recovery && !checkpoints_.recovery_source().empty();
  return health_.pause_deadline(recoverable, loop_.timer.now());
}

void PsRecovery::set_state(int task, State state, Status lost) {
  health_.set(task, state, std::move(lost), loop_.timer.now());
  loop_.changes.notify();
}

void PsRecovery::lose(int task, Status why) {
  set_state(task, State::kLost, std::move(why));
  loop_.log->error("{}", health_.lost(task).message());
}

void PsRecovery::restored_by_hand() {
  for (int task = 0; task < ps_.size(); ++task) {
    if (health_.state(task) == State::kLost) {
      loop_.log->info("parameter server ps:{} at {} has its shards again (restored by hand); dispatch resumes", task,
                      ps_.address(task));
      set_state(task, State::kUp);
    }
  }
}

kj::Promise<void> PsRecovery::watch(int task) {
  return ps_.reachable(task)
      .then([this, task]() { return check(task); })
      .then([this, task]() { return ps_.unreachable(task); })
      .then([this, task]() {
        set_state(task, State::kDown);
        loop_.log->warn("parameter server ps:{} at {} is unreachable; dispatch pauses", task, ps_.address(task));
        return watch(task);
      });
}

kj::Promise<void> PsRecovery::check(int task) {
  std::set<std::string> expected = variables_.shards_on(task);
  if (expected.empty()) {
    set_state(task, State::kUp);
    return kj::READY_NOW;
  }
  return ps_.list_shards(task)
      .catch_([](kj::Exception&& e) { return Result<std::set<std::string>>(async::from_exception(e)); })
      .then([this, task, expected = std::move(expected)](Result<std::set<std::string>> held) -> kj::Promise<void> {
        if (!held.ok()) {
          // Its link broke again (watch sees it next), or it answers
          // nonsense: either way nothing is dispatched meanwhile.
          set_state(task, State::kLost,
                    held.status().with_context("parameter server ps:" + std::to_string(task) + " at " +
                                               ps_.address(task) + ": listing its shards"));
          return kj::READY_NOW;
        }
        std::set<std::string> missing;
        std::set_difference(expected.begin(), expected.end(), held->begin(), held->end(),
                            std::inserter(missing, missing.end()));
        if (missing.empty()) {
          if (health_.ever_up(task)) {
            loop_.log->info("parameter server ps:{} at {} is back with its shards; dispatch resumes", task,
                            ps_.address(task));
          }
          set_state(task, State::kUp);
          return kj::READY_NOW;
        }
        return recover(task, std::move(missing));
      });
}

kj::Promise<void> PsRecovery::recover(int task, std::set<std::string> missing) {
  const std::string who = "parameter server ps:" + std::to_string(task) + " at " + ps_.address(task);
  const std::string lost_what = who + " came back without " + std::to_string(missing.size()) + " shard(s) (" +
                                join_names(missing) + ")";
  if (!config_.ps_recovery) {
    lose(task, Status::DataLoss(lost_what + "; ps_recovery is off: restore a checkpoint (restoreCheckpoint "
                                            "creates them again)"));
    return kj::READY_NOW;
  }
  std::string from = checkpoints_.recovery_source();
  if (from.empty()) {
    lose(task, Status::DataLoss(lost_what + " and there is no checkpoint to restore them from: set checkpoint_dir "
                                            "with checkpoint_every_steps or checkpoint_every_seconds, or save "
                                            "checkpoints from the program (CheckpointManager)"));
    return kj::READY_NOW;
  }
  set_state(task, State::kRecovering);
  loop_.log->warn("{}; restoring them from the latest checkpoint", lost_what);
  return restore_shards(task, missing, std::move(from))
      .then([this, task, who, lost_what](Result<Recovered> read) {
        finish_recovery(task, who, lost_what, std::move(read));
      });
}

kj::Promise<Result<PsRecovery::Recovered>> PsRecovery::restore_shards(int task, const std::set<std::string>& missing,
                                                                      std::string from) {
  // The shards as placed, to be filled from the checkpoint.
  std::vector<VariableState> layout_now = variables_.layout();
  for (auto& v : layout_now) {
    std::erase_if(v.shards, [&](const ShardState& s) { return s.ps_task != task || missing.count(s.name) == 0; });
  }
  std::erase_if(layout_now, [](const VariableState& v) { return v.shards.empty(); });
  return async::run_on_pool(pool_,
                            [from = std::move(from), states = std::move(layout_now)]() mutable -> Result<Recovered> {
                              CAPSTAN_ASSIGN_OR_RETURN(std::string path, resolve_checkpoint(from));
                              checkpoint::CheckpointReaderOptions options;
                              options.verify_checksums_on_open = false;  // the manifest only: the server reads
                              CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(path, options));
                              std::vector<std::string> absent;
                              // Strict: a shard the checkpoint lacks cannot be recovered.
                              CAPSTAN_RETURN_IF_ERROR(
                                  match_checkpoint(reader->manifest(), &states, /*strict=*/true, &absent));
                              return Recovered{path, reader->manifest().step, std::move(states)};
                            })
      .then([this](Result<Recovered> read) -> kj::Promise<Result<Recovered>> {
        if (!read.ok()) return kj::mv(read);
        auto shared = std::make_shared<Recovered>(std::move(*read));
        // The server reads its lost shards from the checkpoint itself,
        // creating them.
        return variables_.restore_from(shared->path, shared->states).then([shared](Status status) -> Result<Recovered> {
          CAPSTAN_RETURN_IF_ERROR(status);
          return std::move(*shared);
        });
      });
}

void PsRecovery::finish_recovery(int task, const std::string& who, const std::string& lost_what,
                                 Result<Recovered> read) {
  if (health_.state(task) != State::kRecovering) return;  // lost again meanwhile: watch starts over
  if (!read.ok()) {
    Status why = read.status();
    lose(task, Status::DataLoss(lost_what + " and restoring them failed: " + why.to_string() +
                                "; restore a checkpoint by hand (restoreCheckpoint creates them again)"));
    return;
  }
  int64_t down_ms = milliseconds(loop_.timer.now() - health_.down_since(task));
  size_t shards = 0;
  for (const auto& v : read->states) shards += v.shards.size();
  checkpoints_.set_last(read->path);
  ++recoveries_;
  ++loop_.stats.ps_recoveries;
  set_state(task, State::kUp);
  loop_.log->warn("{}: restored {} shard(s) from checkpoint {} (step {}); {} ms after it was lost; dispatch resumes",
                  who, shards, read->path, read->step, down_ms);
}

}  // namespace capstan::coordinator
