#include "tools/evaluator/evaluator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "capstan/data/dataset.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/json.h"

namespace capstan::evaluator {
namespace {

// A closure's context over a checkpoint in memory.
class CheckpointContext final : public ClosureContext {
 public:
  CheckpointContext(const checkpoint::CheckpointReader& reader, data::Iterator* iterator)
      : reader_(reader), iterator_(iterator) {}

  int worker_index() const override { return 0; }
  int num_workers() const override { return 1; }
  int attempt() const override { return 1; }

  Result<Tensor> read(const std::string& variable) override {
    auto it = loaded_.find(variable);
    if (it != loaded_.end()) return it->second;
    if (reader_.manifest().find_variable(variable) == nullptr) {
      return Status::NotFound("the checkpoint " + reader_.path() + " has no variable '" + variable + "'");
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor value, reader_.read_variable(variable));
    loaded_[variable] = value;
    return value;
  }

  Result<Tensor> gather(const std::string& variable, const Tensor& ids) override {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor table, read(variable));
    if (table.rank() < 1 || table.dtype() == DType::kString) {
      return Status::InvalidArgument("gather: '" + variable + "' is " + std::string(dtype_name(table.dtype())) +
                                     shape_string(table.shape()) + ", not a numeric table of rank >= 1");
    }
    std::vector<int64_t> rows;
    if (ids.dtype() == DType::kInt64) {
      auto flat = ids.flat<int64_t>();
      rows.assign(flat.begin(), flat.end());
    } else if (ids.dtype() == DType::kInt32) {
      auto flat = ids.flat<int32_t>();
      rows.assign(flat.begin(), flat.end());
    } else {
      return Status::InvalidArgument("gather: ids must be int32 or int64, not " + std::string(dtype_name(ids.dtype())));
    }
    // As the parameter servers gather (VariableStore::gather): the ids'
    // shape, then the table's row shape.
    const int64_t table_rows = table.shape()[0];
    Shape shape = ids.shape();
    shape.insert(shape.end(), table.shape().begin() + 1, table.shape().end());
    CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(table.dtype(), shape));
    const size_t row_bytes = table_rows == 0 ? 0 : table.byte_size() / static_cast<size_t>(table_rows);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= table_rows) {
        return Status::InvalidArgument("gather: id " + std::to_string(rows[i]) + " is outside '" + variable +
                                       "' (" + std::to_string(table_rows) + " rows)");
      }
      std::memcpy(out.mutable_data() + i * row_bytes, table.data() + static_cast<size_t>(rows[i]) * row_bytes,
                  row_bytes);
    }
    return out;
  }

  Status assign(const std::string& variable, const Tensor&) override { return read_only(variable); }
  Status assign_add(const std::string& variable, const Tensor&) override { return read_only(variable); }
  Status apply_gradients(const std::string& variable, const Tensor&, const ApplyOptions& = {}) override {
    return read_only(variable);
  }
  Status apply_sparse_gradients(const std::string& variable, const Tensor&, const Tensor&,
                                const ApplyOptions& = {}) override {
    return read_only(variable);
  }

  // An embedding table from the checkpoint: evaluation never inserts, so
  // a key it lacks gets the default row whatever `insert` says.
  Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool /*insert*/) override {
    CAPSTAN_ASSIGN_OR_RETURN(const LoadedTable* loaded, load_table(table));
    std::vector<int64_t> keys;
    if (ids.dtype() == DType::kInt64) {
      keys.assign(ids.flat<int64_t>().begin(), ids.flat<int64_t>().end());
    } else if (ids.dtype() == DType::kInt32) {
      keys.assign(ids.flat<int32_t>().begin(), ids.flat<int32_t>().end());
    } else {
      return Status::InvalidArgument("lookup: ids must be int32 or int64, not " + std::string(dtype_name(ids.dtype())));
    }
    Shape shape = ids.shape();
    shape.push_back(loaded->dim);
    CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(loaded->values.dtype(), shape));
    const size_t row_bytes = static_cast<size_t>(loaded->dim) * dtype_size(loaded->values.dtype());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto found = loaded->rows.find(keys[i]);
      const std::byte* from = found == loaded->rows.end() ? loaded->default_row.data()
                                                          : loaded->values.data() + found->second * row_bytes;
      std::memcpy(out.mutable_data() + i * row_bytes, from, row_bytes);
    }
    return out;
  }

  Result<data::Iterator*> iterator(const Tensor&) override {
    if (iterator_ == nullptr) {
      return Status::FailedPrecondition("the closure asks for an iterator: give the evaluator --dataset-function");
    }
    return iterator_;
  }

 private:
  static Status read_only(const std::string& variable) {
    return Status::FailedPrecondition("the evaluator does not update variables ('" + variable +
                                      "'): give it an evaluation closure, not a training step");
  }

  struct LoadedTable {
    int64_t dim = 0;
    Tensor values;                              // [rows, dim], every shard's
    std::unordered_map<int64_t, size_t> rows;   // key -> row of values
    std::vector<std::byte> default_row;
  };
  Result<const LoadedTable*> load_table(const std::string& name) {
    auto it = tables_.find(name);
    if (it != tables_.end()) return &it->second;
    const checkpoint::ManifestVariable* saved = reader_.manifest().find_variable(name);
    if (saved == nullptr || !saved->table) {
      return Status::NotFound("the checkpoint " + reader_.path() + " has no embedding table '" + name + "'");
    }
    LoadedTable t;
    t.dim = saved->table->dim;
    CAPSTAN_ASSIGN_OR_RETURN(t.values, reader_.read_variable(name));  // the shards' values, in order
    for (const auto& shard : saved->shards) {
      CAPSTAN_ASSIGN_OR_RETURN(const checkpoint::SafetensorsReader* file, reader_.file(shard.file));
      CAPSTAN_ASSIGN_OR_RETURN(Tensor keys, file->read(checkpoint::table_keys_tensor_name(shard.name)));
      if (keys.dtype() != DType::kInt64 || keys.num_elements() != shard.rows) {
        return Status::DataLoss("checkpoint " + reader_.path() + ": the keys of '" + shard.name + "' are " +
                                keys.debug_string(0) + ", not int64[" + std::to_string(shard.rows) + "]");
      }
      auto flat = keys.flat<int64_t>();
      for (int64_t i = 0; i < shard.rows; ++i) t.rows[flat[static_cast<size_t>(i)]] = static_cast<size_t>(shard.first_row + i);
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor fill, constant_initializer(saved->dtype, {t.dim}, saved->table->options.default_value));
    t.default_row.assign(fill.data(), fill.data() + fill.byte_size());
    return &tables_.emplace(name, std::move(t)).first->second;
  }

  const checkpoint::CheckpointReader& reader_;
  data::Iterator* const iterator_;
  std::map<std::string, Tensor> loaded_;
  std::map<std::string, LoadedTable> tables_;
};

// What the closures' results add up to.
class Accumulator {
 public:
  Status add(const Element& result) {
    int probabilities = -1, labels = -1;
    for (size_t i = 0; i < result.size(); ++i) {
      std::string name = i < result.names.size() ? result.names[i] : "";
      if (name == "probabilities") probabilities = static_cast<int>(i);
      if (name == "labels") labels = static_cast<int>(i);
    }
    if ((probabilities < 0) != (labels < 0)) {
      return Status::InvalidArgument("the closure returns '" + std::string(probabilities < 0 ? "labels" : "probabilities") +
                                     "' without '" + std::string(probabilities < 0 ? "probabilities" : "labels") + "'");
    }
    if (probabilities >= 0) {
      CAPSTAN_ASSIGN_OR_RETURN(auto p, as_doubles(result.components[static_cast<size_t>(probabilities)]));
      CAPSTAN_ASSIGN_OR_RETURN(auto y, as_doubles(result.components[static_cast<size_t>(labels)]));
      if (p.size() != y.size()) {
        return Status::InvalidArgument("the closure returns " + std::to_string(p.size()) + " probabilities but " +
                                       std::to_string(y.size()) + " labels");
      }
      probabilities_.insert(probabilities_.end(), p.begin(), p.end());
      labels_.insert(labels_.end(), y.begin(), y.end());
    }
    for (size_t i = 0; i < result.size(); ++i) {
      if (static_cast<int>(i) == probabilities || static_cast<int>(i) == labels) continue;
      const Tensor& t = result.components[i];
      if (t.num_elements() != 1 || t.dtype() == DType::kString) continue;  // not a scalar metric
      std::string name = i < result.names.size() && !result.names[i].empty() ? result.names[i]
                                                                             : "value_" + std::to_string(i);
      CAPSTAN_ASSIGN_OR_RETURN(auto v, as_doubles(t));
      auto it = std::find_if(sums_.begin(), sums_.end(), [&](const auto& s) { return s.first == name; });
      if (it == sums_.end()) {
        sums_.emplace_back(name, v[0]);
      } else {
        it->second += v[0];
      }
    }
    return Status::Ok();
  }

  std::vector<std::pair<std::string, double>> metrics() const {
    std::vector<std::pair<std::string, double>> out;
    if (!labels_.empty()) {
      const size_t n = labels_.size();
      double correct = 0, loss = 0;
      for (size_t i = 0; i < n; ++i) {
        bool positive = labels_[i] >= 0.5;
        correct += ((probabilities_[i] >= 0.5) == positive) ? 1 : 0;
        double p = std::clamp(probabilities_[i], 1e-7, 1 - 1e-7);
        loss -= positive ? std::log(p) : std::log(1 - p);
      }
      out.emplace_back("accuracy", correct / static_cast<double>(n));
      out.emplace_back("auc", auc());
      out.emplace_back("log_loss", loss / static_cast<double>(n));
      out.emplace_back("examples", static_cast<double>(n));
    }
    out.insert(out.end(), sums_.begin(), sums_.end());
    return out;
  }

 private:
  static Result<std::vector<double>> as_doubles(const Tensor& t) {
    std::vector<double> out;
    switch (t.dtype()) {
      case DType::kFloat32: for (float v : t.flat<float>()) out.push_back(v); break;
      case DType::kFloat64: for (double v : t.flat<double>()) out.push_back(v); break;
      case DType::kInt32: for (int32_t v : t.flat<int32_t>()) out.push_back(v); break;
      case DType::kInt64: for (int64_t v : t.flat<int64_t>()) out.push_back(static_cast<double>(v)); break;
      default:
        return Status::InvalidArgument("a metric must be float32, float64, int32 or int64, not " +
                                       std::string(dtype_name(t.dtype())));
    }
    return out;
  }

  // The area under the ROC curve: the probability that a positive scores
  // above a negative (Mann-Whitney), ties counted half.
  double auc() const {
    std::vector<size_t> order(labels_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probabilities_[a] < probabilities_[b]; });
    double positives = 0, rank_sum = 0;
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j < order.size() && probabilities_[order[j]] == probabilities_[order[i]]) ++j;
      double mean_rank = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2 + 1;
      for (size_t k = i; k < j; ++k) {
        if (labels_[order[k]] >= 0.5) {
          positives += 1;
          rank_sum += mean_rank;
        }
      }
      i = j;
    }
    double negatives = static_cast<double>(labels_.size()) - positives;
    if (positives == 0 || negatives == 0) return std::nan("");
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
  }

  std::vector<double> probabilities_, labels_;
  std::vector<std::pair<std::string, double>> sums_;
};

}  // namespace

Result<Metrics> evaluate_checkpoint(const FunctionRegistry& functions, const std::string& checkpoint_path,
                                    const EvaluatorOptions& options) {
  const ClosureFunction* closure = functions.find_closure(options.closure);
  if (closure == nullptr) {
    std::string names;
    for (const auto& n : functions.closure_names()) names += (names.empty() ? "" : ", ") + n;
    return Status::NotFound("no closure named '" + options.closure + "' in the modules (they have: " +
                            (names.empty() ? "none" : names) + ")");
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(checkpoint_path));
  std::unique_ptr<data::Iterator> iterator;
  if (!options.dataset_function.empty()) {
    const DatasetFunction* make = functions.find_dataset_function(options.dataset_function);
    if (make == nullptr) {
      return Status::NotFound("no dataset function named '" + options.dataset_function + "' in the modules");
    }
    InputContext input;
    input.num_input_pipelines = 1;
    input.input_pipeline_id = 0;
    CAPSTAN_ASSIGN_OR_RETURN(data::Dataset dataset, (*make)(input));
    CAPSTAN_ASSIGN_OR_RETURN(iterator, dataset.make_iterator(&functions));
  }
  CheckpointContext context(*reader, iterator.get());
  Accumulator accumulator;
  Metrics metrics;
  metrics.checkpoint = checkpoint_path;
  metrics.step = reader->manifest().step;
  for (int64_t call = 0; options.steps <= 0 || call < options.steps; ++call) {
    Result<Element> result = (*closure)(context, options.args);
    if (!result.ok() && result.status().code() == StatusCode::kOutOfRange && iterator != nullptr) break;
    CAPSTAN_RETURN_IF_ERROR(result.status().with_context("closure '" + options.closure + "'"));
    CAPSTAN_RETURN_IF_ERROR(accumulator.add(*result).with_context("closure '" + options.closure + "'"));
    ++metrics.calls;
    if (iterator == nullptr && options.steps <= 0) break;  // no end to wait for
  }
  metrics.values = accumulator.metrics();
  return metrics;
}

std::string metrics_json(const Metrics& metrics) {
  std::string out = "{\"checkpoint\":" + checkpoint::json_quote(metrics.checkpoint) +
                    ",\"step\":" + std::to_string(metrics.step);
  for (const auto& [name, value] : metrics.values) {
    out += "," + checkpoint::json_quote(name) + ":";
    if (std::isfinite(value)) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.17g", value);
      out += buf;
    } else {
      out += "null";
    }
  }
  return out + "}";
}

}  // namespace capstan::evaluator
