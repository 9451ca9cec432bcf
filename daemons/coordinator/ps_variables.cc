#include "daemons/coordinator/ps_variables.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "async/pool.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_files.h"
#include "training/optimizer.h"
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

Result<std::vector<PlacedVariable>> PsVariables::place_absent(const checkpoint::Manifest& manifest,
                                                             const std::function<bool(const std::string&)>& skip) {
  std::vector<PlacedVariable> placed;
  for (const auto& saved : manifest.variables) {
    if (variables_.count(saved.name) != 0 || skip(saved.name)) continue;
    if (saved.table) {
      if (ps_.size() == 0) {
        return Status::FailedPrecondition("the checkpoint has embedding table '" + saved.name +
                                          "' but the coordinator has no parameter servers (set --ps or a 'ps' job)");
      }
      placed.push_back(place_table({saved.name, saved.table->dim, saved.dtype, saved.table->initializer,
                                    saved.optimizer, saved.table->options}));
      continue;
    }
    placement::Partitioner partitioner =
        saved.shape.empty() ? placement::Partitioner::none()
                            : placement::Partitioner::fixed_shards(static_cast<int64_t>(saved.shards.size()));
    CAPSTAN_ASSIGN_OR_RETURN(PlacedVariable variable, place(saved.name, saved.dtype, saved.shape, partitioner));
    variable.optimizer = saved.optimizer;
    placed.push_back(std::move(variable));
  }
  return placed;
}

Status PsVariables::record(PlacedVariable variable) {
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
    return record(std::move(variable));
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

VariableState PsVariables::layout_of(const PlacedVariable& variable) {
  VariableState state;
  state.name = variable.name;
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
  return state;
}

std::vector<VariableState> PsVariables::layout() const {
  std::vector<VariableState> states;
  for (const auto& [name, variable] : variables_) states.push_back(layout_of(variable));
  return states;
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

// ---- Checkpoints the parameter servers write and read themselves

kj::Promise<Result<PsVariables::ServerSave>> PsVariables::begin_save(std::string directory) {
  using Out = Result<ServerSave>;
  Status up = health_.status();
  if (!up.ok()) return Out(up);
  // Tables first: every shard's version, so that each is marked above the
  // highest: the checkpoint's generation, so that "changed since this
  // checkpoint" is one comparison.
  auto tables = std::make_shared<std::map<std::string, int64_t>>();  // table -> generation
  auto versions = kj::Vector<kj::Promise<Status>>();
  for (const auto& [name, variable] : variables_) {
    if (!variable.table) continue;
    for (const ShardLocation& shard : variable.shards) {
      versions.add(ps_.export_table(shard.ps_task, shard.name, INT64_MAX, 0)
                       .then([tables, name = name](Result<TableContents> answer) -> Status {
                         CAPSTAN_RETURN_IF_ERROR(answer.status());
                         int64_t& g = (*tables)[name];
                         g = std::max(g, answer->version);
                         return Status::Ok();
                       }));
    }
  }
  return first_error(versions.releaseAsArray())
      .then([this, tables, directory = std::move(directory)](Status status) -> kj::Promise<Out> {
        if (!status.ok()) return Out(status);
        std::map<int, std::vector<ps::SaveItem>> by_task;
        for (const auto& [name, variable] : variables_) {
          for (const ShardLocation& shard : variable.shards) {
            ps::SaveItem item{shard.name, variable.table.has_value(), 0};
            if (variable.table) item.begin_version = (*tables)[name] + 1;
            by_task[shard.ps_task].push_back(std::move(item));
          }
        }
        auto answers = std::make_shared<std::map<int, ParameterServers::SaveStarted>>();
        auto begun = kj::Vector<kj::Promise<Status>>();
        for (auto& [task, items] : by_task) {
          begun.add(ps_.begin_save(task, directory, checkpoint::ps_file_name(task), std::move(items))
                        .then([answers, task = task](Result<ParameterServers::SaveStarted> started) -> Status {
                          CAPSTAN_RETURN_IF_ERROR(started.status().with_context("parameter server ps:" +
                                                                                std::to_string(task)));
                          (*answers)[task] = std::move(*started);
                          return Status::Ok();
                        }));
        }
        return kj::joinPromises(begun.releaseAsArray())
            .then([this, tables, answers](kj::Array<Status> results) -> kj::Promise<Out> {
              ServerSave save;
              for (const auto& [task, started] : *answers) save.saves.emplace_back(task, started.save_id);
              for (auto& result : results) {
                if (result.ok()) continue;
                // The servers that did start are let finish first: nothing
                // writes into the .tmp directory once the failed save drops it.
                Status failed = result;
                return finish_save(save).then([failed](auto) -> Out { return failed; });
              }
              std::map<std::string, const ps::SavedShard*> saved;
              for (const auto& [task, started] : *answers) {
                for (const auto& shard : started.shards) saved[shard.name] = &shard;
              }
              for (const auto& [name, variable] : variables_) {
                auto entry = manifest_entry(variable, saved, variable.table ? (*tables)[name] : 0);
                if (!entry.ok()) {
                  Status failed = entry.status();
                  return finish_save(save).then([failed](auto) -> Out { return failed; });
                }
                save.variables.push_back(std::move(*entry));
              }
              return Out(std::move(save));
            });
      });
}

Result<checkpoint::ManifestVariable> PsVariables::manifest_entry(
    const PlacedVariable& variable, const std::map<std::string, const ps::SavedShard*>& saved, int64_t generation) {
  checkpoint::ManifestVariable mv;
  mv.name = variable.name;
  mv.dtype = variable.dtype;
  mv.shape = variable.shape;
  mv.optimizer = variable.optimizer;
  int64_t first_row = 0;
  for (const ShardLocation& shard : variable.shards) {
    auto found = saved.find(shard.name);
    if (found == saved.end()) return Status::Internal("no snapshot of shard '" + shard.name + "'");
    const ps::SavedShard& s = *found->second;
    const int64_t rows = variable.table ? (s.shape.empty() ? 0 : s.shape[0]) : shard.rows;
    Shape expect = variable.shape;
    if (variable.table) expect = {rows, variable.table->dim};
    if (!expect.empty() && !variable.table) expect[0] = rows;
    if (s.dtype != variable.dtype || s.shape != expect) {
      return Status::FailedPrecondition("parameter server ps:" + std::to_string(shard.ps_task) + " holds '" +
                                        shard.name + "' as " + std::string(dtype_name(s.dtype)) +
                                        shape_string(s.shape) + ", not " + std::string(dtype_name(variable.dtype)) +
                                        shape_string(expect));
    }
    mv.partitioning.push_back(rows);
    mv.shards.push_back({shard.name, checkpoint::ps_file_name(shard.ps_task), variable.table ? first_row : shard.first_row,
                         rows});
    first_row += rows;
    if (mv.shards.size() == 1) mv.slots = s.slots;
    mv.optimizer_step = std::max(mv.optimizer_step, s.step);
  }
  if (variable.table) {
    mv.shape = {first_row, variable.table->dim};
    mv.table = checkpoint::ManifestTable{variable.table->dim, variable.table->initializer, variable.table->options,
                                         generation};
  }
  return mv;
}

kj::Promise<Result<std::vector<checkpoint::ManifestFile>>> PsVariables::finish_save(const ServerSave& save) {
  using Files = Result<std::vector<checkpoint::ManifestFile>>;
  auto waits = kj::Vector<kj::Promise<Files>>();
  for (const auto& [task, id] : save.saves) {
    waits.add(ps_.finish_save(task, id).then([task = task](Result<checkpoint::ManifestFile> file) -> Files {
      CAPSTAN_RETURN_IF_ERROR(file.status().with_context("parameter server ps:" + std::to_string(task) +
                                                         " writing its checkpoint file"));
      file->name = checkpoint::ps_file_name(task);
      return std::vector<checkpoint::ManifestFile>{*file};
    }));
  }
  return kj::joinPromises(waits.releaseAsArray()).then([](kj::Array<Files> answers) -> Files {
    std::vector<checkpoint::ManifestFile> files;
    for (auto& a : answers) {
      CAPSTAN_RETURN_IF_ERROR(a.status());
      files.insert(files.end(), a->begin(), a->end());
    }
    return files;
  });
}

kj::Promise<Status> PsVariables::restore_from(std::string path, const std::vector<VariableState>& states) {
  std::map<int, std::vector<ps::RestoreItem>> by_task;
  for (const auto& v : states) {
    for (const auto& s : v.shards) {
      ps::RestoreItem item;
      item.name = s.name;
      item.variable = v.name;
      item.first_row = s.first_row;
      item.rows = s.rows;
      item.dtype = v.dtype;
      item.shape = v.shape;
      if (!item.shape.empty()) item.shape[0] = s.rows;
      item.optimizer = v.optimizer;
      if (v.table) {
        item.table = v.table;
        item.table_part = s.ps_task;
        item.table_parts = v.table_shards;
      }
      by_task[s.ps_task].push_back(std::move(item));
    }
  }
  auto restores = kj::Vector<kj::Promise<Status>>();
  for (auto& [task, items] : by_task) {
    restores.add(ps_.restore_shards(task, path, std::move(items)).then([task = task](Status status) {
      return status.with_context("parameter server ps:" + std::to_string(task) + " restoring its shards");
    }));
  }
  return first_error(restores.releaseAsArray());
}

}  // namespace capstan::coordinator
