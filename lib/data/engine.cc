#include "data/engine.h"

#include <thread>

#include "data/definition.h"
#include "data/iterator_state.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/ops/csv.h"
#include "data/ops/example.h"
#include "data/service_reader.h"
#include "data/tensor_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {

namespace {

Result<CsvSpec> read_csv_spec(wire::CsvSpec::Reader in) {
  CsvSpec spec;
  for (auto t : in.getRecordDefaults()) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor tensor, rpc::read_tensor_inline(t));
    spec.record_defaults.push_back(std::move(tensor));
  }
  spec.field_delim = in.getFieldDelim().cStr();
  spec.use_quote_delim = in.getUseQuoteDelim();
  spec.na_value = in.getNaValue().cStr();
  for (int64_t c : in.getSelectCols()) spec.select_cols.push_back(c);
  spec.trim_whitespace = in.getTrimWhitespace();
  return spec;
}

Result<FeatureSpec> read_feature_spec(capnp::List<wire::Feature>::Reader in) {
  FeatureSpec spec;
  for (auto f : in) {
    DType dtype = rpc::from_wire(f.getDtype());
    if (f.isVarLen()) {
      spec[f.getKey().cStr()] = VarLenFeature{dtype};
      continue;
    }
    FixedLenFeature fixed;
    fixed.dtype = dtype;
    for (int64_t d : f.getFixedLen().getShape()) fixed.shape.push_back(d);
    if (f.getFixedLen().getHasDefault()) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor value, rpc::read_tensor_inline(f.getFixedLen().getDefaultValue()));
      fixed.default_value = std::move(value);
    }
    spec[f.getKey().cStr()] = std::move(fixed);
  }
  return spec;
}

Status check_first_component_string(const Element& e, const char* what) {
  if (e.components.empty() || e.components[0].dtype() != DType::kString) {
    return Status::InvalidArgument(std::string(what) + " expects a string tensor as component 0");
  }
  return Status::Ok();
}

}  // namespace

// ---- Pipeline -------------------------------------------------------------------

Pipeline::Pipeline(std::shared_ptr<const Dataset::Impl> definition,
                   const FunctionRegistry* functions, std::vector<SplitProvider*> splits)
    : definition_(std::move(definition)),
      functions_(functions),
      deterministic_(definition_->def().getOptions().getDeterministic()),
      cpu_budget_([this]() {
        int budget = definition_->def().getOptions().getAutotuneCpuBudget();
        return budget > 0 ? budget : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      }()),
      autotuner_(definition_->def().getOptions().getAutotune(), cpu_budget_, [this]() {
        int64_t budget = definition_->def().getOptions().getAutotuneRamBudget();
        return budget > 0 ? budget : physical_memory() / 2;
      }()),
      memory_([this]() {
        int64_t budget = definition_->def().getOptions().getMemoryBudget();
        return budget > 0 ? budget : physical_memory() / 2;
      }()) {
  if (splits.empty()) return;
  auto sources = split_sources(definition_->root());
  for (size_t i = 0; i < sources.size() && i < splits.size(); ++i) splits_[op_key(sources[i])] = splits[i];
}

Pipeline::~Pipeline() = default;

namespace {

// The ops of the root definition, depth first: the stable index a per-op
// state is saved under.
void index_ops(wire::Op::Reader op, std::vector<const void*>& keys) {
  keys.push_back(op_key(op));
  if (op.hasInput()) index_ops(op.getInput(), keys);
  for (auto input : op.getInputs()) index_ops(input, keys);
}

}  // namespace

uint64_t Pipeline::fingerprint() const {
  // Canonical bytes: the same definition built in another process, or sent
  // over the wire, has the same fingerprint. Computed on save and restore
  // only: a from_tensors definition may be large.
  auto words = capnp::canonicalize(definition_->def());
  auto bytes = words.asBytes();
  return fingerprint_of(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
}

Result<std::string> Pipeline::save(IteratorBase& root) {
  StateWriter writer;
  // Threads paused by the iterators' saves stay paused until the per-op
  // states are written too, so the two agree.
  struct Resume {
    StateWriter& writer;
    ~Resume() { writer.resume(); }
  } resume{writer};
  CAPSTAN_RETURN_IF_ERROR(root.save(writer));
  std::vector<const void*> keys;
  index_ops(definition_->root(), keys);
  std::vector<std::pair<size_t, std::shared_ptr<PipelineState>>> states;
  {
    MutexLock lock(mutex_);
    for (auto& [key, state] : states_) {
      auto at = std::find(keys.begin(), keys.end(), key);
      if (at != keys.end()) states.emplace_back(static_cast<size_t>(at - keys.begin()), state);
    }
  }
  writer.begin("pipeline");
  writer.write_int(static_cast<int64_t>(states.size()));
  for (auto& [index, state] : states) {
    writer.write_int(static_cast<int64_t>(index));
    StateWriter nested;
    state->save(nested);
    writer.write_bytes(nested.body());
  }
  return writer.finish(fingerprint());
}

Status Pipeline::restore(IteratorBase& root, std::string_view state) {
  CAPSTAN_ASSIGN_OR_RETURN(StateReader reader, StateReader::open(state, fingerprint()));
  CAPSTAN_RETURN_IF_ERROR(root.restore(reader));
  std::vector<const void*> keys;
  index_ops(definition_->root(), keys);
  CAPSTAN_RETURN_IF_ERROR(reader.begin("pipeline"));
  int64_t count = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&count, 0, static_cast<int64_t>(keys.size()), "the number of op states"));
  for (int64_t i = 0; i < count; ++i) {
    int64_t index = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&index, 0, static_cast<int64_t>(keys.size()) - 1, "an op index"));
    std::string bytes;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bytes(&bytes));
    MutexLock lock(mutex_);
    auto found = states_.find(keys[static_cast<size_t>(index)]);
    if (found != states_.end()) {
      StateReader nested = StateReader::nested(bytes);
      CAPSTAN_RETURN_IF_ERROR(found->second->restore(nested));
      CAPSTAN_RETURN_IF_ERROR(nested.finish());
    } else {
      // Its op has no iterator yet (a repeat between epochs): the state is
      // made, and restored, when it gets one.
      pending_[keys[static_cast<size_t>(index)]] = std::move(bytes);
    }
  }
  return reader.finish();
}

Status Pipeline::restore_pending(const void* key, PipelineState& state) {
  auto found = pending_.find(key);
  if (found == pending_.end()) return Status::Ok();
  std::string bytes = std::move(found->second);
  pending_.erase(found);
  StateReader nested = StateReader::nested(bytes);
  CAPSTAN_RETURN_IF_ERROR(state.restore(nested));
  return nested.finish();
}

Status MemoryBudget::charge(int64_t bytes, std::string_view op) {
  int64_t before = used_.fetch_add(bytes, std::memory_order_relaxed);
  if (limit_ <= 0 || before + bytes <= limit_) return Status::Ok();
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  auto mib = [](int64_t b) { return std::to_string(b / (1 << 20)) + " MiB"; };
  return Status::ResourceExhausted(std::string(op) + ": holding " + std::to_string(bytes) +
                                   " more bytes would pass the pipeline's memory budget of " + mib(limit_) + " (" +
                                   mib(before) + " held by its buffers); use a smaller buffer or batch, or raise "
                                   "Options::memory_budget (a data worker's task_memory_mib)");
}

SplitProvider* Pipeline::splits_for(Op::Reader op) const {
  if (splits_.empty() || !definition_->contains(op_key(op))) return nullptr;
  auto it = splits_.find(op_key(op));
  return it == splits_.end() ? nullptr : it->second;
}

bool Pipeline::runs_on_splits(Op::Reader op) const {
  return !splits_.empty() && definition_->contains(op_key(op));
}

// ---- Functions ------------------------------------------------------------------

Result<MapFunction> resolve_map(wire::Fn::Reader fn, const FunctionRegistry* functions) {
  switch (fn.which()) {
    case wire::Fn::NAMED: {
      std::string name = fn.getNamed().cStr();
      const MapFunction* found = functions != nullptr ? functions->find_map(name) : nullptr;
      if (found == nullptr) return Status::NotFound("map function '" + name + "' is not registered");
      return *found;
    }
    case wire::Fn::DECODE_CSV: {
      CAPSTAN_ASSIGN_OR_RETURN(CsvSpec spec, read_csv_spec(fn.getDecodeCsv()));
      return MapFunction([spec = std::move(spec)](Element e) -> Result<Element> {
        CAPSTAN_RETURN_IF_ERROR(check_first_component_string(e, "decode_csv"));
        return decode_csv(e.components[0], spec);
      });
    }
    case wire::Fn::PARSE_EXAMPLE: {
      CAPSTAN_ASSIGN_OR_RETURN(FeatureSpec spec, read_feature_spec(fn.getParseExample()));
      return MapFunction([spec = std::move(spec)](Element e) -> Result<Element> {
        CAPSTAN_RETURN_IF_ERROR(check_first_component_string(e, "parse_example"));
        return parse_example(e.components[0], spec);
      });
    }
    case wire::Fn::CAST: {
      DType to = rpc::from_wire(fn.getCast());
      if (to == DType::kInvalid) return Status::InvalidArgument("cast: unknown dtype");
      return MapFunction([to](Element e) -> Result<Element> {
        for (auto& component : e.components) {
          CAPSTAN_ASSIGN_OR_RETURN(component, cast(component, to));
        }
        return e;
      });
    }
    case wire::Fn::TFRECORD_DATASET:
    case wire::Fn::TEXT_LINE_DATASET:
      return Status::InvalidArgument("a dataset function cannot be used with map");
  }
  return Status::InvalidArgument("unknown function kind");
}

Result<FilterFunction> resolve_filter(wire::Fn::Reader fn, const FunctionRegistry* functions) {
  if (!fn.isNamed()) return Status::InvalidArgument("filter takes a named function");
  std::string name = fn.getNamed().cStr();
  const FilterFunction* found = functions != nullptr ? functions->find_filter(name) : nullptr;
  if (found == nullptr) return Status::NotFound("filter function '" + name + "' is not registered");
  return *found;
}

Result<InterleaveFunction> resolve_interleave(wire::Fn::Reader fn,
                                              const FunctionRegistry* functions) {
  switch (fn.which()) {
    case wire::Fn::NAMED: {
      std::string name = fn.getNamed().cStr();
      const InterleaveFunction* found =
          functions != nullptr ? functions->find_interleave(name) : nullptr;
      if (found == nullptr) {
        return Status::NotFound("interleave function '" + name + "' is not registered");
      }
      return *found;
    }
    case wire::Fn::TFRECORD_DATASET:
    case wire::Fn::TEXT_LINE_DATASET: {
      bool tfrecord = fn.isTfrecordDataset();
      Compression compression =
          from_wire(tfrecord ? fn.getTfrecordDataset() : fn.getTextLineDataset());
      return InterleaveFunction([tfrecord, compression](const Element& e) -> Result<Dataset> {
        CAPSTAN_RETURN_IF_ERROR(check_first_component_string(e, "a file dataset function"));
        if (e.components[0].num_elements() != 1) {
          return Status::InvalidArgument("a file dataset function expects one file name, got " +
                                         std::to_string(e.components[0].num_elements()));
        }
        std::string file(e.components[0].string_at(0));
        return tfrecord ? tfrecord_definition({file}, compression, 0) : text_line_definition({file}, compression);
      });
    }
    default: return Status::InvalidArgument("interleave takes a named or dataset function");
  }
}

// ---- Validation and building: each op's kernel (op_kernel.h) ---------------------

namespace {

Result<const OpKernel*> kernel_of(Op::Reader op) {
  const OpKernel* kernel = find_op_kernel(op.which());
  if (kernel == nullptr) {
    return Status::InvalidArgument("dataset op with tag " + std::to_string(static_cast<unsigned>(op.which())) +
                                   " is unknown to this build of Capstan (a definition from a newer "
                                   "client, or a damaged one); rebuild the dataset with this version's API");
  }
  return kernel;
}

}  // namespace

Status validate(Op::Reader op, const FunctionRegistry* functions) {
  CAPSTAN_ASSIGN_OR_RETURN(const OpKernel* kernel, kernel_of(op));
  switch (kernel->inputs) {
    case OpKernel::Inputs::kNone: break;
    case OpKernel::Inputs::kOne:
      if (!op.hasInput()) return invalid_op(op, "has no input dataset");
      CAPSTAN_RETURN_IF_ERROR(validate(op.getInput(), functions));
      break;
    case OpKernel::Inputs::kMany:
      for (auto in : op.getInputs()) CAPSTAN_RETURN_IF_ERROR(validate(in, functions));
      break;
  }
  return kernel->validate != nullptr ? kernel->validate(op, functions) : Status::Ok();
}

Result<std::unique_ptr<IteratorBase>> make_iterator(Op::Reader op, Pipeline& pipeline) {
  CAPSTAN_ASSIGN_OR_RETURN(const OpKernel* kernel, kernel_of(op));
  if (SplitProvider* splits = pipeline.splits_for(op)) {
    if (kernel->file_source != nullptr) return kernel->file_source->read_splits(op, splits);
    if (kernel->read_splits != nullptr) return kernel->read_splits(op, splits);
  }
  return kernel->make(op, pipeline);
}

namespace {

// The public Iterator: owns the pipeline (declared first, destroyed last, so
// every iterator stops its threads before the shared state goes away).
class RootIterator final : public Iterator {
 public:
  RootIterator(std::unique_ptr<Pipeline> pipeline, std::unique_ptr<IteratorBase> root)
      : pipeline_(std::move(pipeline)), root_(std::move(root)) {}
  ~RootIterator() override { root_.reset(); }

  Result<std::optional<Element>> get_next() override {
    CAPSTAN_RETURN_IF_ERROR(broken_);
    started_ = true;
    Element element;
    bool end = false;
    CAPSTAN_RETURN_IF_ERROR(root_->get_next(&element, &end));
    if (end) return std::optional<Element>();
    return std::optional<Element>(std::move(element));
  }

  Result<std::string> save() override {
    CAPSTAN_RETURN_IF_ERROR(broken_);
    return pipeline_->save(*root_);
  }

  Status restore(std::string_view state) override {
    if (started_) {
      return Status::FailedPrecondition(
          "restore() must come before the first get_next(); make a new iterator of the dataset and restore "
          "into it");
    }
    started_ = true;
    Status restored;
    try {
      restored = pipeline_->restore(*root_, state);
    } catch (const kj::Exception& e) {
      restored = Status::InvalidArgument(std::string("restoring an iterator: ") + e.getDescription().cStr());
    }
    if (!restored.ok()) {
      broken_ = Status::FailedPrecondition("this iterator's restore failed (" + restored.message() +
                                           "); make a new iterator");
    }
    return restored;
  }

 private:
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<IteratorBase> root_;
  bool started_ = false;
  Status broken_;
};

}  // namespace

std::unique_ptr<Iterator> wrap_root(std::unique_ptr<Pipeline> pipeline,
                                    std::unique_ptr<IteratorBase> root) {
  return std::make_unique<RootIterator>(std::move(pipeline), std::move(root));
}

}  // namespace capstan::data::engine

namespace capstan::data::engine {

Result<std::vector<std::unique_ptr<SplitProvider>>> make_root_split_providers(const Dataset::Impl& definition,
                                                                             int64_t range_chunk) {
  if (range_chunk <= 0) {
    return Status::InvalidArgument("range_chunk must be positive, got " + std::to_string(range_chunk));
  }
  try {
    // Functions are not needed to split the sources: only argument errors count.
    Status valid = validate(definition.root(), nullptr);
    if (!valid.ok() && valid.code() != StatusCode::kNotFound) return valid;
    return make_split_providers(definition.root(), range_chunk);
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

Result<std::unique_ptr<SplitProvider>> make_root_split_provider(const Dataset::Impl& definition,
                                                                int64_t range_chunk) {
  CAPSTAN_ASSIGN_OR_RETURN(auto providers, make_root_split_providers(definition, range_chunk));
  if (providers.size() != 1) {
    std::string names;
    for (auto source : split_sources(definition.root())) {
      names += std::string(names.empty() ? "" : ", ") + op_name(source.which());
    }
    return Status::FailedPrecondition("the pipeline has " + std::to_string(providers.size()) + " sources (" + names +
                                      "), one split provider each: use make_split_providers()");
  }
  return std::move(providers[0]);
}

Result<std::unique_ptr<Iterator>> make_root_iterator(const std::shared_ptr<const Dataset::Impl>& definition,
                                                     const FunctionRegistry* functions,
                                                     std::vector<SplitProvider*> splits) {
  try {
    CAPSTAN_RETURN_IF_ERROR(validate(definition->root(), functions));
    if (!splits.empty()) {
      size_t sources = split_sources(definition->root()).size();
      if (splits.size() != sources) {
        return Status::InvalidArgument("the pipeline has " + std::to_string(sources) + " source(s) but " +
                                       std::to_string(splits.size()) +
                                       " split provider(s) were given; pass one per source "
                                       "(make_split_providers())");
      }
      for (SplitProvider* provider : splits) {
        if (provider == nullptr) return Status::InvalidArgument("a split provider is null");
      }
    }
    auto pipeline = std::make_unique<Pipeline>(definition, functions, std::move(splits));
    CAPSTAN_ASSIGN_OR_RETURN(auto root, make_iterator(definition->root(), *pipeline));
    return wrap_root(std::move(pipeline), std::move(root));
  } catch (const kj::Exception& e) {
    // A definition from elsewhere whose structure is damaged.
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

}  // namespace capstan::data::engine
