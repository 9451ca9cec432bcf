#include "daemons/ps_server/peer_snapshots.h"

#include <algorithm>
#include <set>
#include <utility>

namespace capstan::ps_server {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

TableConfig config_of(const EmbeddingTableSpec& spec) {
  return TableConfig{spec.dtype, spec.dim, spec.initializer, spec.optimizer, spec.options};
}

EmbeddingTableSpec spec_of(const std::string& name, const TableConfig& config) {
  EmbeddingTableSpec spec;
  spec.name = name;
  spec.dim = config.dim;
  spec.dtype = config.dtype;
  spec.initializer = config.initializer;
  spec.optimizer = config.optimizer;
  spec.options = config.options;
  return spec;
}

size_t rows_bytes(const TableRows& rows) {
  size_t n = rows.keys.byte_size() + rows.values.byte_size() + rows.meta.byte_size();
  for (const Tensor& s : rows.slots) n += s.byte_size();
  return n;
}

// A variable shard whole, its value and slots lent copy-on-write.
Result<std::pair<PeerVariable, int64_t>> variable_entry(const VariableStore& store, const std::string& name) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableStore::Snapshot snap, store.snapshot(name));
  PeerVariable v;
  v.name = name;
  v.value = std::move(snap.value);
  v.optimizer = snap.optimizer;
  v.slots = std::move(snap.slots);
  v.step = snap.step;
  return std::make_pair(std::move(v), snap.version);
}

Status install_variable(const PeerVariable& v, VariableStore& store) {
  auto info = store.info(v.name);
  if (info.ok() && (info->dtype != v.value.dtype() || info->shape != v.value.shape() ||
                    !(info->optimizer == v.optimizer))) {
    CAPSTAN_RETURN_IF_ERROR(store.remove(v.name));
    info = Status::NotFound("replaced");
  }
  if (info.ok()) {
    CAPSTAN_RETURN_IF_ERROR(store.assign(v.name, v.value));
  } else {
    CAPSTAN_RETURN_IF_ERROR(store.create(v.name, v.value, v.optimizer));
  }
  for (const auto& [slot, value] : v.slots) CAPSTAN_RETURN_IF_ERROR(store.set_slot(v.name, slot, value));
  return store.set_step(v.name, v.step);
}

Status install_table(const PeerTable& t, TableStore& tables) {
  const TableConfig config = config_of(t.spec);
  auto found = tables.find(t.name);
  if (found.ok() && !((*found)->config() == config)) {
    tables.remove(t.name);
    found = Status::NotFound("replaced");
  }
  bool replace = t.full;
  if (!found.ok()) {
    CAPSTAN_RETURN_IF_ERROR(tables.create(t.name, config));
    CAPSTAN_ASSIGN_OR_RETURN(found, tables.find(t.name));
    replace = true;
  }
  if (t.rows.keys.dtype() == DType::kInvalid) {  // no rows at all
    if (replace) (*found)->clear();
  } else {
    CAPSTAN_RETURN_IF_ERROR((*found)->import_rows(t.rows, replace));
  }
  return (*found)->set_step(t.step);
}

}  // namespace

size_t delta_bytes(const PeerDelta& delta) {
  size_t n = 0;
  for (const PeerVariable& v : delta.variables) {
    n += v.value.byte_size();
    for (const auto& [slot, value] : v.slots) n += value.byte_size();
  }
  for (const PeerTable& t : delta.tables) n += rows_bytes(t.rows);
  return n;
}

Status validate_delta(const PeerDelta& delta) {
  if (delta.source_task < 0) {
    return Status::InvalidArgument("peer snapshot: source task " + std::to_string(delta.source_task) +
                                   " must be >= 0 (the parameter server's task index in --ps)");
  }
  if (delta.base_sequence < 0 || delta.sequence <= delta.base_sequence) {
    return Status::InvalidArgument("peer snapshot from ps:" + std::to_string(delta.source_task) + ": base sequence " +
                                   std::to_string(delta.base_sequence) + " and sequence " +
                                   std::to_string(delta.sequence) +
                                   " must satisfy 0 <= base < sequence (base 0 for a full copy)");
  }
  std::set<std::string> names;
  auto add_name = [&](const std::string& name) -> Status {
    if (name.empty()) return Status::InvalidArgument("peer snapshot: a shard name is empty; name every shard");
    if (!names.insert(name).second) {
      return Status::InvalidArgument("peer snapshot: shard " + quoted(name) +
                                     " appears twice; list each shard once (variables, tables and removed together)");
    }
    return Status::Ok();
  };
  for (const PeerVariable& v : delta.variables) {
    CAPSTAN_RETURN_IF_ERROR(add_name(v.name));
    CAPSTAN_RETURN_IF_ERROR(v.value.validate().with_context("peer snapshot variable " + quoted(v.name)));
    if (v.step < 0) {
      return Status::InvalidArgument("peer snapshot: step " + std::to_string(v.step) + " of " + quoted(v.name) +
                                     " must be >= 0");
    }
    for (const auto& [slot, value] : v.slots) {
      CAPSTAN_RETURN_IF_ERROR(value.validate().with_context("peer snapshot slot " + quoted(slot) + " of " +
                                                            quoted(v.name)));
    }
  }
  for (const PeerTable& t : delta.tables) {
    CAPSTAN_RETURN_IF_ERROR(add_name(t.name));
    CAPSTAN_RETURN_IF_ERROR(validate_table_config(config_of(t.spec)).with_context("peer snapshot table " +
                                                                                   quoted(t.name)));
    if (t.step < 0) {
      return Status::InvalidArgument("peer snapshot: step " + std::to_string(t.step) + " of table " +
                                     quoted(t.name) + " must be >= 0");
    }
  }
  for (const std::string& name : delta.removed) CAPSTAN_RETURN_IF_ERROR(add_name(name));
  return Status::Ok();
}

Status install(const PeerDelta& delta, VariableStore& variables, TableStore& tables) {
  for (const PeerVariable& v : delta.variables) {
    CAPSTAN_RETURN_IF_ERROR(install_variable(v, variables).with_context("installing " + quoted(v.name)));
  }
  for (const PeerTable& t : delta.tables) {
    CAPSTAN_RETURN_IF_ERROR(install_table(t, tables).with_context("installing table " + quoted(t.name)));
  }
  for (const std::string& name : delta.removed) {
    (void)variables.remove(name);  // NotFound: not held, nothing to drop
    tables.remove(name);
  }
  return Status::Ok();
}

// ---- PeerSource

Result<PeerDelta> PeerSource::next(int32_t source_task, int64_t now_ms) {
  MutexLock lock(mu_);
  Marks marks;
  marks.sequence = ++last_sequence_;
  const bool full = acknowledged_.sequence == 0;
  PeerDelta delta;
  delta.source_task = source_task;
  delta.base_sequence = acknowledged_.sequence;
  delta.sequence = marks.sequence;
  delta.taken_ms = now_ms;
  for (const std::string& name : variables_.names()) {
    auto entry = variable_entry(variables_, name);
    if (entry.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
    CAPSTAN_RETURN_IF_ERROR(entry.status());
    marks.variables[name] = entry->second;
    auto sent = acknowledged_.variables.find(name);
    if (full || sent == acknowledged_.variables.end() || sent->second != entry->second) {
      delta.variables.push_back(std::move(entry->first));
    }
  }
  for (const auto& [name, table] : tables_.list()) {
    int64_t since = 0;
    auto sent = acknowledged_.tables.find(name);
    const bool same_table = sent != acknowledged_.tables.end() && sent->second.first.lock() == table;
    if (!full && same_table) since = sent->second.second;
    // Mark, then export: a change from now on is tagged above `version`, so
    // the next delta (since `version`) sends it.
    CAPSTAN_ASSIGN_OR_RETURN(EmbeddingTable::Snapshot snap, table->snapshot(since, /*mark=*/1));
    marks.tables[name] = {table, snap.version};
    // Sent even without changed rows: the step may have moved (updates of
    // absent keys), and it is small.
    PeerTable t;
    t.name = name;
    t.spec = spec_of(name, table->config());
    t.full = since == 0;
    t.rows = std::move(snap.rows);
    t.step = snap.step;
    delta.tables.push_back(std::move(t));
  }
  if (!full) {
    auto gone = [&](const std::string& name) {
      if (marks.variables.count(name) == 0 && marks.tables.count(name) == 0) delta.removed.push_back(name);
    };
    for (const auto& entry : acknowledged_.variables) gone(entry.first);
    for (const auto& entry : acknowledged_.tables) gone(entry.first);
  }
  pending_ = std::move(marks);
  return delta;
}

Status PeerSource::acknowledge(int64_t sequence) {
  MutexLock lock(mu_);
  if (!pending_.has_value() || pending_->sequence != sequence) {
    return Status::FailedPrecondition("peer snapshot: acknowledged sequence " + std::to_string(sequence) +
                                      " is not the latest sent (" +
                                      (pending_.has_value() ? std::to_string(pending_->sequence) : "none") + ")");
  }
  acknowledged_ = std::move(*pending_);
  pending_.reset();
  return Status::Ok();
}

void PeerSource::reset() {
  MutexLock lock(mu_);
  acknowledged_ = Marks{};
  pending_.reset();
}

int64_t PeerSource::acknowledged_sequence() const {
  MutexLock lock(mu_);
  return acknowledged_.sequence;
}

// ---- PeerCopies

size_t PeerCopies::Copy::bytes() const { return variables->total_bytes() + tables->total_bytes(); }

Status PeerCopies::apply(const PeerDelta& delta) {
  CAPSTAN_RETURN_IF_ERROR(validate_delta(delta));
  const std::string from = "peer snapshot " + std::to_string(delta.sequence) + " from ps:" +
                           std::to_string(delta.source_task);
  MutexLock lock(mu_);
  auto it = copies_.find(delta.source_task);
  const bool full = delta.base_sequence == 0;
  if (!full) {
    if (it == copies_.end()) {
      return Status::FailedPrecondition(from + " builds on sequence " + std::to_string(delta.base_sequence) +
                                        " but no copy is held: send a full one");
    }
    if (it->second.sequence != delta.base_sequence) {
      return Status::FailedPrecondition(from + " builds on sequence " + std::to_string(delta.base_sequence) +
                                        " but the copy held is at " + std::to_string(it->second.sequence) +
                                        ": send a full one");
    }
  }
  if (it == copies_.end() && copies_.size() >= kMaxCopies) {
    return Status::ResourceExhausted(from + ": this server already holds copies of " + std::to_string(kMaxCopies) +
                                     " servers; each should hold its one buddy's");
  }
  size_t others = 0;
  for (const auto& [task, copy] : copies_) {
    if (task != delta.source_task) others += copy.bytes();
  }
  const size_t mine = (it == copies_.end() || full) ? 0 : it->second.bytes();
  const size_t incoming = delta_bytes(delta);
  if (others + mine + incoming > max_bytes_) {
    if (it != copies_.end()) copies_.erase(it);
    return Status::ResourceExhausted(from + ": " + std::to_string(incoming) + " bytes on top of " +
                                     std::to_string(others + mine) + " held would pass the limit of " +
                                     std::to_string(max_bytes_) + " bytes for peer copies; the copy is dropped");
  }
  if (full) {
    if (it != copies_.end()) copies_.erase(it);
    it = copies_.try_emplace(delta.source_task).first;
  }
  Status applied = install(delta, *it->second.variables, *it->second.tables);
  if (!applied.ok()) {
    copies_.erase(it);
    return applied.with_context(from + " (the copy is dropped)");
  }
  it->second.sequence = delta.sequence;
  it->second.taken_ms = delta.taken_ms;
  return Status::Ok();
}

std::optional<PeerCopies::Held> PeerCopies::held(int32_t source_task) const {
  MutexLock lock(mu_);
  auto it = copies_.find(source_task);
  if (it == copies_.end()) return std::nullopt;
  Held out;
  out.sequence = it->second.sequence;
  out.taken_ms = it->second.taken_ms;
  out.bytes = it->second.bytes();
  out.shards = it->second.variables->names();
  for (const auto& [name, table] : it->second.tables->list()) out.shards.push_back(name);
  std::sort(out.shards.begin(), out.shards.end());
  return out;
}

Result<PeerDelta> PeerCopies::read(int32_t source_task, const std::vector<std::string>& names) const {
  MutexLock lock(mu_);
  auto it = copies_.find(source_task);
  if (it == copies_.end()) {
    return Status::NotFound("no peer copy of ps:" + std::to_string(source_task) + " on this parameter server");
  }
  const Copy& copy = it->second;
  std::vector<std::string> wanted = names;
  if (wanted.empty()) {
    wanted = copy.variables->names();
    for (const auto& [name, table] : copy.tables->list()) wanted.push_back(name);
  }
  PeerDelta out;
  out.source_task = source_task;
  out.base_sequence = 0;
  out.sequence = copy.sequence;
  out.taken_ms = copy.taken_ms;
  for (const std::string& name : wanted) {
    auto entry = variable_entry(*copy.variables, name);
    if (entry.ok()) {
      out.variables.push_back(std::move(entry->first));
      continue;
    }
    auto table = copy.tables->find(name);
    if (!table.ok()) {
      return Status::NotFound("the peer copy of ps:" + std::to_string(source_task) + " (sequence " +
                              std::to_string(copy.sequence) + ") has no shard " + quoted(name));
    }
    PeerTable t;
    t.name = name;
    t.spec = spec_of(name, (*table)->config());
    t.full = true;
    CAPSTAN_ASSIGN_OR_RETURN(t.rows, (*table)->export_rows(0));
    t.step = (*table)->step();
    out.tables.push_back(std::move(t));
  }
  return out;
}

void PeerCopies::drop(int32_t source_task) {
  MutexLock lock(mu_);
  copies_.erase(source_task);
}

size_t PeerCopies::total_bytes() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [task, copy] : copies_) n += copy.bytes();
  return n;
}

}  // namespace capstan::ps_server
