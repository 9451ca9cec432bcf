#include "daemons/coordinator/ps_recovery.h"

#include <algorithm>
#include <chrono>
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
  peer_failing_.assign(static_cast<size_t>(ps_.size()), false);
  for (int task = 0; task < ps_.size(); ++task) loop_.tasks.add(watch(task));
  if (buddy(0) >= 0) {
    for (int task = 0; task < ps_.size(); ++task) loop_.tasks.add(peer_snapshots(task));
  }
}

int PsRecovery::buddy(int task) const {
  if (config_.peer_snapshot_every_seconds.count() <= 0 || ps_.size() < 2) return -1;
  return (task + 1) % ps_.size();
}

std::optional<kj::TimePoint> PsRecovery::pause_deadline() const {
  // Something to recover from, should a parameter server come back empty.
  const bool recoverable =
      config_.ps_recovery && (!checkpoints_.recovery_source().empty() || buddy(0) >= 0);
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
  const int holder = buddy(task);
  if (holder >= 0 && health_.state(holder) == State::kUp) {
    set_state(task, State::kRecovering);
    loop_.log->warn("{}; restoring them from the in-memory copy on its buddy ps:{} at {}", lost_what, holder,
                    ps_.address(holder));
    std::vector<std::string> names(missing.begin(), missing.end());
    return ps_.restore_from_peer(task, ps_.address(holder), task, std::move(names))
        .then([this, task, holder, who, lost_what,
               missing = std::move(missing)](Result<ParameterServers::PeerRestored> restored) mutable
              -> kj::Promise<void> {
          if (health_.state(task) != State::kRecovering) return kj::READY_NOW;  // lost again meanwhile
          if (!restored.ok()) {
            loop_.log->warn("{}: restoring from the copy on ps:{} failed ({}); falling back to the checkpoint", who,
                            holder, restored.status().to_string());
            return recover_from_disk(task, std::move(missing), who, lost_what);
          }
          const int64_t down_ms = milliseconds(loop_.timer.now() - health_.down_since(task));
          const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count();
          ++recoveries_;
          ++peer_recoveries_;
          ++loop_.stats.ps_recoveries;
          ++loop_.stats.ps_peer_recoveries;
          set_state(task, State::kUp);
          loop_.log->warn(
              "{}: restored {} shard(s) from the in-memory copy on ps:{} (peer snapshot {}, taken {} ms ago: the "
              "updates since are lost); {} ms after it was lost; dispatch resumes",
              who, restored->shards, holder, restored->sequence, now_ms - restored->taken_ms, down_ms);
          return kj::READY_NOW;
        });
  }
  set_state(task, State::kRecovering);
  return recover_from_disk(task, std::move(missing), who, lost_what);
}

kj::Promise<void> PsRecovery::recover_from_disk(int task, std::set<std::string> missing, const std::string& who,
                                                const std::string& lost_what) {
  std::string from = checkpoints_.recovery_source();
  if (from.empty()) {
    lose(task, Status::DataLoss(lost_what + " and there is no checkpoint to restore them from" +
                                (buddy(task) >= 0 ? std::string(" (nor a peer snapshot on its buddy)") : "") +
                                ": set checkpoint_dir with checkpoint_every_steps or checkpoint_every_seconds, "
                                "or save checkpoints from the program (CheckpointManager)"));
    return kj::READY_NOW;
  }
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

kj::Promise<void> PsRecovery::peer_snapshots(int task) {
  return loop_.timer.afterDelay(config_.peer_snapshot_every_seconds.count() * kj::SECONDS)
      .then([this, task]() { return send_peer_snapshot(task, /*full=*/false); })
      .then([this, task]() { return peer_snapshots(task); });
}

kj::Promise<void> PsRecovery::send_peer_snapshot(int task, bool full) {
  const int holder = buddy(task);
  // Only a server with all its shards is copied (an empty replacement's
  // copy would replace the one it is being recovered from), and only to a
  // holder that is up.
  if (holder < 0 || health_.state(task) != State::kUp || health_.state(holder) != State::kUp) return kj::READY_NOW;
  return ps_.send_peer_snapshot(task, ps_.address(holder), full)
      .then([this, task, holder, full](Result<ParameterServers::PeerSent> sent) -> kj::Promise<void> {
        const size_t i = static_cast<size_t>(task);
        if (sent.ok()) {
          ++loop_.stats.peer_snapshots;
          if (peer_failing_[i]) {
            loop_.log->info("parameter server ps:{} sends its peer snapshots to ps:{} again", task, holder);
          }
          peer_failing_[i] = false;
          loop_.log->debug("peer snapshot {} of ps:{} on ps:{}: {} shard(s), {} bytes{}", sent->sequence, task,
                           holder, sent->shards, sent->bytes, sent->full ? " (full)" : "");
          return kj::READY_NOW;
        }
        ++loop_.stats.peer_snapshot_failures;
        if (!full && sent.status().code() == StatusCode::kFailedPrecondition) {
          // The holder lost its copy (it restarted): a full one now.
          return send_peer_snapshot(task, /*full=*/true);
        }
        if (!peer_failing_[i]) {
          loop_.log->warn("parameter server ps:{} could not send its peer snapshot to ps:{}: {} (retried every {} s)",
                          task, holder, sent.status().to_string(), config_.peer_snapshot_every_seconds.count());
        }
        peer_failing_[i] = true;
        return kj::READY_NOW;
      });
}

}  // namespace capstan::coordinator
