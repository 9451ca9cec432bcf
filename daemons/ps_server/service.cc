#include "daemons/ps_server/service.h"

#include "async/status_exception.h"
#include "rpc/optimizer_codec.h"
#include "async/pool.h"
#include "rpc/tensor_codec.h"

#include <optional>

namespace capstan::ps_server {
namespace {

void check(const Status& status) { async::check(status); }

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// An update's learning-rate override: absent unless the caller set
// hasLearningRate (older callers never do). The store checks the value.
template <typename Params>
std::optional<double> learning_rate_of(Params params) {
  if (!params.getHasLearningRate()) return std::nullopt;
  return params.getLearningRate();
}

}  // namespace

PsService::PsService(daemon::DaemonContext& ctx)
    : NodeService(ctx), store_(std::make_shared<VariableStore>()) {
  using S = VariableStore::Stats;
  auto read = [stats = store_->stats()](const std::atomic<int64_t> S::*field) {
    return daemon::stat_reader(stats, field);
  };
  daemon::MetricsRegistry& m = ctx.metrics;
  m.callback_counter("capstan_ps_reads_total", "Whole-shard reads served.", read(&S::reads));
  m.callback_counter("capstan_ps_read_bytes_total", "Bytes of whole-shard reads served.", read(&S::read_bytes));
  m.callback_counter("capstan_ps_gathers_total", "Row gathers (embedding lookups) served.", read(&S::gathers));
  m.callback_counter("capstan_ps_gathered_rows_total", "Rows returned by gathers.", read(&S::gathered_rows));
  m.callback_counter("capstan_ps_gathered_bytes_total", "Bytes of rows returned by gathers.", read(&S::gathered_bytes));
  m.callback_counter("capstan_ps_dense_updates_total", "Dense updates applied (optimizer steps, assign, assign_add).",
                     read(&S::dense_updates));
  m.callback_counter("capstan_ps_sparse_updates_total", "Sparse (row) updates applied.", read(&S::sparse_updates));
  m.callback_counter("capstan_ps_updated_rows_total", "Rows named by sparse updates.", read(&S::updated_rows));
  m.callback_counter("capstan_ps_update_bytes_total", "Bytes of gradients and values received by updates.",
                     read(&S::update_bytes));
  using Plot = daemon::StatusBoard::Plot;
  ctx.status.plot("updates/s (dense + sparse)", Plot::kRate, [stats = store_->stats()]() {
    return static_cast<double>(stats->dense_updates.load() + stats->sparse_updates.load());
  });
  ctx.status.plot("rows gathered/s", Plot::kRate, read(&S::gathered_rows));
  ctx.status.plot("MB/s read + gathered", Plot::kRate, [stats = store_->stats()]() {
    return static_cast<double>(stats->read_bytes.load() + stats->gathered_bytes.load()) / 1e6;
  });
  ctx.status.plot("MB/s of updates received", Plot::kRate, [stats = store_->stats()]() {
    return static_cast<double>(stats->update_bytes.load()) / 1e6;
  });
  std::weak_ptr<VariableStore> store = store_;
  m.callback_gauge("capstan_ps_shards", "Variable shards held.", [store] {
    auto held = store.lock();
    return held ? static_cast<double>(held->names().size()) : 0.0;
  });
  m.callback_gauge("capstan_ps_shard_bytes", "Bytes of the shards' values and optimizer slots.", [store] {
    auto held = store.lock();
    return held ? static_cast<double>(held->total_bytes()) : 0.0;
  });
  add_table_metrics();
}

void PsService::add_table_metrics() {
  using S = EmbeddingTable::Stats;
  std::weak_ptr<TableStore> tables = tables_;
  daemon::MetricsRegistry& m = ctx_.metrics;
  auto sum = [tables](const std::atomic<int64_t> S::*field) {
    return [tables, field]() {
      auto held = tables.lock();
      return held ? static_cast<double>(held->total(field)) : 0.0;
    };
  };
  m.callback_gauge("capstan_ps_table_rows", "Rows held in embedding tables.", sum(&S::rows));
  m.callback_gauge("capstan_ps_table_bytes", "Bytes of embedding tables (rows, slots, metadata, indexes).", [tables] {
    auto held = tables.lock();
    return held ? static_cast<double>(held->total_bytes()) : 0.0;
  });
  m.callback_counter("capstan_ps_table_lookups_total", "Keys looked up in embedding tables.", sum(&S::lookups));
  m.callback_counter("capstan_ps_table_inserts_total", "Keys inserted into embedding tables.", sum(&S::inserted));
  m.callback_counter("capstan_ps_table_not_admitted_total",
                     "Lookups of keys not admitted yet (answered with the default row).", sum(&S::not_admitted));
  m.callback_counter("capstan_ps_table_evicted_ttl_total", "Rows evicted by time-to-live.", sum(&S::evicted_ttl));
  m.callback_counter("capstan_ps_table_evicted_capacity_total",
                     "Rows evicted to keep tables under max_rows or max_bytes.", sum(&S::evicted_capacity));
  m.callback_counter("capstan_ps_table_updated_rows_total", "Table rows updated by optimizer steps.",
                     sum(&S::updated_rows));
  m.callback_counter("capstan_ps_table_dropped_updates_total",
                     "Gradients for keys not in the table (not admitted, or evicted) that were dropped.",
                     sum(&S::dropped_updates));
  ctx_.status.plot("table rows", daemon::StatusBoard::Plot::kLevel, sum(&S::rows));
}

kj::Promise<void> PsService::createShard(CreateShardContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  auto decoded = rpc::optimizer_from_wire(params.getOptimizer());
  check(decoded.status().with_context("createShard '" + name + "'"));
  Optimizer optimizer = *decoded;
  if (optimizer.kind != Optimizer::Kind::kNone) {
    check(training::validate(optimizer).with_context("createShard '" + name + "'"));
  }
  if (params.hasInitializer()) {
    // The shard's rows are computed here (the store checks the initializer,
    // dtype and range, and computes nothing for a shard that exists).
    auto initializer = rpc::initializer_from_wire(params.getInitializer());
    check(initializer.status().with_context("createShard '" + name + "'"));
    DType dtype = rpc::from_wire(params.getDtype());
    Shape logical;
    for (int64_t d : params.getLogicalShape()) logical.push_back(d);
    int64_t first_row = params.getFirstRow();
    int64_t rows = params.getRows();
    auto store = store_;
    return async::run_on_pool(ctx_.pool, [store, name, init = *initializer, dtype, logical, first_row, rows,
                                          optimizer]() {
             return store->create_initialized(name, init, dtype, logical, first_row, rows, optimizer);
           })
        .then([](Status status) { check(status); });
  }
  return rpc::read_tensor(params.getInitial(), ctx_.codec)
      .then([this, name, optimizer](Tensor&& initial) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, optimizer, initial = std::move(initial)]() {
          return store->create(name, initial, optimizer);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::read(ReadContext context) {
  auto store = store_;
  std::string name = text(context.getParams().getName());
  rpc::CodecOptions codec = rpc::answer_codec(ctx_.codec, context.getParams().getInlineLimit());
  return async::run_on_pool(ctx_.pool, [store, name]() { return store->read(name); })
      .then([context, codec](Result<Tensor> value) mutable {
        check(value.status());
        rpc::write_tensor(context.getResults().initValue(), *value, codec);
      });
}

kj::Promise<void> PsService::gather(GatherContext context) {
  std::string name = text(context.getParams().getName());
  rpc::CodecOptions codec = rpc::answer_codec(ctx_.codec, context.getParams().getInlineLimit());
  return rpc::read_tensor(context.getParams().getIds(), ctx_.codec)
      .then([this, name](Tensor&& ids) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, ids = std::move(ids)]() {
          return store->gather(name, ids);
        });
      })
      .then([context, codec](Result<Tensor> rows) mutable {
        check(rows.status());
        rpc::write_tensor(context.getResults().initRows(), *rows, codec);
      });
}

kj::Promise<void> PsService::assign(AssignContext context) {
  std::string name = text(context.getParams().getName());
  return rpc::read_tensor(context.getParams().getValue(), ctx_.codec)
      .then([this, name](Tensor&& value) {
        auto store = store_;
        // The received tensor is nobody else's: the shard takes its buffer.
        return async::run_on_pool(ctx_.pool, [store, name, value = std::move(value)]() mutable {
          return store->assign_owned(name, std::move(value));
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::assignRows(AssignRowsContext context) {
  std::string name = text(context.getParams().getName());
  int64_t first_row = context.getParams().getFirstRow();
  return rpc::read_tensor(context.getParams().getRows(), ctx_.codec)
      .then([this, name, first_row](Tensor&& rows) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, first_row, rows = std::move(rows)]() {
          return store->assign_rows(name, first_row, rows);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::assignAdd(AssignAddContext context) {
  std::string name = text(context.getParams().getName());
  return rpc::read_tensor(context.getParams().getDelta(), ctx_.codec)
      .then([this, name](Tensor&& delta) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, delta = std::move(delta)]() {
          return store->assign_add(name, delta);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::applyDense(ApplyDenseContext context) {
  std::string name = text(context.getParams().getName());
  int64_t step = context.getParams().getStep();
  std::optional<double> rate = learning_rate_of(context.getParams());
  return rpc::read_tensor(context.getParams().getGradient(), ctx_.codec)
      .then([this, name, step, rate](Tensor&& gradient) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, step, rate, gradient = std::move(gradient)]() {
          return store->apply_dense(name, gradient, step, rate);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::applySparse(ApplySparseContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  int64_t step = params.getStep();
  std::optional<double> rate = learning_rate_of(params);
  auto ids = rpc::read_tensor(params.getIds(), ctx_.codec);
  auto rows = rpc::read_tensor(params.getRows(), ctx_.codec);
  return ids.then([rows = kj::mv(rows)](Tensor&& ids) mutable {
              return rows.then([ids = std::move(ids)](Tensor&& rows) mutable {
                return std::make_pair(std::move(ids), std::move(rows));
              });
            })
      .then([this, name, step, rate](std::pair<Tensor, Tensor>&& update) {
        auto store = store_;
        return async::run_on_pool(ctx_.pool, [store, name, step, rate, update = std::move(update)]() {
          return store->apply_sparse(name, update.first, update.second, step, rate);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::listShards(ListShardsContext context) {
  // Reading a shard's info waits for its update in progress: not on the loop.
  // Embedding tables are listed after the variables, as table shards.
  struct Listed {
    std::string name;
    VariableStore::Info info;
    bool table = false;
  };
  auto store = store_;
  auto tables = tables_;
  return async::run_on_pool(ctx_.pool, [store, tables]() -> Result<std::vector<Listed>> {
           std::vector<Listed> out;
           for (auto& [name, info] : store->list()) out.push_back({name, std::move(info), false});
           for (const auto& [name, table] : tables->list()) {
             const TableConfig& c = table->config();
             out.push_back({name,
                            {c.dtype, {table->stats().rows.load(), c.dim}, c.optimizer, table->step(), table->bytes()},
                            true});
           }
           return out;
         })
      .then([context](Result<std::vector<Listed>> listed) mutable {
        check(listed.status());
        auto shards = context.getResults().initShards(static_cast<unsigned>(listed->size()));
        for (unsigned i = 0; i < listed->size(); ++i) {
          const auto& [name, info, table] = (*listed)[i];
          auto out = shards[i];
          out.setName(name);
          out.setDtype(rpc::to_wire(info.dtype));
          auto shape = out.initShape(static_cast<unsigned>(info.shape.size()));
          for (unsigned d = 0; d < info.shape.size(); ++d) shape.set(d, info.shape[d]);
          rpc::optimizer_to_wire(info.optimizer, out.initOptimizer());
          out.setStep(info.step);
          out.setBytes(info.bytes);
          out.setTable(table);
        }
      });
}

kj::Promise<void> PsService::readSlots(ReadSlotsContext context) {
  auto store = store_;
  std::string name = text(context.getParams().getName());
  return async::run_on_pool(ctx_.pool, [store, name]() { return store->slots(name); })
      .then([this, context](Result<std::map<std::string, Tensor>> slots) mutable {
        check(slots.status());
        auto out = context.getResults().initSlots(static_cast<unsigned>(slots->size()));
        unsigned i = 0;
        for (const auto& [slot, tensor] : *slots) {
          out[i].setName(slot);
          rpc::write_tensor(out[i].initTensor(), tensor, ctx_.codec);
          ++i;
        }
      });
}

kj::Promise<void> PsService::setSlots(SetSlotsContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  int64_t step = params.getStep();
  auto names = std::make_shared<std::vector<std::string>>();
  auto reads = kj::heapArrayBuilder<kj::Promise<Tensor>>(params.getSlots().size());
  for (auto slot : params.getSlots()) {
    names->push_back(text(slot.getName()));
    reads.add(rpc::read_tensor(slot.getTensor(), ctx_.codec));
  }
  return kj::joinPromises(reads.finish())
      .then([this, name, step, names](kj::Array<Tensor>&& tensors) {
        auto store = store_;
        std::vector<Tensor> values(tensors.begin(), tensors.end());
        return async::run_on_pool(ctx_.pool, [store, name, step, names, values = std::move(values)]() {
          for (size_t i = 0; i < values.size(); ++i) {
            CAPSTAN_RETURN_IF_ERROR(store->set_slot(name, (*names)[i], values[i]));
          }
          return store->set_step(name, step);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::removeShard(RemoveShardContext context) {
  std::string name = text(context.getParams().getName());
  if (tables_->remove(name)) return kj::READY_NOW;
  check(store_->remove(name));
  return kj::READY_NOW;
}

// ---- Embedding tables

namespace {

TableConfig table_config(const EmbeddingTableSpec& spec) {
  return TableConfig{spec.dtype, spec.dim, spec.initializer, spec.optimizer, spec.options};
}

}  // namespace

kj::Promise<void> PsService::createTable(CreateTableContext context) {
  auto params = context.getParams();
  std::string name = text(params.getName());
  auto spec = rpc::table_from_wire(params.getConfig());
  check(spec.status().with_context("createTable '" + name + "'"));
  auto tables = tables_;
  return async::run_on_pool(ctx_.pool, [tables, name, config = table_config(*spec)]() {
           return tables->create(name, config);
         })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::lookupTable(LookupTableContext context) {
  auto params = context.getParams();
  auto table = tables_->find(text(params.getName()));
  check(table.status());
  bool insert = params.getInsert();
  rpc::CodecOptions codec = rpc::answer_codec(ctx_.codec, params.getInlineLimit());
  return rpc::read_tensor(params.getIds(), ctx_.codec)
      .then([this, table = *table, insert](Tensor&& ids) {
        return async::run_on_pool(ctx_.pool, [table, insert, ids = std::move(ids)]() {
          return table->lookup(ids, insert);
        });
      })
      .then([context, codec](Result<Tensor> rows) mutable {
        check(rows.status());
        rpc::write_tensor(context.getResults().initRows(), *rows, codec);
      });
}

kj::Promise<void> PsService::applyTable(ApplyTableContext context) {
  auto params = context.getParams();
  auto table = tables_->find(text(params.getName()));
  check(table.status());
  int64_t step = params.getStep();
  std::optional<double> rate = learning_rate_of(params);
  auto ids = rpc::read_tensor(params.getIds(), ctx_.codec);
  auto gradients = rpc::read_tensor(params.getGradients(), ctx_.codec);
  return ids.then([gradients = kj::mv(gradients)](Tensor&& ids) mutable {
              return gradients.then([ids = std::move(ids)](Tensor&& gradients) mutable {
                return std::make_pair(std::move(ids), std::move(gradients));
              });
            })
      .then([this, table = *table, step, rate](std::pair<Tensor, Tensor>&& update) {
        return async::run_on_pool(ctx_.pool, [table, step, rate, update = std::move(update)]() {
          return table->apply_gradients(update.first, update.second, step, rate);
        });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::exportTable(ExportTableContext context) {
  auto params = context.getParams();
  auto table = tables_->find(text(params.getName()));
  check(table.status());
  int64_t since = params.getSinceVersion();
  int64_t mark = params.getBeginVersion();
  using Snapshot = EmbeddingTable::Snapshot;
  return async::run_on_pool(ctx_.pool, [table = *table, since, mark]() { return table->snapshot(since, mark); })
      .then([this, context](Result<Snapshot> exported) mutable {
        check(exported.status());
        auto results = context.getResults();
        rpc::table_rows_to_wire(exported->rows, results.initRows(), ctx_.codec);
        results.setStep(exported->step);
        results.setVersion(exported->version);
      });
}

kj::Promise<void> PsService::importTable(ImportTableContext context) {
  auto params = context.getParams();
  auto table = tables_->find(text(params.getName()));
  check(table.status());
  bool clear = params.getClear();
  int64_t step = params.getStep();
  int64_t version = params.getVersion();
  return rpc::read_table_rows(params.getRows())
      .then([this, table = *table, clear, step, version](ps::TableRows&& rows) {
        return async::run_on_pool(ctx_.pool, [table, clear, step, version, rows = std::move(rows)]() {
          return table->restore(rows, clear, step, version);
        });
      })
      .then([](Status status) { check(status); });
}

// ---- Checkpoints written and read by this server (issue 34)

namespace {

Shape shape_of(capnp::List<int64_t>::Reader dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(d);
  return shape;
}

}  // namespace

kj::Promise<void> PsService::beginSave(BeginSaveContext context) {
  auto params = context.getParams();
  std::string directory = text(params.getDirectory());
  std::string file = text(params.getFile());
  if (!checkpoint::is_ps_file_name(file)) {
    check(Status::InvalidArgument("beginSave: the file '" + file + "' must be named ps-<task>.safetensors"));
  }
  std::vector<ShardCheckpoints::SaveItem> items;
  for (auto shard : params.getShards()) {
    items.push_back({text(shard.getName()), shard.getTable(), shard.getBeginVersion()});
  }
  auto checkpoints = checkpoints_;
  return async::run_on_pool(ctx_.pool, [checkpoints, items = std::move(items)]() { return checkpoints->snapshot(items); })
      .then([this, context, directory, file](Result<ShardCheckpoints::Snapshot> snapshot) mutable {
        check(snapshot.status());
        auto results = context.getResults();
        auto out = results.initShards(static_cast<unsigned>(snapshot->saved.size()));
        for (unsigned i = 0; i < out.size(); ++i) {
          const ShardCheckpoints::SavedShard& s = snapshot->saved[i];
          out[i].setName(s.name);
          out[i].setDtype(rpc::to_wire(s.dtype));
          auto shape = out[i].initShape(static_cast<unsigned>(s.shape.size()));
          for (unsigned d = 0; d < shape.size(); ++d) shape.set(d, s.shape[d]);
          auto slots = out[i].initSlots(static_cast<unsigned>(s.slots.size()));
          for (unsigned k = 0; k < slots.size(); ++k) slots.set(k, s.slots[k]);
          out[i].setStep(s.step);
          out[i].setVersion(s.version);
        }
        // The answer goes now; the file is written meanwhile.
        auto checkpoints = checkpoints_;
        auto written = async::run_on_pool(writer_, [checkpoints, snapshot = std::move(*snapshot), directory, file]() {
          return checkpoints->write(snapshot, directory, file);
        });
        const uint64_t id = next_save_++;
        saves_.emplace(id, written.fork());
        while (saves_.size() > kMaxPendingSaves) saves_.erase(saves_.begin());
        results.setSaveId(id);
      });
}

kj::Promise<void> PsService::finishSave(FinishSaveContext context) {
  const uint64_t id = context.getParams().getSaveId();
  auto found = saves_.find(id);
  if (found == saves_.end()) {
    check(Status::NotFound("finishSave: no save " + std::to_string(id) +
                           " on this parameter server (finished already, or it restarted since beginSave)"));
  }
  auto done = found->second.addBranch();
  saves_.erase(found);
  return done.then([context](Result<checkpoint::ManifestFile> file) mutable {
    check(file.status());
    context.getResults().setSize(file->size);
    context.getResults().setCrc32c(file->crc32c);
  });
}

kj::Promise<void> PsService::restoreShards(RestoreShardsContext context) {
  auto params = context.getParams();
  std::string path = text(params.getCheckpoint());
  std::vector<ShardCheckpoints::RestoreItem> items;
  for (auto shard : params.getShards()) {
    ShardCheckpoints::RestoreItem item;
    item.name = text(shard.getName());
    item.variable = text(shard.getVariable());
    const std::string what = "restoreShards '" + item.name + "'";
    if (item.name.empty() || item.variable.empty()) check(Status::InvalidArgument(what + ": a name is empty"));
    item.first_row = shard.getFirstRow();
    item.rows = shard.getRows();
    item.dtype = rpc::from_wire(shard.getDtype());
    item.shape = shape_of(shard.getShape());
    if (shard.getIsTable()) {
      auto spec = rpc::table_from_wire(shard.getTable());
      check(spec.status().with_context(what));
      check(validate_table_config(table_config(*spec)).with_context(what));
      item.table = std::move(*spec);
      item.table_part = shard.getTablePart();
      item.table_parts = shard.getTableParts();
    } else {
      auto optimizer = rpc::optimizer_from_wire(shard.getOptimizer());
      check(optimizer.status().with_context(what));
      item.optimizer = *optimizer;
      if (item.optimizer.kind != Optimizer::Kind::kNone) check(training::validate(item.optimizer).with_context(what));
    }
    items.push_back(std::move(item));
  }
  auto checkpoints = checkpoints_;
  return async::run_on_pool(ctx_.pool, [checkpoints, path, items = std::move(items)]() {
           return checkpoints->restore(path, items);
         })
      .then([](Status status) { check(status); });
}

// ---- Peer snapshots (issue 34 item 5)

namespace {

void peer_delta_to_wire(const PeerDelta& in, wire::PeerDelta::Builder out, const rpc::CodecOptions& codec) {
  out.setSourceTask(in.source_task);
  out.setBaseSequence(in.base_sequence);
  out.setSequence(in.sequence);
  out.setTakenMs(in.taken_ms);
  auto variables = out.initVariables(static_cast<unsigned>(in.variables.size()));
  for (unsigned i = 0; i < variables.size(); ++i) {
    const PeerVariable& v = in.variables[i];
    variables[i].setName(v.name);
    rpc::write_tensor(variables[i].initValue(), v.value, codec);
    rpc::optimizer_to_wire(v.optimizer, variables[i].initOptimizer());
    auto slots = variables[i].initSlots(static_cast<unsigned>(v.slots.size()));
    for (unsigned k = 0; k < slots.size(); ++k) {
      slots[k].setName(v.slots[k].first);
      rpc::write_tensor(slots[k].initTensor(), v.slots[k].second, codec);
    }
    variables[i].setStep(v.step);
  }
  auto tables = out.initTables(static_cast<unsigned>(in.tables.size()));
  for (unsigned i = 0; i < tables.size(); ++i) {
    const PeerTable& t = in.tables[i];
    tables[i].setName(t.name);
    rpc::table_to_wire(t.spec, tables[i].initConfig());
    tables[i].setFull(t.full);
    rpc::table_rows_to_wire(t.rows, tables[i].initRows(), codec);
    tables[i].setStep(t.step);
  }
  auto removed = out.initRemoved(static_cast<unsigned>(in.removed.size()));
  for (unsigned i = 0; i < removed.size(); ++i) removed.set(i, in.removed[i]);
}

// The delta `in` carries; throws InvalidArgument for an unknown optimizer
// or table optimizer. The tensors are read (pulled, when large) before it
// resolves: keep the message until then.
kj::Promise<PeerDelta> read_peer_delta(wire::PeerDelta::Reader in, const rpc::CodecOptions& codec) {
  auto delta = std::make_shared<PeerDelta>();
  delta->source_task = in.getSourceTask();
  delta->base_sequence = in.getBaseSequence();
  delta->sequence = in.getSequence();
  delta->taken_ms = in.getTakenMs();
  auto variables = in.getVariables();
  auto tables = in.getTables();
  size_t reads_count = tables.size();
  for (auto v : variables) reads_count += 1 + v.getSlots().size();
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(reads_count);
  delta->variables.resize(variables.size());
  for (unsigned i = 0; i < variables.size(); ++i) {
    auto v = variables[i];
    PeerVariable& out = delta->variables[i];
    out.name = text(v.getName());
    auto optimizer = rpc::optimizer_from_wire(v.getOptimizer());
    check(optimizer.status().with_context("peer snapshot variable '" + out.name + "'"));
    out.optimizer = *optimizer;
    out.step = v.getStep();
    reads.add(rpc::read_tensor(v.getValue(), codec).then([delta, i](Tensor&& t) {
      delta->variables[i].value = std::move(t);
    }));
    auto slots = v.getSlots();
    out.slots.resize(slots.size());
    for (unsigned k = 0; k < slots.size(); ++k) {
      out.slots[k].first = text(slots[k].getName());
      reads.add(rpc::read_tensor(slots[k].getTensor(), codec).then([delta, i, k](Tensor&& t) {
        delta->variables[i].slots[k].second = std::move(t);
      }));
    }
  }
  delta->tables.resize(tables.size());
  for (unsigned i = 0; i < tables.size(); ++i) {
    auto t = tables[i];
    PeerTable& out = delta->tables[i];
    out.name = text(t.getName());
    auto spec = rpc::table_from_wire(t.getConfig());
    check(spec.status().with_context("peer snapshot table '" + out.name + "'"));
    out.spec = std::move(*spec);
    out.full = t.getFull();
    out.step = t.getStep();
    reads.add(rpc::read_table_rows(t.getRows()).then([delta, i](ps::TableRows&& rows) {
      delta->tables[i].rows = std::move(rows);
    }));
  }
  for (auto name : in.getRemoved()) delta->removed.push_back(text(name));
  return kj::joinPromises(reads.finish()).then([delta]() { return std::move(*delta); });
}

// What restoreFromPeer answers.
struct Installed {
  int64_t sequence = 0;
  int64_t taken_ms = 0;
  uint32_t shards = 0;
};

void check_source_task(const char* call, int32_t task) {
  if (task < 0) {
    check(Status::InvalidArgument(std::string(call) + ": source task " + std::to_string(task) +
                                  " must be >= 0 (the parameter server's index in --ps)"));
  }
}

void check_address(const char* call, const std::string& address) {
  std::string host;
  uint16_t port = 0;
  check(rpc::parse_host_port(address, &host, &port)
            .with_context(std::string(call) + ": holder '" + address + "' must be a parameter server's host:port"));
}

// Shard names from the wire: none empty, at most kMaxShardNames.
std::vector<std::string> shard_names(const char* call, capnp::List<capnp::Text>::Reader list) {
  constexpr size_t kMaxShardNames = 1 << 20;
  if (list.size() > kMaxShardNames) {
    check(Status::InvalidArgument(std::string(call) + ": " + std::to_string(list.size()) +
                                  " shard names; at most " + std::to_string(kMaxShardNames)));
  }
  std::vector<std::string> names;
  for (auto name : list) {
    names.push_back(text(name));
    if (names.back().empty()) check(Status::InvalidArgument(std::string(call) + ": a shard name is empty"));
  }
  return names;
}

}  // namespace

kj::Promise<wire::ParameterServer::Client> PsService::peer(const std::string& address) {
  auto it = peer_links_.find(address);
  if (it == peer_links_.end()) {
    if (peer_links_.size() >= kMaxPeerLinks) peer_links_.erase(peer_links_.begin());
    it = peer_links_
             .emplace(address, kj::heap<rpc::Connection>(ctx_.loop->io(), ctx_.loop->timer(), address,
                                                         ctx_.peer_options))
             .first;
  }
  // A holder that is down fails the call soon: the coordinator tries again
  // at the next interval.
  return it->second->service<wire::ParameterServer>(ctx_.loop->timer().now() + 5 * kj::SECONDS);
}

kj::Promise<void> PsService::sendPeerSnapshot(SendPeerSnapshotContext context) {
  auto params = context.getParams();
  std::string holder = text(params.getHolder());
  const int32_t task = params.getSourceTask();
  check_address("sendPeerSnapshot", holder);
  check_source_task("sendPeerSnapshot", task);
  if (sending_) {
    check(Status::Unavailable("sendPeerSnapshot: a peer snapshot is being sent already; call again after it"));
  }
  if (params.getFull() || holder != holder_) peer_source_->reset();
  holder_ = holder;
  sending_ = true;
  auto source = peer_source_;
  const int64_t now_ms = EmbeddingTable::system_clock_ms();
  return async::run_on_pool(ctx_.pool, [source, task, now_ms]() { return source->next(task, now_ms); })
      .then([this, holder](Result<PeerDelta> taken) {
        check(taken.status());
        auto delta = std::make_shared<PeerDelta>(std::move(*taken));
        return peer(holder).then([this, delta](wire::ParameterServer::Client client) {
          auto request = client.holdPeerSnapshotRequest();
          peer_delta_to_wire(*delta, request.initDelta(), ctx_.codec);
          return request.send().ignoreResult().then([delta]() { return delta; });
        });
      })
      .then(
          [this, context](std::shared_ptr<PeerDelta> sent) mutable {
            sending_ = false;
            check(peer_source_->acknowledge(sent->sequence));
            auto results = context.getResults();
            results.setSequence(sent->sequence);
            results.setFull(sent->base_sequence == 0);
            results.setShards(static_cast<uint32_t>(sent->variables.size() + sent->tables.size()));
            results.setBytes(delta_bytes(*sent));
          },
          [this](kj::Exception&& e) {
            // The holder may have part of it, or nothing: start again full.
            sending_ = false;
            peer_source_->reset();
            kj::throwFatalException(kj::mv(e));
          });
}

kj::Promise<void> PsService::holdPeerSnapshot(HoldPeerSnapshotContext context) {
  auto copies = peer_copies_;
  return read_peer_delta(context.getParams().getDelta(), ctx_.codec)
      .then([this, copies](PeerDelta&& delta) {
        return async::run_on_pool(ctx_.pool, [copies, delta = std::move(delta)]() { return copies->apply(delta); });
      })
      .then([](Status status) { check(status); });
}

kj::Promise<void> PsService::readPeerCopy(ReadPeerCopyContext context) {
  auto params = context.getParams();
  const int32_t task = params.getSourceTask();
  check_source_task("readPeerCopy", task);
  std::vector<std::string> names = shard_names("readPeerCopy", params.getShards());
  auto copies = peer_copies_;
  return async::run_on_pool(ctx_.pool, [copies, task, names = std::move(names)]() { return copies->read(task, names); })
      .then([this, context](Result<PeerDelta> copy) mutable {
        check(copy.status());
        peer_delta_to_wire(*copy, context.getResults().initDelta(), ctx_.codec);
      });
}

kj::Promise<void> PsService::restoreFromPeer(RestoreFromPeerContext context) {
  auto params = context.getParams();
  std::string holder = text(params.getHolder());
  const int32_t task = params.getSourceTask();
  check_address("restoreFromPeer", holder);
  check_source_task("restoreFromPeer", task);
  std::vector<std::string> names = shard_names("restoreFromPeer", params.getShards());
  return peer(holder)
      .then([task, names](wire::ParameterServer::Client client) {
        auto request = client.readPeerCopyRequest();
        request.setSourceTask(task);
        auto list = request.initShards(static_cast<unsigned>(names.size()));
        for (unsigned i = 0; i < list.size(); ++i) list.set(i, names[i]);
        return request.send();
      })
      .then([this](capnp::Response<wire::ParameterServer::ReadPeerCopyResults>&& response) {
        auto delta = read_peer_delta(response.getDelta(), ctx_.codec);
        return delta.attach(kj::mv(response));
      })
      .then([this, task, holder](PeerDelta&& copy) {
        if (copy.source_task != task) {
          check(Status::DataLoss("restoreFromPeer: the holder " + holder + " answered a copy of ps:" +
                                 std::to_string(copy.source_task) + " for ps:" + std::to_string(task)));
        }
        check(validate_delta(copy).with_context("restoreFromPeer: the copy held at " + holder));
        auto store = store_;
        auto tables = tables_;
        return async::run_on_pool(ctx_.pool, [store, tables, copy = std::move(copy)]() -> Result<Installed> {
          CAPSTAN_RETURN_IF_ERROR(install(copy, *store, *tables));
          return Installed{copy.sequence, copy.taken_ms,
                           static_cast<uint32_t>(copy.variables.size() + copy.tables.size())};
        });
      })
      .then([context](Result<Installed> installed) mutable {
        check(installed.status());
        auto results = context.getResults();
        results.setSequence(installed->sequence);
        results.setTakenMs(installed->taken_ms);
        results.setShards(installed->shards);
      });
}

}  // namespace capstan::ps_server
