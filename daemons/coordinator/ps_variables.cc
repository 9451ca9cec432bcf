#include "daemons/coordinator/ps_variables.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "async/pool.h"
#include "checkpoint/checkpoint.h"
#include "data/tensor_util.h"

namespace capstan::coordinator {
namespace {

// The first error among `statuses`, or OK.
kj::Promise<Status> first_error(kj::Array<kj::Promise<Status>> statuses) {
  return kj::joinPromises(kj::mv(statuses)).then([](kj::Array<Status> results) {
    for (auto& status : results) {
      if (!status.ok()) return status;
    }
    return Status::Ok();
  });
}

}  // namespace

PsVariables::PsVariables(ParameterServers& ps, const PsHealth& health, boost::asio::thread_pool& pool,
                         std::shared_ptr<spdlog::logger> log, std::string work_dir, Journal journal)
    : ps_(ps),
      health_(health),
      pool_(pool),
      log_(std::move(log)),
      work_dir_(std::move(work_dir)),
      journal_(std::move(journal)),
      placer_(std::max(ps.size(), 1)) {}

VariableLocation PsVariables::location(const PlacedVariable& variable) const {
  VariableLocation out = variable;
  for (ShardLocation& s : out.shards) s.ps_address = ps_.address(s.ps_task);
  return out;
}

Result<PlacedVariable> PsVariables::place(const std::string& name, DType dtype, const Shape& shape,
                                          const placement::Partitioner& partitioner) {
  CAPSTAN_ASSIGN_OR_RETURN(auto placed, placer_.place(name, shape, dtype, partitioner));
  PlacedVariable variable;
  variable.name = name;
  variable.dtype = dtype;
  variable.shape = shape;
  for (const placement::ShardPlacement& p : placed) variable.shards.push_back(p);  // without its shape
  return variable;
}

kj::Promise<Result<VariableLocation>> PsVariables::create(VariableRequest request) {
  using Placed = Result<VariableLocation>;
  const std::string name = request.name;
  const bool given = request.initial.valid();
  const DType dtype = given ? request.initial.dtype() : request.dtype;
  const Shape shape = given ? request.initial.shape() : request.shape;
  auto existing = variables_.find(name);
  if (existing != variables_.end()) {
    // A reconnecting program creates its variables again: hand back the
    // ones that exist (their values stay on the parameter servers).
    const PlacedVariable& v = existing->second;
    if (v.table) {
      return Placed(Status::AlreadyExists("createVariable: '" + name + "' is an embedding table"));
    }
    if (v.dtype != dtype || v.shape != shape) {
      return Placed(Status::AlreadyExists("variable '" + name + "' exists as " + std::string(dtype_name(v.dtype)) +
                                          shape_string(v.shape) + ", not " + std::string(dtype_name(dtype)) +
                                          shape_string(shape)));
    }
    return Placed(location(v));
  }
  auto variable = place(name, dtype, shape, request.partitioner);
  if (!variable.ok()) return Placed(variable.status().with_context("createVariable '" + name + "'"));
  variable->optimizer = std::move(request.optimizer);
  if (!given) {
    variable->initializer = request.value_from_program ? Initializer::zeros() : request.initializer;
    variable->awaiting_value = request.value_from_program;
  }
  return create_shards(std::move(*variable), std::move(request.initial)).then([this, name](Status status) -> Placed {
    CAPSTAN_RETURN_IF_ERROR(status);
    return location(variables_.at(name));
  });
}

Status PsVariables::written(const std::string& name) {
  auto it = variables_.find(name);
  if (it == variables_.end() || it->second.table) {
    return Status::NotFound("variableWritten: no variable '" + name + "'");
  }
  if (!it->second.awaiting_value) return Status::Ok();
  PlacedVariable updated = it->second;
  updated.awaiting_value = false;
  CAPSTAN_RETURN_IF_ERROR(journal_(updated));
  it->second.awaiting_value = false;
  return Status::Ok();
}

bool PsVariables::awaiting_value(const std::string& name) const {
  auto it = variables_.find(name);
  return it != variables_.end() && it->second.awaiting_value;
}

PlacedVariable PsVariables::place_table(EmbeddingTableSpec spec) const {
  PlacedVariable variable;
  variable.name = spec.name;
  variable.dtype = spec.dtype;
  variable.shape = {0, spec.dim};
  variable.optimizer = spec.optimizer;
  for (int task = 0; task < ps_.size(); ++task) {
    variable.shards.push_back({checkpoint::shard_name(spec.name, static_cast<size_t>(task)), task, 0, 0});
  }
  variable.table = std::move(spec);
  return variable;
}

kj::Promise<Result<VariableLocation>> PsVariables::create_table(EmbeddingTableSpec spec) {
  using Placed = Result<VariableLocation>;
  const std::string name = spec.name;
  if (spec.dim < 1 || spec.dim > (int64_t{1} << 16)) {
    return Placed(Status::InvalidArgument("createEmbeddingTable '" + name + "': dim " + std::to_string(spec.dim) +
                                          " must be in [1, 65536]"));
  }
  auto existing = variables_.find(name);
  if (existing != variables_.end()) {
    const PlacedVariable& v = existing->second;
    if (!v.table) {
      return Placed(Status::AlreadyExists("createEmbeddingTable: '" + name + "' is a variable " +
                                          std::string(dtype_name(v.dtype)) + shape_string(v.shape) +
                                          ", not an embedding table"));
    }
    if (!(*v.table == spec)) {
      return Placed(Status::AlreadyExists("embedding table '" + name + "' exists with another spec (dtype " +
                                          std::string(dtype_name(v.table->dtype)) + ", dim " +
                                          std::to_string(v.table->dim) + ", optimizer " +
                                          optimizer_name(v.table->optimizer.kind) +
                                          "); create it with the same spec, or use another name"));
    }
    return Placed(location(v));
  }
  return create_shards(place_table(std::move(spec)), Tensor()).then([this, name](Status status) -> Placed {
    CAPSTAN_RETURN_IF_ERROR(status.with_context("createEmbeddingTable '" + name + "'"));
    return location(variables_.at(name));
  });
}

kj::Promise<Status> PsVariables::create_absent(const checkpoint::Manifest& manifest,
                                               const std::function<bool(const std::string&)>& skip) {
  auto creates = kj::Vector<kj::Promise<Status>>();
  for (const auto& saved : manifest.variables) {
    if (variables_.count(saved.name) != 0 || skip(saved.name)) continue;
    if (saved.table) {
      if (ps_.size() == 0) {
        return Status::FailedPrecondition("the checkpoint has embedding table '" + saved.name +
                                          "' but the coordinator has no parameter servers (set --ps or a 'ps' job)");
      }
      creates.add(create_shards(place_table({saved.name, saved.table->dim, saved.dtype, saved.table->initializer,
                                             saved.optimizer, saved.table->options}),
                                Tensor()));
      continue;
    }
    placement::Partitioner partitioner =
        saved.shape.empty() ? placement::Partitioner::none()
                            : placement::Partitioner::fixed_shards(static_cast<int64_t>(saved.shards.size()));
    auto variable = place(saved.name, saved.dtype, saved.shape, partitioner);
    if (!variable.ok()) return variable.status();
    variable->optimizer = saved.optimizer;
    // Zeros, made by the parameter servers (the restore writes the values).
    variable->initializer = Initializer::zeros();
    creates.add(create_shards(std::move(*variable), Tensor()));
  }
  return first_error(creates.releaseAsArray());
}

kj::Promise<Status> PsVariables::create_shards(PlacedVariable variable, Tensor initial) {
  auto creates = kj::heapArrayBuilder<kj::Promise<Status>>(variable.shards.size());
  for (const auto& shard : variable.shards) {
    if (variable.table) {
      creates.add(ps_.create_table(shard.ps_task, shard.name, *variable.table));
      continue;
    }
    if (variable.initializer.kind != Initializer::Kind::kNone) {
      // Each shard computes its own rows of the whole variable.
      InitializedShard rows{variable.initializer, variable.dtype, variable.shape, shard.first_row, shard.rows};
      if (variable.shape.empty()) rows.rows = 1;
      creates.add(ps_.create_initialized_shard(shard.ps_task, shard.name, std::move(rows), variable.optimizer));
      continue;
    }
    Tensor part = initial;
    if (initial.rank() > 0 && variable.shards.size() > 1) {
      auto slice = data::slice_rows(initial, shard.first_row, shard.first_row + shard.rows);
      if (!slice.ok()) return slice.status();
      part = *slice;
    }
    creates.add(ps_.create_shard(shard.ps_task, shard.name, std::move(part), variable.optimizer));
  }
  return first_error(creates.finish()).then([this, variable = std::move(variable)](Status status) mutable {
    if (!status.ok()) return status;
    CAPSTAN_RETURN_IF_ERROR(journal_(variable));
    ++version_;
    if (variable.table) {
      log_->info("embedding table '{}' {}[*, {}] placed on {} parameter server(s)", variable.name,
                 dtype_name(variable.dtype), variable.table->dim, variable.shards.size());
    } else {
      log_->info("variable '{}' {}{} placed in {} shard(s)", variable.name, dtype_name(variable.dtype),
                 shape_string(variable.shape), variable.shards.size());
    }
    std::string name = variable.name;
    variables_[name] = std::move(variable);
    return Status::Ok();
  });
}

void PsVariables::restore(PlacedVariable variable, int64_t placer_counter) {
  placer_.set_counter(std::max(placer_.counter(), placer_counter));
  ++version_;
  std::string name = variable.name;
  variables_[name] = std::move(variable);
}

Placements PsVariables::placements() const {
  Placements out;
  out.version = version_;
  for (const auto& [name, variable] : variables_) out.variables.push_back(location(variable));
  return out;
}

std::set<std::string> PsVariables::shards_on(int task) const {
  std::set<std::string> names;
  for (const auto& [name, variable] : variables_) {
    for (const auto& shard : variable.shards) {
      if (shard.ps_task == task) names.insert(shard.name);
    }
  }
  return names;
}

std::vector<VariableState> PsVariables::layout() const {
  std::vector<VariableState> states;
  for (const auto& [name, variable] : variables_) {
    VariableState state;
    state.name = name;
    state.dtype = variable.dtype;
    state.shape = variable.shape;
    state.optimizer = variable.optimizer;
    state.table = variable.table;
    state.table_shards = static_cast<int>(variable.shards.size());
    for (const auto& shard : variable.shards) {
      ShardState s;
      s.name = shard.name;
      s.ps_task = shard.ps_task;
      s.first_row = shard.first_row;
      s.rows = shard.rows;
      state.shards.push_back(std::move(s));
    }
    states.push_back(std::move(state));
  }
  return states;
}

kj::Promise<Result<std::vector<VariableState>>> PsVariables::snapshot() {
  using States = Result<std::vector<VariableState>>;
  Status up = health_.status();
  if (!up.ok()) return States(up);
  auto states = std::make_shared<std::vector<VariableState>>(layout());
  auto reads = kj::Vector<kj::Promise<Status>>();
  for (size_t v = 0; v < states->size(); ++v) {
    if ((*states)[v].table) {
      reads.add(snapshot_table(states, v));
      continue;
    }
    for (size_t k = 0; k < (*states)[v].shards.size(); ++k) {
      const ShardState& shard = (*states)[v].shards[k];
      reads.add(ps_.read_shard(shard.ps_task, shard.name).then([states, v, k](Result<ShardContents> contents) {
        CAPSTAN_RETURN_IF_ERROR(contents.status());
        ShardState& s = (*states)[v].shards[k];
        s.value = std::move(contents->value);
        s.slots = std::move(contents->slots);
        s.step = contents->step;
        return Status::Ok();
      }));
    }
  }
  return first_error(reads.releaseAsArray()).then([states](Status status) -> States {
    CAPSTAN_RETURN_IF_ERROR(status);
    return std::move(*states);
  });
}

kj::Promise<Status> PsVariables::snapshot_table(std::shared_ptr<std::vector<VariableState>> states, size_t v) {
  // Two rounds: every shard's version, then the rows, with later changes
  // tagged above the highest version of any shard (the checkpoint's
  // generation), so that "changed since this checkpoint" is one comparison.
  auto versions = kj::Vector<kj::Promise<Result<TableContents>>>();
  for (const ShardState& shard : (*states)[v].shards) {
    versions.add(ps_.export_table(shard.ps_task, shard.name, INT64_MAX, 0));
  }
  return kj::joinPromises(versions.releaseAsArray())
      .then([this, states, v](kj::Array<Result<TableContents>> answers) -> kj::Promise<Status> {
        int64_t generation = 0;
        for (auto& a : answers) {
          if (!a.ok()) return a.status();
          generation = std::max(generation, a->version);
        }
        (*states)[v].generation = generation;
        auto reads = kj::Vector<kj::Promise<Status>>();
        for (size_t k = 0; k < (*states)[v].shards.size(); ++k) {
          const ShardState& shard = (*states)[v].shards[k];
          reads.add(ps_.export_table(shard.ps_task, shard.name, 0, generation + 1)
                        .then([states, v, k](Result<TableContents> contents) {
                          CAPSTAN_RETURN_IF_ERROR(contents.status());
                          ShardState& s = (*states)[v].shards[k];
                          s.table_rows = std::move(contents->rows);
                          s.step = contents->step;
                          s.version = contents->version;
                          return Status::Ok();
                        }));
        }
        return first_error(reads.releaseAsArray());
      });
}

kj::Promise<Status> PsVariables::write_shards(std::vector<VariableState> states) {
  auto writes = kj::Vector<kj::Promise<Status>>();
  for (auto& v : states) {
    for (auto& s : v.shards) {
      if (v.table) {
        writes.add(ps_.import_table(s.ps_task, s.name, TableContents{std::move(s.table_rows), s.step, s.version},
                                    /*clear=*/true));
        continue;
      }
      ShardContents contents;
      contents.value = std::move(s.value);
      contents.slots = std::move(s.slots);
      contents.step = s.step;
      writes.add(ps_.write_shard(s.ps_task, s.name, std::move(contents)));
    }
  }
  return first_error(writes.releaseAsArray());
}

kj::Promise<Status> PsVariables::recreate_missing(std::vector<VariableState>* states) {
  // What each task should hold, of `states`.
  std::map<int, std::vector<std::pair<const VariableState*, ShardState*>>> by_task;
  for (auto& v : *states) {
    for (auto& s : v.shards) by_task[s.ps_task].emplace_back(&v, &s);
  }
  auto steps = kj::Vector<kj::Promise<Status>>();
  for (auto& [task, shards] : by_task) {
    int t = task;
    steps.add(ps_.list_shards(t).then(
        [this, t, shards = std::move(shards)](Result<std::set<std::string>> held) -> kj::Promise<Status> {
          if (!held.ok()) return held.status();
          auto creates = kj::Vector<kj::Promise<Status>>();
          for (const auto& [v, s] : shards) {
            if (held->count(s->name) != 0) continue;
            if (v->table) {
              creates.add(ps_.create_table(t, s->name, *v->table));
              continue;
            }
            creates.add(ps_.create_shard(t, s->name, s->value, v->optimizer));
            // Sent with the create: write_shards sets only its slots and step.
            s->value = Tensor();
          }
          return first_error(creates.releaseAsArray());
        }));
  }
  return first_error(steps.releaseAsArray());
}

kj::Promise<Result<int64_t>> PsVariables::export_table(std::string name, std::string since, std::string path) {
  using Rows = Result<int64_t>;
  auto found = variables_.find(name);
  if (found == variables_.end() || !found->second.table) {
    return Rows(Status::NotFound("exportEmbeddingTable: no embedding table '" + name + "'"));
  }
  if (path.size() < 12 || path.compare(path.size() - 12, 12, ".safetensors") != 0) {
    return Rows(Status::InvalidArgument("exportEmbeddingTable: the output path '" + path +
                                        "' must name a .safetensors file"));
  }
  if (!work_dir_.empty() && std::filesystem::weakly_canonical(path).string().starts_with(
                                std::filesystem::weakly_canonical(work_dir_).string() + "/")) {
    return Rows(Status::InvalidArgument("exportEmbeddingTable: '" + path + "' is inside the coordinator's work_dir " +
                                        work_dir_ + "; write the export elsewhere"));
  }
  Status up = health_.status();
  if (!up.ok()) return Rows(up);
  PlacedVariable variable = found->second;
  kj::Promise<Result<int64_t>> generation = Result<int64_t>(int64_t{0});
  if (!since.empty()) {
    generation = async::run_on_pool(pool_, [since, name]() -> Result<int64_t> {
      CAPSTAN_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(since));
      CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(resolved));
      const auto* saved = reader->manifest().find_variable(name);
      if (saved == nullptr || !saved->table) {
        return Status::NotFound("checkpoint " + resolved + " has no embedding table '" + name +
                                "': export every row (no --since)");
      }
      return saved->table->generation;
    });
  }
  return generation.then([this, variable = std::move(variable), path = std::move(path)](
                             Result<int64_t> since_version) mutable -> kj::Promise<Rows> {
    if (!since_version.ok()) return Rows(since_version.status());
    return export_rows(std::move(variable), *since_version, std::move(path));
  });
}

kj::Promise<Result<int64_t>> PsVariables::export_rows(PlacedVariable variable, int64_t since_version,
                                                      std::string path) {
  using Rows = Result<int64_t>;
  auto exports = kj::Vector<kj::Promise<Result<TableContents>>>();
  for (const ShardLocation& shard : variable.shards) {
    exports.add(ps_.export_table(shard.ps_task, shard.name, since_version, 0));
  }
  return kj::joinPromises(exports.releaseAsArray())
      .then([this, variable = std::move(variable),
             path = std::move(path)](kj::Array<Result<TableContents>> answers) -> kj::Promise<Rows> {
        VariableState state;
        state.name = variable.name;
        state.dtype = variable.dtype;
        state.table = variable.table;
        for (size_t k = 0; k < answers.size(); ++k) {
          if (!answers[k].ok()) return Rows(answers[k].status());
          ShardState s;
          s.name = variable.shards[k].name;
          s.table_rows = std::move(answers[k]->rows);
          state.shards.push_back(std::move(s));
        }
        return async::run_on_pool(pool_,
                                  [state = std::move(state), path]() { return write_table_export(state, path); });
      });
}

}  // namespace capstan::coordinator
