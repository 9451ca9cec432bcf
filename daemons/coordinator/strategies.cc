#include "daemons/coordinator/strategies.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "async/pool.h"
#include "async/status_exception.h"
#include "capstan/trace.h"
#include "checkpoint/mirrored_files.h"
#include "data/step_input.h"
#include "training/optimizer.h"

namespace capstan::coordinator {
namespace {

constexpr size_t kMaxStrategyName = 256;
constexpr int64_t kMaxStepBatch = int64_t{1} << 24;  // examples in one step
constexpr size_t kMaxStrategies = 64;
// Initial values journaled inline up to this (the journal's records are at
// most 64 MiB; see Strategies::journaled).
constexpr size_t kMaxJournaledSeedBytes = size_t{32} << 20;

// A worker's answer; a broken link, the worker being dropped meanwhile (it
// stopped answering pings: its calls never return) or no answer within
// `limit` count as lost. Never waits forever.
template <typename T>
kj::Promise<ReplicaAnswer<T>> answer(kj::Promise<Result<T>> call, kj::Promise<void> dropped, kj::Promise<void> late,
                                     std::chrono::milliseconds limit) {
  using Answer = ReplicaAnswer<T>;
  return call
      .then([](Result<T> r) { return Answer{std::move(r), false}; },
            [](kj::Exception&& e) { return Answer{async::from_exception(e), true}; })
      .exclusiveJoin(dropped.then([]() {
        return Answer{Status::Unavailable("the worker was dropped (it stopped answering pings)"), true};
      }))
      .exclusiveJoin(late.then([limit]() {
        return Answer{Status::Unavailable("no answer within " + std::to_string(limit.count()) + " ms"), true};
      }));
}

std::string spec_text(const training::MirroredSpec& s) {
  return "'" + s.name + "' " + std::string(dtype_name(s.dtype)) + shape_string(s.shape) + " (" +
         optimizer_name(s.optimizer.kind) + ")";
}

std::string specs_text(const std::vector<training::MirroredSpec>& specs) {
  std::string described;
  for (const auto& s : specs) described += (described.empty() ? "" : ", ") + spec_text(s);
  return described;
}

bool same_specs(const std::vector<training::MirroredSpec>& have, const std::vector<training::MirroredSpec>& specs) {
  bool same = have.size() == specs.size();
  for (size_t i = 0; same && i < specs.size(); ++i) {
    same = have[i].name == specs[i].name && have[i].dtype == specs[i].dtype && have[i].shape == specs[i].shape &&
           have[i].optimizer == specs[i].optimizer;
  }
  return same;
}

// The member whose state everyone takes. Fewest steps wins: members of the
// last group that hold the variables are at the last step all of them
// finished, or one past it. `last_group`: only its members count (else any
// member that holds a replica past step 0). -1 when none qualifies.
int fewest_steps(const std::vector<int64_t>& ids, const kj::Array<ReplicaAnswer<training::ReplicaReport>>& reports,
                 const std::vector<int64_t>* last_group) {
  std::set<int64_t> last;
  if (last_group != nullptr) last.insert(last_group->begin(), last_group->end());
  int best = -1;
  for (size_t r = 0; r < reports.size(); ++r) {
    const auto& report = *reports[r].result;
    if (!report.holds || (last_group != nullptr && last.count(ids[r]) == 0)) continue;
    if (last_group == nullptr && report.step == 0) continue;
    if (best < 0 || report.step < reports[static_cast<size_t>(best)].result->step) best = static_cast<int>(r);
  }
  return best;
}

}  // namespace

Strategies::Strategies(Workers& workers, const PsVariables& variables, const DispatchGate& gate, LoopContext loop,
                       boost::asio::thread_pool& pool, WorkerTimes& times)
    : workers_(workers), variables_(variables), gate_(gate), loop_(std::move(loop)), pool_(pool), times_(times) {}

Result<Strategies::Strategy*> Strategies::find(const std::string& name) {
  auto it = strategies_.find(name);
  if (it == strategies_.end()) {
    return Status::NotFound("no strategy named '" + name + "' (MirroredStrategy::create makes one)");
  }
  return &it->second;
}

bool Strategies::is_mirrored(const std::string& variable) const {
  for (const auto& [name, strategy] : strategies_) {
    for (const auto& spec : strategy.specs) {
      if (spec.name == variable) return true;
    }
  }
  return false;
}

bool Strategies::busy() const {
  for (const auto& [name, strategy] : strategies_) {
    if (*strategy.busy) return true;
  }
  return false;
}

bool Strategies::busy_with(int64_t worker_id) const {
  for (const auto& [name, strategy] : strategies_) {
    if (*strategy.busy && std::count(strategy.members.begin(), strategy.members.end(), worker_id) > 0) return true;
  }
  return false;
}

Strategies::Specs Strategies::specs() const {
  Specs out;
  for (const auto& [name, strategy] : strategies_) out[name] = strategy.specs;
  return out;
}

// ---- Creating a strategy -------------------------------------------------------------

Result<std::vector<training::MirroredSpec>> Strategies::check_variables(
    const std::string& name, const std::vector<MirroredVariableInit>& variables) const {
  std::vector<training::MirroredSpec> specs;
  std::set<std::string> names;
  for (const auto& v : variables) {
    if (v.name.empty()) return Status::InvalidArgument("createStrategy '" + name + "': a variable has no name");
    if (!names.insert(v.name).second) {
      return Status::InvalidArgument("createStrategy '" + name + "': variable '" + v.name + "' is listed twice");
    }
    if (v.initial.dtype() != DType::kFloat32 && v.initial.dtype() != DType::kFloat64) {
      return Status::InvalidArgument("createStrategy '" + name + "': variable '" + v.name + "' is " +
                                     std::string(dtype_name(v.initial.dtype())) +
                                     "; mirrored variables are float32 or float64");
    }
    CAPSTAN_RETURN_IF_ERROR(training::validate(v.optimizer).with_context("mirrored variable '" + v.name + "'"));
    if (variables_.contains(v.name)) {
      return Status::AlreadyExists("createStrategy '" + name + "': '" + v.name +
                                   "' is a parameter-server variable; a variable lives in one place");
    }
    for (const auto& [other_name, other] : strategies_) {
      if (other_name == name) continue;
      for (const auto& spec : other.specs) {
        if (spec.name == v.name) {
          return Status::AlreadyExists("createStrategy '" + name + "': '" + v.name + "' is mirrored by strategy '" +
                                       other_name + "'");
        }
      }
    }
    specs.push_back({v.name, v.initial.dtype(), v.initial.shape(), v.optimizer});
  }
  return specs;
}

Status Strategies::create(const std::string& name, std::vector<MirroredVariableInit> variables,
                          StrategyConfig config) {
  if (name.empty() || name.size() > kMaxStrategyName) {
    return Status::InvalidArgument("createStrategy: a name of 1 to " + std::to_string(kMaxStrategyName) +
                                   " characters, not " + std::to_string(name.size()));
  }
  if (variables.empty()) return Status::InvalidArgument("createStrategy '" + name + "': no mirrored variables");
  if (config.min_replicas < 1 || config.min_replicas > 4096) {
    return Status::InvalidArgument("createStrategy '" + name + "': min_replicas " +
                                   std::to_string(config.min_replicas) + " is not in [1, 4096]");
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<training::MirroredSpec> specs, check_variables(name, variables));
  auto existing = strategies_.find(name);
  if (existing != strategies_.end()) {
    // A reconnecting program creates its strategy again: hand back the one
    // that exists (its replicas keep their values).
    if (!same_specs(existing->second.specs, specs)) {
      return Status::AlreadyExists("strategy '" + name + "' exists with other variables: " +
                                   specs_text(existing->second.specs));
    }
    Strategy& s = existing->second;
    if (s.replayed && !s.seed.has_value() && s.member_tasks.empty()) {
      // Replayed without its initial values (too large to journal) and no
      // group formed: the program gives them again.
      training::MirroredState seed;
      for (auto& v : variables) seed.variables.push_back({v.name, std::move(v.initial), {}});
      s.seed = Strategy::Seed{std::move(seed), {}, {}};
      s.seed_is_initial = true;
    }
    Journaled record = journaled(s);
    record.config = config;
    CAPSTAN_RETURN_IF_ERROR(journal(record));
    s.config = config;
    return Status::Ok();
  }
  if (strategies_.size() >= kMaxStrategies) {
    return Status::ResourceExhausted("createStrategy: " + std::to_string(kMaxStrategies) + " strategies exist");
  }
  Strategy strategy;
  strategy.name = name;
  strategy.specs = std::move(specs);
  strategy.config = config;
  training::MirroredState seed;
  for (auto& v : variables) seed.variables.push_back({v.name, std::move(v.initial), {}});
  strategy.seed = Strategy::Seed{std::move(seed), {}, {}};
  strategy.seed_is_initial = true;
  CAPSTAN_RETURN_IF_ERROR(journal(journaled(strategy)));
  loop_.log->info("strategy '{}' created: {} mirrored variable(s): {}", name, strategy.specs.size(),
                  specs_text(strategy.specs));
  strategies_.emplace(name, std::move(strategy));
  return Status::Ok();
}

// ---- Step input ----------------------------------------------------------------------------

Status Strategies::check_input(const std::string& name, const StepInputConfig& input) {
  if ((input.global_batch > 0) == (input.per_replica_batch > 0) || input.global_batch < 0 ||
      input.per_replica_batch < 0 || input.global_batch > kMaxStepBatch || input.per_replica_batch > kMaxStepBatch) {
    return Status::InvalidArgument("strategy '" + name + "': a step input needs exactly one of global_batch (" +
                                   std::to_string(input.global_batch) + ") and per_replica_batch (" +
                                   std::to_string(input.per_replica_batch) + ") in [1, " +
                                   std::to_string(kMaxStepBatch) + "]");
  }
  return Status::Ok();
}

Status Strategies::set_input(const std::string& name, const StepInputConfig& input) {
  CAPSTAN_ASSIGN_OR_RETURN(Strategy * s, find(name));
  CAPSTAN_RETURN_IF_ERROR(check_input(name, input));
  const auto& old = s->input;
  if (old.has_value() && old->dataset_id == input.dataset_id && old->global_batch == input.global_batch &&
      old->per_replica_batch == input.per_replica_batch && old->seed == input.seed && old->shuffle == input.shuffle) {
    return Status::Ok();
  }
  // Journaled first: a restarted coordinator hands the steps the same input.
  Journaled record = journaled(*s);
  record.input = input;
  CAPSTAN_RETURN_IF_ERROR(journal(record).with_context("strategy '" + name + "': journaling its step input"));
  if (old.has_value()) s->input_position = 0;
  s->input = input;
  loop_.log->info("strategy '{}': step input is per-worker dataset {} ({} {}, {})", name, input.dataset_id,
                  input.global_batch > 0 ? "constant global batch" : "per-replica batch",
                  input.global_batch > 0 ? input.global_batch : input.per_replica_batch,
                  input.shuffle ? "shuffled each epoch with seed " + std::to_string(input.seed) : "in order");
  return Status::Ok();
}

Result<std::vector<training::StepInput>> Strategies::split_input(const StepInputConfig& input, int64_t position,
                                                                 size_t replicas) {
  const auto n = static_cast<int64_t>(replicas);
  const int64_t global = input.global_batch > 0 ? input.global_batch : input.per_replica_batch * n;
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<training::StepInput> shares,
                           data::step_shares(position, global, n, input.seed, input.shuffle));
  for (auto& share : shares) share.dataset_id = input.dataset_id;
  return shares;
}

// ---- Steps -------------------------------------------------------------------------------

kj::Promise<Result<StepOutcome>> Strategies::run_step(std::string name, std::string function, std::string args) {
  using Out = Result<StepOutcome>;
  auto found = find(name);
  if (!found.ok()) return Out(found.status());
  Strategy& s = **found;
  if (gate_.draining()) return Out(Status::Unavailable("runStep: the coordinator is shutting down (SIGTERM)"));
  if (!workers_.empty() && !workers_.any_has(function)) {
    return Out(Status::NotFound("runStep: no worker has a closure named '" + function + "'"));
  }
  if (*s.busy || gate_.paused()) {
    // One step of a strategy at a time, none while a checkpoint reads the
    // per-worker iterators; the next waits (and looks again now and then, in
    // case the one before was abandoned by its caller).
    return loop_.changes.changed()
        .exclusiveJoin(loop_.timer.afterDelay(200 * kj::MILLISECONDS))
        .then([this, name = std::move(name), function = std::move(function), args = std::move(args)]() mutable {
          return run_step(std::move(name), std::move(function), std::move(args));
        });
  }
  *s.busy = true;
  auto give_up = loop_.timer.now() + s.config.settings.timeout.count() * kj::MILLISECONDS;
  Strategy* strategy = &s;
  return ensure_group(s, function, give_up)
      .then([this, strategy, function, args = std::move(args)](Status formed) mutable -> kj::Promise<Out> {
        if (!formed.ok()) return Out(formed);
        return dispatch_step(*strategy, std::move(function), std::move(args));
      })
      .then([this, busy = s.busy](Out out) {
        *busy = false;
        if (out.ok()) {
          ++loop_.stats.steps_completed;
          loop_.stats.step_replicas.store(static_cast<int64_t>(out->values.size()));
          for (int64_t n : out->examples) loop_.stats.step_examples += n;
        } else {
          ++loop_.stats.steps_failed;
        }
        loop_.changes.notify();
        return out;
      })
      // Also when the caller goes away mid-step (the promise is dropped).
      .attach(kj::defer([busy = s.busy]() { *busy = false; }));
}

kj::Promise<Status> Strategies::ensure_group(Strategy& s, std::string function, kj::TimePoint give_up) {
  auto members = workers_.replica_candidates(function);
  if (static_cast<int>(members.size()) < s.config.min_replicas) {
    if (loop_.timer.now() >= give_up) {
      return Status::Unavailable("strategy '" + s.name + "' needs " + std::to_string(s.config.min_replicas) +
                                 " worker(s) with closure '" + function + "'; " + std::to_string(members.size()) +
                                 " registered within " + std::to_string(s.config.settings.timeout.count()) + " ms");
    }
    return loop_.changes.changed()
        .exclusiveJoin(loop_.timer.afterDelay(500 * kj::MILLISECONDS))
        .then([this, &s, function, give_up]() { return ensure_group(s, function, give_up); });
  }
  if (s.formed && members == s.members && !s.seed.has_value()) return Status::Ok();
  return form_group(s, members).then([this, &s, function, give_up](Status status) -> kj::Promise<Status> {
    if (status.ok() || status.code() != StatusCode::kUnavailable || loop_.timer.now() >= give_up) return status;
    // A member was lost while the group formed: once more with the others.
    loop_.log->warn("strategy '{}': forming the group failed ({}); forming it again", s.name, status.message());
    return form_group(s, workers_.replica_candidates(function)).then([&s](Status again) -> kj::Promise<Status> {
      if (again.ok() || again.code() != StatusCode::kUnavailable) return again;
      return Status::Unavailable("strategy '" + s.name + "': the group did not form: " + again.message());
    });
  });
}

// A replica call to `worker_id`, bounded: see answer().
template <typename T>
kj::Promise<ReplicaAnswer<T>> Strategies::ask(int64_t worker_id, kj::Promise<Result<T>> call,
                                              std::chrono::milliseconds limit) {
  return answer(kj::mv(call), workers_.dropped(worker_id), loop_.timer.afterDelay(limit.count() * kj::MILLISECONDS),
                limit);
}

template <typename T, typename Call>
kj::Promise<kj::Array<ReplicaAnswer<T>>> Strategies::ask_each(const std::vector<int64_t>& ids, Call call,
                                                              std::chrono::milliseconds limit) {
  auto asks = kj::heapArrayBuilder<kj::Promise<Answer<T>>>(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    // Every member must still be registered; its peer is looked up again at
    // each stage (a member dropped meanwhile fails the formation).
    Worker* worker = workers_.find(ids[r]);
    asks.add(worker == nullptr ? kj::Promise<Answer<T>>(Answer<T>{Status::Unavailable("dropped"), true})
                               : ask(ids[r], call(*worker->peer, r), limit));
  }
  return kj::joinPromises(asks.finish());
}

Status Strategies::lost_while_forming(Strategy& s, int64_t worker_id, const Status& why) {
  workers_.drop(worker_id, why.with_context("strategy '" + s.name + "'"));
  return Status::Unavailable("strategy '" + s.name + "': worker " + std::to_string(worker_id) +
                             " was lost while the group formed: " + why.message());
}

template <typename T>
Status Strategies::check_answers(Strategy& s, const std::vector<int64_t>& ids, const kj::Array<Answer<T>>& answers,
                                 const char* stage) {
  for (size_t r = 0; r < answers.size(); ++r) {
    if (answers[r].lost) return lost_while_forming(s, ids[r], answers[r].result.status());
    if (!answers[r].result.ok()) {
      return answers[r].result.status().with_context("strategy '" + s.name + "': worker " + std::to_string(ids[r]) +
                                                     " (" + stage + ")");
    }
  }
  return Status::Ok();
}

kj::Promise<Status> Strategies::form_group(Strategy& s, std::vector<int64_t> members) {
  auto formation = std::make_shared<Formation>();
  formation->epoch = ++s.epoch;
  // Status and prepare answer at once; forming waits for every member to
  // connect (the collective deadline) and then moves the state.
  formation->quick = s.config.settings.timeout;
  formation->forming = 2 * s.config.settings.timeout + std::chrono::milliseconds(5000);
  s.formed = false;
  if (members.empty()) {
    return Status::Unavailable("strategy '" + s.name + "': no worker to form a group with");
  }
  formation->ids = std::move(members);
  const std::string name = s.name;
  return ask_each<training::ReplicaReport>(
             formation->ids, [name](WorkerPeer& peer, size_t) { return peer.replica_status(name); },
             formation->quick)
      .then([this, &s, formation](kj::Array<Answer<training::ReplicaReport>> reports) {
        return prepare(s, *formation, kj::mv(reports));
      })
      .then([this, &s, formation](kj::Array<Answer<std::string>> addresses) {
        return form(s, *formation, kj::mv(addresses));
      })
      .then(
          [this, &s, formation](kj::Array<Answer<training::ReplicaReport>> reports) {
            return conclude(s, *formation, kj::mv(reports));
          },
          [](kj::Exception&& e) { return async::from_exception(e); });
}

Result<int> Strategies::choose_source(Strategy& s, const std::vector<int64_t>& ids,
                                      const kj::Array<Answer<training::ReplicaReport>>& reports) {
  int source = 0;
  if (s.seed.has_value() && s.seed_is_initial && s.members.empty()) {
    // A strategy this coordinator never formed whose workers already hold
    // trained replicas (the coordinator restarted under a running job):
    // their values win over the initial ones.
    int best = fewest_steps(ids, reports, /*last_group=*/nullptr);
    if (best >= 0) {
      loop_.log->warn("strategy '{}': worker {} already holds its variables at step {} (the coordinator restarted "
                      "under a running job?): training goes on from them, not from the initial values",
                      s.name, ids[static_cast<size_t>(best)], reports[static_cast<size_t>(best)].result->step);
      s.seed.reset();
      source = best;
    }
  }
  if (s.seed.has_value()) {
    source = 0;
  } else if (!s.members.empty() || s.replayed) {
    const std::vector<int64_t> last = s.members.empty() ? replayed_members(s) : s.members;
    int best = fewest_steps(ids, reports, s.members.empty() && s.member_tasks.empty() ? nullptr : &last);
    if (best < 0) {
      return Status::FailedPrecondition(
          "strategy '" + s.name + "': no live worker holds its mirrored variables (every replica of the last "
          "group was lost); restore a checkpoint (restore_checkpoint) to go on");
    }
    source = best;
  }
  return source;
}

kj::Promise<kj::Array<ReplicaAnswer<std::string>>> Strategies::prepare(
    Strategy& s, Formation& formation, kj::Array<Answer<training::ReplicaReport>> reports) {
  const auto& ids = formation.ids;
  Status answered = check_answers(s, ids, reports, "replica status");
  if (!answered.ok()) return async::to_exception(answered);
  auto source = choose_source(s, ids, reports);
  if (!source.ok()) return async::to_exception(source.status());
  formation.source = *source;
  // The input position goes with the state: a survivor's, or (a seed that
  // choose_source kept) where the strategy was.
  formation.input_position =
      s.seed.has_value() ? s.input_position : reports[static_cast<size_t>(*source)].result->input_position;
  const std::string name = s.name;
  const int64_t epoch = formation.epoch;
  return ask_each<std::string>(
      ids, [name, epoch](WorkerPeer& peer, size_t) { return peer.prepare_replica(name, epoch); }, formation.quick);
}

kj::Promise<kj::Array<ReplicaAnswer<training::ReplicaReport>>> Strategies::form(
    Strategy& s, const Formation& formation, kj::Array<Answer<std::string>> addresses) {
  const auto& ids = formation.ids;
  Status answered = check_answers(s, ids, addresses, "prepare");
  if (!answered.ok()) return async::to_exception(answered);
  std::vector<std::string> by_rank;
  for (const auto& address : addresses) by_rank.push_back(*address.result);
  // A member dropped since it answered would leave the others waiting for it
  // until the deadline: form without it instead.
  for (int64_t id : ids) {
    if (workers_.find(id) == nullptr) {
      return async::to_exception(Status::Unavailable("strategy '" + s.name + "': worker " + std::to_string(id) +
                                                     " was lost while the group formed"));
    }
  }
  auto make_form = [&s, &formation, by_rank = std::move(by_rank)](WorkerPeer& peer, size_t r) {
    training::ReplicaForm form;
    form.strategy = s.name;
    form.epoch = formation.epoch;
    form.rank = static_cast<int>(r);
    form.addresses = by_rank;
    form.source = formation.source;
    form.specs = s.specs;
    if (static_cast<int>(r) == formation.source && s.seed.has_value()) {
      form.seed = s.seed->values;
      form.seed_checkpoint = s.seed->checkpoint;
      form.seed_from_checkpoint = s.seed->from_checkpoint;
    }
    form.settings = s.config.settings;
    form.input_position = formation.input_position;
    return peer.form_replica(std::move(form));
  };
  return ask_each<training::ReplicaReport>(ids, make_form, formation.forming);
}

Status Strategies::conclude(Strategy& s, const Formation& formation,
                            kj::Array<Answer<training::ReplicaReport>> reports) {
  const auto& ids = formation.ids;
  Status first;
  std::set<uint64_t> checksums;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].lost) {
      Status why = lost_while_forming(s, ids[r], reports[r].result.status());
      if (first.ok()) first = why;
    } else if (!reports[r].result.ok() && first.ok()) {
      first = reports[r].result.status().with_context("strategy '" + s.name + "': worker " + std::to_string(ids[r]) +
                                                      " (forming epoch " + std::to_string(formation.epoch) + ")");
    } else if (reports[r].result.ok()) {
      checksums.insert(reports[r].result->checksum);
    }
  }
  if (!first.ok()) return first;
  if (checksums.size() != 1) {
    return Status::DataLoss("strategy '" + s.name + "': the replicas of epoch " + std::to_string(formation.epoch) +
                            " differ after taking the source's state");
  }
  CAPSTAN_RETURN_IF_ERROR(
      journal_formation(s, formation, reports[static_cast<size_t>(formation.source)].result->step));
  s.members = ids;
  s.formed = true;
  s.seed.reset();
  s.input_position = formation.input_position;
  std::string who;
  for (size_t r = 0; r < ids.size(); ++r) {
    who += (who.empty() ? "" : ", ") + std::to_string(r) + "=worker " + std::to_string(ids[r]) + " (task " +
           std::to_string(workers_.task_index(ids[r])) + ")";
  }
  loop_.log->info("strategy '{}': group of {} formed (epoch {}): {}; state from rank {} (step {}, input position {})",
                  s.name, ids.size(), formation.epoch, who, formation.source,
                  reports[static_cast<size_t>(formation.source)].result->step, formation.input_position);
  return Status::Ok();
}

kj::Promise<Result<StepOutcome>> Strategies::dispatch_step(Strategy& s, std::string function, std::string args) {
  const std::vector<int64_t> members = s.members;
  const int64_t epoch = s.epoch;
  // Each replica's share of the step input, from where the replicas' state
  // is: a failed step's positions are split again among the next step's.
  std::vector<training::StepInput> shares;
  if (s.input.has_value()) {
    auto split = split_input(*s.input, s.input_position, members.size());
    if (!split.ok()) return Result<StepOutcome>(split.status().with_context("strategy '" + s.name + "'"));
    shares = std::move(*split);
  }
  auto outcomes = kj::heapArrayBuilder<kj::Promise<ClosureOutcome>>(members.size());
  // The order the members' answers arrive in: the first error is the cause,
  // the later ones mostly its consequences.
  auto arrivals = std::make_shared<std::vector<size_t>>();
  for (size_t r = 0; r < members.size(); ++r) {
    std::optional<training::StepInput> share;
    if (!shares.empty()) share = shares[r];
    outcomes.add(run_replica(s.name, members, epoch, r, function, args, share, arrivals));
  }
  Strategy* strategy = &s;
  return kj::joinPromises(outcomes.finish())
      .then([this, strategy, members, epoch, arrivals, shares = std::move(shares)](kj::Array<ClosureOutcome> all) {
        return step_result(*strategy, members, epoch, *arrivals, shares, kj::mv(all));
      });
}

kj::Promise<ClosureOutcome> Strategies::run_replica(const std::string& name, const std::vector<int64_t>& members,
                                                    int64_t epoch, size_t r, const std::string& function,
                                                    const std::string& args, std::optional<training::StepInput> input,
                                                    std::shared_ptr<std::vector<size_t>> arrivals) {
  const int64_t id = members[r];
  const Worker* worker = workers_.find(id);
  if (worker == nullptr) {
    return ClosureOutcome{Status::Unavailable("worker " + std::to_string(id) + " was dropped"), true};
  }
  ClosureRun run;
  run.function = function;
  run.args = args;
  run.placement_version = variables_.version();
  run.num_workers = static_cast<uint32_t>(members.size());
  run.worker_index = worker->task_index;
  run.strategy = name;
  run.epoch = epoch;
  run.step_input = std::move(input);
  const int64_t ticket = times_.begin(worker->task_index, 1, 0, WorkerTimes::Clock::now(), /*step=*/true);
  // The replica's step in the flight recorder (and a trace), until it answers.
  auto span = std::make_shared<trace::Span>(trace::Kind::kStep, function,
                                            "strategy " + name + " epoch " + std::to_string(epoch) + ", replica " +
                                                std::to_string(r) + " on worker " + std::to_string(worker->task_index));
  span->set_async();
  return worker->peer->run_closure(std::move(run))
      .catch_([](kj::Exception&& e) { return ClosureOutcome{async::from_exception(e), true}; })
      .exclusiveJoin(workers_.dropped(id).then([id]() {
        return ClosureOutcome{Status::Unavailable("worker " + std::to_string(id) +
                                                  " was dropped (it stopped answering pings)"),
                              true};
      }))
      .then([this, members, name, epoch, r, arrivals, ticket, function, span](ClosureOutcome o) {
        arrivals->push_back(r);
        if (o.result.ok() && !o.worker_lost) {
          times_.end(ticket, function, o.phases);
        } else {
          times_.abandon(ticket);
          span->fail(o.result.status().to_string());
        }
        span->finish();
        if (!o.result.ok()) {
          // The others may wait for this one in a collective: abort their
          // group so that they fail now (a replica whose closure failed
          // aborted it itself; one that failed before it ran, or was lost,
          // not).
          std::string reason = "worker " + std::to_string(members[r]) + " (replica " + std::to_string(r) + ") " +
                               (o.worker_lost ? "was lost: " : "failed: ") + o.result.status().message();
          for (size_t k = 0; k < members.size(); ++k) {
            const Worker* other = workers_.find(members[k]);
            if (k == r || other == nullptr) continue;
            loop_.tasks.add(
                other->peer->abort_replica(name, epoch, reason).then([](Status) {}, [](kj::Exception&&) {}));
          }
        }
        return o;
      })
      // Runs as soon as this member answers (not when the last one does):
      // the abort must not wait.
      .eagerlyEvaluate(nullptr);
}

Result<StepOutcome> Strategies::step_result(Strategy& s, const std::vector<int64_t>& members, int64_t epoch,
                                            const std::vector<size_t>& arrivals,
                                            const std::vector<training::StepInput>& shares,
                                            kj::Array<ClosureOutcome> all) {
  std::vector<std::string> lost;
  Status first_lost, first_error;
  // A closure's own error beats what its peers saw because of it: their
  // group aborted mid-operation (Unavailable, Aborted) or before their next
  // one (Aborted: a call on an aborted group). Among equals, the one that
  // arrived first.
  auto consequence = [](const Status& e) {
    return e.code() == StatusCode::kUnavailable || e.code() == StatusCode::kAborted;
  };
  // Members that had no answer to wait for (dropped before the step) last.
  std::vector<size_t> order = arrivals;
  for (size_t r = 0; r < all.size(); ++r) {
    if (std::find(order.begin(), order.end(), r) == order.end()) order.push_back(r);
  }
  for (size_t r : order) {
    const auto& o = all[r];
    if (o.worker_lost) {
      lost.push_back("worker " + std::to_string(members[r]) + " (task " +
                     std::to_string(workers_.task_index(members[r])) + ", replica " + std::to_string(r) + ")");
      if (first_lost.ok()) first_lost = o.result.status();
      workers_.drop(members[r], o.result.status().with_context("strategy '" + s.name + "' step"));
    } else if (!o.result.ok()) {
      if (first_error.ok() || (consequence(first_error) && !consequence(o.result.status()))) {
        first_error = o.result.status();
      }
    }
  }
  if (lost.empty() && first_error.ok()) {
    StepOutcome out;
    out.steps = ++s.steps;
    out.epoch = epoch;
    // The step's positions are committed with its update when its closure
    // read them (an evaluation step of the same strategy does not).
    size_t took = 0;
    for (const auto& o : all) took += o.input_taken ? 1 : 0;
    const bool consumed = !shares.empty() && took == all.size();
    for (size_t r = 0; r < all.size(); ++r) {
      out.values.push_back(*all[r].result);
      out.task_indexes.push_back(workers_.task_index(members[r]));
      if (consumed) out.examples.push_back(shares[r].count);
    }
    if (consumed) s.input_position = shares.front().end;
    if (took != 0 && !consumed) {
      // Some replicas moved their input position, some not: the next group
      // takes its source's (whose variables are the ones that go on).
      loop_.log->warn("strategy '{}': step {}: {} of {} replicas read the step input; the next step re-forms the "
                      "group from its source's input position",
                      s.name, out.steps, took, all.size());
      s.formed = false;
    }
    out.input_position = s.input_position;
    return out;
  }
  // Not committed: the next group's source says where the input is (the
  // replicas may have taken the update before the step failed).
  s.formed = false;
  if (!lost.empty()) {
    std::string names;
    for (const auto& l : lost) names += (names.empty() ? "" : ", ") + l;
    const size_t left = workers_.size();
    loop_.log->warn("strategy '{}': step {} failed: {} lost ({}); the next step re-forms the group", s.name,
                    s.steps + 1, names, first_lost.message());
    return Status::Unavailable("step " + std::to_string(s.steps + 1) + " of strategy '" + s.name + "' failed: " +
                               names + " lost (" + first_lost.message() + "); the next step goes on with the " +
                               std::to_string(left) + " live worker(s), from the last step every replica finished");
  }
  loop_.log->warn("strategy '{}': step {} failed: {}", s.name, s.steps + 1, first_error.to_string());
  return first_error.with_context("step " + std::to_string(s.steps + 1) + " of strategy '" + s.name + "'");
}

// ---- Reading replicas ------------------------------------------------------------------------

kj::Promise<Result<training::MirroredState>> Strategies::mirrored_state(Strategy& s) {
  using Out = Result<training::MirroredState>;
  if (s.seed.has_value()) {
    if (s.seed->checkpoint.empty()) return Out(*s.seed->values);
    return async::run_on_pool(pool_, [seed = *s.seed, specs = s.specs]() -> Out {
      return checkpoint::read_mirrored_seed(seed.checkpoint, specs, seed.from_checkpoint,
                                            seed.values.has_value() ? &*seed.values : nullptr);
    });
  }
  if (s.members.empty()) {
    return Out(Status::FailedPrecondition("strategy '" + s.name + "' has no replica to read from (no group formed)"));
  }
  return read_state_from(s.name, s.members, 0, s.config.settings.timeout, Status::Ok());
}

// Replica `i` of `members` first, then the next ones; each worker looked up
// again when its turn comes (it may have been dropped meanwhile).
kj::Promise<Result<training::MirroredState>> Strategies::read_state_from(std::string name, std::vector<int64_t> members,
                                                                      size_t i, std::chrono::milliseconds limit,
                                                                      Status last) {
  using Out = Result<training::MirroredState>;
  for (; i < members.size(); ++i) {
    const Worker* worker = workers_.find(members[i]);
    if (worker == nullptr) continue;
    return ask(members[i], worker->peer->read_replica(name), limit)
        .then([this, name, members, i, limit](Answer<training::MirroredState> a) mutable -> kj::Promise<Out> {
          if (a.result.ok()) return kj::mv(a.result);
          return read_state_from(kj::mv(name), kj::mv(members), i + 1, limit, a.result.status());
        });
  }
  return Out(Status::FailedPrecondition("strategy '" + name + "': no live replica to read from" +
                                        (last.ok() ? std::string() : " (last: " + last.to_string() + ")")));
}

kj::Promise<Result<std::pair<Tensor, int64_t>>> Strategies::read_mirrored(std::string strategy, std::string variable) {
  using Out = Result<std::pair<Tensor, int64_t>>;
  auto found = find(strategy);
  if (!found.ok()) return Out(found.status());
  Strategy& s = **found;
  bool known = std::any_of(s.specs.begin(), s.specs.end(), [&](const auto& spec) { return spec.name == variable; });
  if (!known) return Out(Status::NotFound("strategy '" + strategy + "' has no mirrored variable '" + variable + "'"));
  return mirrored_state(s).then([variable](Result<training::MirroredState> state) -> Out {
    CAPSTAN_RETURN_IF_ERROR(state.status());
    for (auto& v : state->variables) {
      if (v.name == variable) return std::make_pair(std::move(v.value), state->step);
    }
    return Status::Internal("the replica has no variable '" + variable + "'");
  });
}

kj::Promise<Result<StrategyStatus>> Strategies::status(std::string strategy) {
  using Out = Result<StrategyStatus>;
  auto found = find(strategy);
  if (!found.ok()) return Out(found.status());
  Strategy& s = **found;
  auto status = std::make_shared<StrategyStatus>();
  status->epoch = s.epoch;
  status->steps = s.steps;
  // Replayed, no group formed yet: the last group's members that are back.
  const std::vector<int64_t> members = s.members.empty() && s.replayed ? replayed_members(s) : s.members;
  auto asks = kj::heapArrayBuilder<kj::Promise<void>>(members.size());
  for (size_t r = 0; r < members.size(); ++r) {
    ReplicaInfo info;
    info.worker_id = members[r];
    info.task_index = workers_.task_index(members[r]);
    info.rank = static_cast<int>(r);
    status->replicas.push_back(info);
    const Worker* worker = workers_.find(members[r]);
    if (worker == nullptr) {
      status->replicas.back().status = Status::Unavailable("worker " + std::to_string(members[r]) + " was lost");
      asks.add(kj::READY_NOW);
      continue;
    }
    asks.add(ask(members[r], worker->peer->replica_status(strategy), s.config.settings.timeout)
                 .then([status, r](Answer<training::ReplicaReport> a) {
                   auto& info = status->replicas[r];
                   if (a.result.ok()) {
                     info.report = *a.result;
                   } else {
                     info.status = a.result.status();
                   }
                 }));
  }
  return kj::joinPromises(asks.finish()).then([status]() -> Out { return std::move(*status); });
}

// ---- Checkpoints of mirrored variables ---------------------------------------------

kj::Promise<Result<Strategies::MirroredSave>> Strategies::save(std::string directory) {
  using Out = Result<MirroredSave>;
  auto out = std::make_shared<MirroredSave>();
  auto saves = kj::Vector<kj::Promise<Status>>();
  for (auto& [key, strategy] : strategies_) {
    Strategy* s = &strategy;
    const std::string name = key;
    kj::Promise<Result<training::SavedReplica>> saved = nullptr;
    if (s->seed.has_value()) {
      // No group has taken the seed yet: nothing to ask a replica for.
      saved = mirrored_state(*s).then([this, directory, name](Result<training::MirroredState> state) {
        using Saved = Result<training::SavedReplica>;
        if (!state.ok()) return kj::Promise<Saved>(Saved(state.status()));
        return async::run_on_pool(pool_, [directory, name, state = std::move(*state)]() -> Saved {
          return checkpoint::write_mirrored_file(directory, checkpoint::mirrored_file_name(name), state);
        });
      });
    } else if (s->members.empty()) {
      saved = Result<training::SavedReplica>(
          Status::FailedPrecondition("strategy '" + name + "' has no replica to save (no group formed)"));
    } else {
      // Writing can take longer than a collective: at least ten minutes.
      const auto limit = std::max<std::chrono::milliseconds>(s->config.settings.timeout, std::chrono::minutes(10));
      saved = save_from(name, s->members, 0, directory, limit, Status::Ok());
    }
    saves.add(saved.then([out, s](Result<training::SavedReplica> saved) -> Status {
      CAPSTAN_RETURN_IF_ERROR(saved.status().with_context("saving strategy '" + s->name + "'"));
      for (const auto& spec : s->specs) {
        bool written = std::any_of(saved->variables.begin(), saved->variables.end(),
                                   [&](const auto& v) { return v.name == spec.name; });
        if (!written) {
          return Status::Internal("strategy '" + s->name + "': " + saved->file + " lacks mirrored variable '" +
                                  spec.name + "'");
        }
      }
      CAPSTAN_ASSIGN_OR_RETURN(auto entries, checkpoint::mirrored_manifest_entries(*saved, s->specs));
      for (auto& e : entries) out->variables.push_back(std::move(e));
      out->written.push_back({saved->file, saved->size, saved->crc32c});
      return Status::Ok();
    }));
  }
  return kj::joinPromises(saves.releaseAsArray()).then([out](kj::Array<Status> results) -> Out {
    for (auto& status : results) CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*out);
  });
}

kj::Promise<Result<training::SavedReplica>> Strategies::save_from(std::string name, std::vector<int64_t> members,
                                                                  size_t i, std::string directory,
                                                                  std::chrono::milliseconds limit, Status last) {
  using Out = Result<training::SavedReplica>;
  for (; i < members.size(); ++i) {
    const Worker* worker = workers_.find(members[i]);
    if (worker == nullptr) continue;
    return ask(members[i], worker->peer->save_replica(name, directory), limit)
        .then([this, name, members, i, directory, limit](Answer<training::SavedReplica> a) mutable
              -> kj::Promise<Out> {
          // Only a lost member is passed over: an error of the save itself
          // (a bad directory, a full disk) would be the next one's too.
          if (a.result.ok() || !a.lost) return kj::mv(a.result);
          return save_from(kj::mv(name), kj::mv(members), i + 1, kj::mv(directory), limit, a.result.status());
        });
  }
  return Out(Status::FailedPrecondition("strategy '" + name + "': no live replica to save" +
                                        (last.ok() ? std::string() : " (last: " + last.to_string() + ")")));
}

Result<Strategies::Restore> Strategies::read_checkpoint(const checkpoint::CheckpointReader& reader,
                                                        const Specs& specs) {
  Restore out;
  out.checkpoint = reader.path();
  for (const auto& [name, list] : specs) {
    std::vector<std::string> present;
    for (const auto& spec : list) {
      if (reader.manifest().find_variable(spec.name) == nullptr) {
        out.missing.push_back(spec.name);
      } else {
        present.push_back(spec.name);
      }
    }
    CAPSTAN_RETURN_IF_ERROR(checkpoint::check_mirrored(reader.manifest(), list, present));
    if (!present.empty()) out.variables[name] = std::move(present);
  }
  return out;
}

kj::Promise<Status> Strategies::seed(Restore restore) {
  auto seeds = kj::Vector<kj::Promise<Status>>();
  for (auto& [name, names] : restore.variables) {
    auto found = find(name);
    if (!found.ok()) continue;  // gone meanwhile (strategies are never erased)
    Strategy* s = *found;
    Strategy::Seed seed{std::nullopt, restore.checkpoint, std::move(names)};
    if (seed.from_checkpoint.size() == s->specs.size()) {
      Journaled record = journaled(*s);
      record.initial.reset();
      record.seed_checkpoint = seed.checkpoint;
      record.seed_from_checkpoint = seed.from_checkpoint;
      CAPSTAN_RETURN_IF_ERROR(journal(record));
      s->seed = std::move(seed);
      s->seed_is_initial = false;
      s->formed = false;
      continue;
    }
    // Some of the strategy's variables are not in the checkpoint: they keep
    // the values they have now (read through here: the rare partial
    // restore).
    seeds.add(mirrored_state(*s).then([s, seed = std::move(seed)](Result<training::MirroredState> now) mutable
                                      -> Status {
      CAPSTAN_RETURN_IF_ERROR(now.status().with_context("keeping the mirrored variables the checkpoint lacks"));
      training::MirroredState kept;
      kept.step = now->step;
      for (auto& v : now->variables) {
        if (std::find(seed.from_checkpoint.begin(), seed.from_checkpoint.end(), v.name) == seed.from_checkpoint.end()) {
          kept.variables.push_back(std::move(v));
        }
      }
      seed.values = std::move(kept);
      s->seed = std::move(seed);
      s->seed_is_initial = false;
      s->formed = false;
      return Status::Ok();
    }));
  }
  return kj::joinPromises(seeds.releaseAsArray()).then([](kj::Array<Status> results) {
    for (auto& status : results) CAPSTAN_RETURN_IF_ERROR(status);
    return Status::Ok();
  });
}

// ---- Durability ---------------------------------------------------------------------

Strategies::Journaled Strategies::journaled(const Strategy& s) const {
  Journaled out;
  out.name = s.name;
  out.specs = s.specs;
  out.config = s.config;
  if (s.seed.has_value() && s.seed_is_initial && s.seed->values.has_value()) {
    size_t bytes = 0;
    for (const auto& v : s.seed->values->variables) bytes += v.value.byte_size();
    // Past this a record would near the journal's limit: a restarted
    // coordinator then takes the values from the program's create() again.
    if (bytes <= kMaxJournaledSeedBytes) out.initial = s.seed->values;
  } else if (s.seed.has_value() && !s.seed->values.has_value()) {
    // A restore's seed; a partial one (with values kept from the replicas)
    // is not journaled: a restart forgets it, and the replicas go on.
    out.seed_checkpoint = s.seed->checkpoint;
    out.seed_from_checkpoint = s.seed->from_checkpoint;
  }
  out.epoch = s.epoch;
  out.member_tasks = s.member_tasks;
  out.steps = s.steps;
  out.input = s.input;
  return out;
}

Status Strategies::journal(const Journaled& record) const {
  if (!journal_) return Status::Ok();
  if (record.initial.has_value() || !record.seed_checkpoint.empty() || record.epoch > 0) return journal_(record);
  // The initial values were too large to journal.
  loop_.log->warn("strategy '{}': its initial values are over {} MiB and are not journaled: if the coordinator "
                  "restarts before the first step, the program's MirroredStrategy::create gives them again",
                  record.name, kMaxJournaledSeedBytes >> 20);
  return journal_(record);
}

Status Strategies::journal_formation(Strategy& s, const Formation& formation, int64_t source_step) {
  Journaled record = journaled(s);
  record.initial.reset();
  record.seed_checkpoint.clear();
  record.seed_from_checkpoint.clear();
  record.epoch = formation.epoch;
  record.member_tasks.clear();
  for (int64_t id : formation.ids) record.member_tasks.push_back(workers_.task_index(id));
  // After a restart the steps run are the replicas' (the journal has them
  // as of the last formation).
  if (s.replayed) record.steps = std::max(s.steps, source_step);
  CAPSTAN_RETURN_IF_ERROR(journal(record).with_context("strategy '" + s.name + "': journaling its group"));
  if (s.replayed) {
    loop_.log->info("strategy '{}': group formed again after the coordinator's restart, at step {} (journaled {})",
                    s.name, record.steps, s.steps);
  }
  s.member_tasks = std::move(record.member_tasks);
  s.steps = record.steps;
  s.replayed = false;
  return Status::Ok();
}

std::vector<Strategies::Journaled> Strategies::journaled_state() const {
  std::vector<Journaled> out;
  for (const auto& [name, strategy] : strategies_) out.push_back(journaled(strategy));
  return out;
}

void Strategies::restore_from_journal(Journaled record) {
  Strategy s;
  s.name = record.name;
  s.specs = std::move(record.specs);
  s.config = record.config;
  if (record.initial.has_value()) {
    s.seed = Strategy::Seed{std::move(record.initial), {}, {}};
    s.seed_is_initial = true;
  } else if (!record.seed_checkpoint.empty()) {
    s.seed = Strategy::Seed{std::nullopt, std::move(record.seed_checkpoint), std::move(record.seed_from_checkpoint)};
  }
  s.epoch = record.epoch;
  s.member_tasks = std::move(record.member_tasks);
  s.steps = record.steps;
  s.input = record.input;
  s.replayed = true;
  strategies_.insert_or_assign(record.name, std::move(s));
}

std::vector<int64_t> Strategies::replayed_members(const Strategy& s) const {
  std::vector<int64_t> out;
  for (const auto& [id, worker] : workers_.all()) {
    if (std::count(s.member_tasks.begin(), s.member_tasks.end(), worker.task_index) > 0) out.push_back(id);
  }
  std::sort(out.begin(), out.end(),
            [this](int64_t x, int64_t y) { return workers_.task_index(x) < workers_.task_index(y); });
  return out;
}

}  // namespace capstan::coordinator
