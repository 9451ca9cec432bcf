#include "data/engine.h"

#include <thread>

#include "data/definition.h"
#include "data/ops.h"
#include "data/ops/csv.h"
#include "data/ops/example.h"
#include "data/service_reader.h"
#include "data/tensor_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;

Status invalid(Op::Reader op, const std::string& message) {
  return Status::InvalidArgument(std::string(op_name(op.which())) + ": " + message);
}

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> out;
  for (auto t : list) out.emplace_back(t.cStr(), t.size());
  return out;
}

bool resolve_deterministic(wire::Tri tri, const Pipeline& pipeline) {
  if (tri == wire::Tri::YES) return true;
  if (tri == wire::Tri::NO) return false;
  return pipeline.deterministic_default();
}

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
                   const FunctionRegistry* functions, SplitProvider* splits)
    : definition_(std::move(definition)),
      functions_(functions),
      splits_(splits),
      deterministic_(definition_->def().getOptions().getDeterministic()),
      cpu_budget_([this]() {
        int budget = definition_->def().getOptions().getAutotuneCpuBudget();
        return budget > 0 ? budget : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      }()),
      autotuner_(definition_->def().getOptions().getAutotune(), cpu_budget_, [this]() {
        int64_t budget = definition_->def().getOptions().getAutotuneRamBudget();
        return budget > 0 ? budget : physical_memory() / 2;
      }()) {}

Pipeline::~Pipeline() = default;

SplitProvider* Pipeline::splits_for(Op::Reader op) const {
  if (splits_ == nullptr || !definition_->contains(op_key(op))) return nullptr;
  return splits_;
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
        return tfrecord ? Dataset::tfrecord_dataset({file}, compression)
                        : Dataset::text_line_dataset({file}, compression);
      });
    }
    default: return Status::InvalidArgument("interleave takes a named or dataset function");
  }
}

// ---- Validation -------------------------------------------------------------------

Status validate(Op::Reader op, const FunctionRegistry* functions) {
  auto positive = [&op](int64_t value, const char* name) {
    return value > 0 ? Status::Ok()
                     : invalid(op, std::string(name) + " must be positive, got " + std::to_string(value));
  };
  auto count_ok = [&op](int64_t value, const char* name) {
    return value >= -1 ? Status::Ok()
                       : invalid(op, std::string(name) + " must be -1 or more, got " + std::to_string(value));
  };
  auto parallel_ok = [&op](int64_t value, const char* name) {
    return value >= 0 || value == kAutotune
               ? Status::Ok()
               : invalid(op, std::string(name) + " must be >= 0 or AUTOTUNE, got " + std::to_string(value));
  };
  auto with_op = [&op](Status s) { return s.ok() ? s : s.with_context(op_name(op.which())); };
  switch (op.which()) {
    case Op::RANGE:
      if (op.getRange().getStep() == 0) return invalid(op, "step must not be 0");
      return Status::Ok();
    case Op::FROM_TENSORS:
    case Op::FROM_TENSOR_SLICES:
      return Status::Ok();
    case Op::LIST_FILES:
      if (op.getListFiles().getPatterns().size() == 0) return invalid(op, "no file patterns given");
      return Status::Ok();
    case Op::TEXT_LINE: return Status::Ok();
    case Op::DATA_SERVICE: return service::validate_data_service(op);
    case Op::TF_RECORD: return parallel_ok(op.getTfRecord().getNumParallelReads(), "num_parallel_reads");
    case Op::FIXED_LENGTH: {
      auto f = op.getFixedLength();
      CAPSTAN_RETURN_IF_ERROR(positive(f.getRecordBytes(), "record_bytes"));
      if (f.getHeaderBytes() < 0 || f.getFooterBytes() < 0) {
        return invalid(op, "header_bytes and footer_bytes must not be negative");
      }
      return Status::Ok();
    }
    case Op::ZIP:
      if (op.getInputs().size() == 0) return invalid(op, "needs at least one dataset");
      for (auto in : op.getInputs()) CAPSTAN_RETURN_IF_ERROR(validate(in, functions));
      return Status::Ok();
    case Op::CONCATENATE:
      if (op.getInputs().size() != 2) return invalid(op, "needs two datasets");
      for (auto in : op.getInputs()) CAPSTAN_RETURN_IF_ERROR(validate(in, functions));
      return Status::Ok();
    default:
      break;
  }
  if (!op.hasInput()) return invalid(op, "has no input dataset");
  CAPSTAN_RETURN_IF_ERROR(validate(op.getInput(), functions));
  switch (op.which()) {
    case Op::MAP: {
      CAPSTAN_RETURN_IF_ERROR(parallel_ok(op.getMap().getNumParallelCalls(), "num_parallel_calls"));
      return with_op(resolve_map(op.getMap().getFn(), functions).status());
    }
    case Op::FILTER: return with_op(resolve_filter(op.getFilter().getFn(), functions).status());
    case Op::BATCH: return positive(op.getBatch().getBatchSize(), "batch_size");
    case Op::PADDED_BATCH: {
      auto p = op.getPaddedBatch();
      CAPSTAN_RETURN_IF_ERROR(positive(p.getBatchSize(), "batch_size"));
      if (p.getPaddingValues().size() != 0 && p.getPaddingValues().size() != p.getPaddedShapes().size()) {
        return invalid(op, std::to_string(p.getPaddingValues().size()) + " padding values for " +
                               std::to_string(p.getPaddedShapes().size()) + " padded shapes");
      }
      for (auto shape : p.getPaddedShapes()) {
        for (int64_t d : shape) {
          if (d < -1) return invalid(op, "padded dimension " + std::to_string(d) + " is invalid");
        }
      }
      for (auto value : p.getPaddingValues()) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor t, rpc::read_tensor_inline(value));
        if (t.rank() != 0) return invalid(op, "padding values must be scalars, got shape " + shape_string(t.shape()));
      }
      return Status::Ok();
    }
    case Op::SHUFFLE: return positive(op.getShuffle().getBufferSize(), "buffer_size");
    case Op::REPEAT: return count_ok(op.getRepeat().getCount(), "count");
    case Op::SHARD: {
      auto s = op.getShard();
      if (s.getNumShards() == kShardHint || s.getIndex() == kShardHint) {
        return Status::FailedPrecondition(
            "shard: SHARD_HINT is only filled in under the data service's HINT sharding "
            "(or Dataset::resolve_shard_hint)");
      }
      CAPSTAN_RETURN_IF_ERROR(positive(s.getNumShards(), "num_shards"));
      if (s.getIndex() < 0 || s.getIndex() >= s.getNumShards()) {
        return invalid(op, "index must be in [0, " + std::to_string(s.getNumShards()) + "), got " +
                               std::to_string(s.getIndex()));
      }
      return Status::Ok();
    }
    case Op::INTERLEAVE: {
      auto i = op.getInterleave();
      if (i.getCycleLength() != kAutotune) CAPSTAN_RETURN_IF_ERROR(positive(i.getCycleLength(), "cycle_length"));
      CAPSTAN_RETURN_IF_ERROR(positive(i.getBlockLength(), "block_length"));
      CAPSTAN_RETURN_IF_ERROR(parallel_ok(i.getNumParallelCalls(), "num_parallel_calls"));
      return with_op(resolve_interleave(i.getFn(), functions).status());
    }
    case Op::PREFETCH: return parallel_ok(op.getPrefetch().getBufferSize(), "buffer_size");
    case Op::TAKE: return count_ok(op.getTake().getCount(), "count");
    case Op::SKIP: return count_ok(op.getSkip().getCount(), "count");
    case Op::CACHE: return Status::Ok();
    case Op::REBATCH: return positive(op.getRebatch().getBatchSize(), "batch_size");
    default: return invalid(op, "unknown op");
  }
}

// ---- Building iterators ---------------------------------------------------------------

Result<std::unique_ptr<IteratorBase>> make_iterator(Op::Reader op, Pipeline& pipeline) {
  const FunctionRegistry* functions = pipeline.functions();
  auto input = [&op, &pipeline]() { return make_iterator(op.getInput(), pipeline); };
  auto factory = [&pipeline](Op::Reader in) -> IteratorFactory {
    return [in, &pipeline]() { return make_iterator(in, pipeline); };
  };
  if (SplitProvider* splits = pipeline.splits_for(op)) {
    switch (op.which()) {
      case Op::RANGE: return make_split_range(op.getRange().getStart(), op.getRange().getStep(), splits);
      case Op::LIST_FILES: return make_split_files(splits);
      case Op::TEXT_LINE:
      case Op::TF_RECORD:
      case Op::FIXED_LENGTH:
        return make_split_records(op, splits);
      default: break;
    }
  }
  switch (op.which()) {
    case Op::RANGE: {
      auto r = op.getRange();
      return make_range(r.getStart(), r.getStop(), r.getStep());
    }
    case Op::FROM_TENSORS: {
      CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensors()));
      return make_from_tensors(std::move(e));
    }
    case Op::FROM_TENSOR_SLICES: {
      CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensorSlices()));
      auto it = make_from_tensor_slices(e);
      if (!it.ok()) return it.status().with_context("from_tensor_slices");
      return it;
    }
    case Op::LIST_FILES: {
      auto l = op.getListFiles();
      std::optional<uint64_t> seed;
      if (l.getHasSeed()) seed = l.getSeed();
      return make_list_files(texts(l.getPatterns()), l.getShuffle(), seed, pipeline, op_key(op));
    }
    case Op::TEXT_LINE:
      return make_text_line(texts(op.getTextLine().getFiles()), from_wire(op.getTextLine().getCompression()));
    case Op::TF_RECORD: {
      auto t = op.getTfRecord();
      auto files = texts(t.getFiles());
      Compression compression = from_wire(t.getCompression());
      int64_t reads = t.getNumParallelReads();
      if (reads == kAutotune) reads = pipeline.cpu_budget();
      if (reads <= 1 || files.size() <= 1) return make_tfrecord(std::move(files), compression);
      // TF: num_parallel_reads interleaves the files, one record at a time.
      std::vector<std::string> names = files;
      CAPSTAN_ASSIGN_OR_RETURN(Tensor file_tensor,
                               Tensor::from_strings(names, {static_cast<int64_t>(names.size())}));
      Element slices;
      slices.components.push_back(std::move(file_tensor));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr file_iterator, make_from_tensor_slices(slices));
      InterleaveFunction fn = [compression](const Element& e) -> Result<Dataset> {
        return Dataset::tfrecord_dataset({std::string(e.components[0].string_at(0))}, compression);
      };
      return make_interleave(std::move(file_iterator), std::move(fn),
                             std::min<int64_t>(reads, static_cast<int64_t>(files.size())), 1,
                             /*parallel=*/true, /*deterministic=*/true, pipeline);
    }
    case Op::FIXED_LENGTH: {
      auto f = op.getFixedLength();
      return make_fixed_length(texts(f.getFiles()), f.getRecordBytes(), f.getHeaderBytes(),
                               f.getFooterBytes(), from_wire(f.getCompression()));
    }
    case Op::ZIP: {
      std::vector<IteratorPtr> inputs;
      for (auto in : op.getInputs()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr it, make_iterator(in, pipeline));
        inputs.push_back(std::move(it));
      }
      return make_zip(std::move(inputs));
    }
    case Op::CONCATENATE: {
      std::vector<IteratorFactory> inputs;
      for (auto in : op.getInputs()) inputs.push_back(factory(in));
      return make_concatenate(std::move(inputs));
    }
    case Op::MAP: {
      auto m = op.getMap();
      CAPSTAN_ASSIGN_OR_RETURN(MapFunction fn, resolve_map(m.getFn(), functions));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      if (m.getNumParallelCalls() == 0) return make_map(std::move(in), std::move(fn));
      return make_parallel_map(std::move(in), std::move(fn), m.getNumParallelCalls(),
                               resolve_deterministic(m.getDeterministic(), pipeline), pipeline);
    }
    case Op::FILTER: {
      CAPSTAN_ASSIGN_OR_RETURN(FilterFunction fn, resolve_filter(op.getFilter().getFn(), functions));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_filter(std::move(in), std::move(fn));
    }
    case Op::BATCH: {
      auto b = op.getBatch();
      auto in_op = op.getInput();
      // map(parallel).batch() fuses into one op whose workers build whole
      // batches: fewer hand-offs per element, same output.
      if (in_op.isMap() && in_op.getMap().getNumParallelCalls() != 0) {
        auto m = in_op.getMap();
        CAPSTAN_ASSIGN_OR_RETURN(MapFunction fn, resolve_map(m.getFn(), functions));
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_iterator(in_op.getInput(), pipeline));
        return make_map_and_batch(std::move(in), std::move(fn), m.getNumParallelCalls(),
                                  b.getBatchSize(), b.getDropRemainder(),
                                  resolve_deterministic(m.getDeterministic(), pipeline), pipeline);
      }
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_batch(std::move(in), b.getBatchSize(), b.getDropRemainder());
    }
    case Op::PADDED_BATCH: {
      auto p = op.getPaddedBatch();
      std::vector<Shape> shapes;
      for (auto s : p.getPaddedShapes()) {
        Shape shape;
        for (int64_t d : s) shape.push_back(d);
        shapes.push_back(std::move(shape));
      }
      std::vector<Tensor> values;
      for (auto v : p.getPaddingValues()) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor t, rpc::read_tensor_inline(v));
        values.push_back(std::move(t));
      }
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_padded_batch(std::move(in), p.getBatchSize(), std::move(shapes), std::move(values),
                               p.getDropRemainder());
    }
    case Op::SHUFFLE: {
      auto s = op.getShuffle();
      std::optional<uint64_t> seed;
      if (s.getHasSeed()) seed = s.getSeed();
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_shuffle(std::move(in), s.getBufferSize(), seed, s.getReshuffleEachIteration(),
                          pipeline, op_key(op));
    }
    case Op::REPEAT: return make_repeat(factory(op.getInput()), op.getRepeat().getCount());
    case Op::SHARD: {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_shard(std::move(in), op.getShard().getNumShards(), op.getShard().getIndex());
    }
    case Op::INTERLEAVE: {
      auto i = op.getInterleave();
      CAPSTAN_ASSIGN_OR_RETURN(InterleaveFunction fn, resolve_interleave(i.getFn(), functions));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      int64_t cycle = i.getCycleLength() == kAutotune ? pipeline.cpu_budget() : i.getCycleLength();
      return make_interleave(std::move(in), std::move(fn), cycle, i.getBlockLength(),
                             i.getNumParallelCalls() != 0,
                             resolve_deterministic(i.getDeterministic(), pipeline), pipeline);
    }
    case Op::PREFETCH: {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      if (op.getPrefetch().getBufferSize() == 0) return in;
      return make_prefetch(std::move(in), op.getPrefetch().getBufferSize(), pipeline);
    }
    case Op::TAKE: {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_take(std::move(in), op.getTake().getCount());
    }
    case Op::SKIP: {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_skip(std::move(in), op.getSkip().getCount());
    }
    case Op::CACHE: {
      std::string filename = op.getCache().getFilename().cStr();
      if (filename.empty()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
        return make_memory_cache(std::move(in), pipeline, op_key(op));
      }
      return make_file_cache(factory(op.getInput()), std::move(filename));
    }
    case Op::REBATCH: {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, input());
      return make_rebatch(std::move(in), op.getRebatch().getBatchSize(),
                          op.getRebatch().getDropRemainder());
    }
    case Op::DATA_SERVICE: return service::make_service_reader(service::config_from_op(op));
  }
  return Status::InvalidArgument("unknown op");
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
    Element element;
    bool end = false;
    CAPSTAN_RETURN_IF_ERROR(root_->get_next(&element, &end));
    if (end) return std::optional<Element>();
    return std::optional<Element>(std::move(element));
  }

 private:
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<IteratorBase> root_;
};

}  // namespace

std::unique_ptr<Iterator> wrap_root(std::unique_ptr<Pipeline> pipeline,
                                    std::unique_ptr<IteratorBase> root) {
  return std::make_unique<RootIterator>(std::move(pipeline), std::move(root));
}

}  // namespace capstan::data::engine

namespace capstan::data {

Result<std::unique_ptr<Iterator>> Dataset::make_iterator(const FunctionRegistry* functions) const {
  return make_iterator(functions, nullptr);
}

Result<std::unique_ptr<SplitProvider>> Dataset::make_split_provider(int64_t range_chunk) const {
  if (range_chunk <= 0) {
    return Status::InvalidArgument("range_chunk must be positive, got " + std::to_string(range_chunk));
  }
  try {
    // Functions are not needed to split the source: only argument errors count.
    Status valid = engine::validate(impl_->root(), nullptr);
    if (!valid.ok() && valid.code() != StatusCode::kNotFound) return valid;
    return engine::make_split_provider(impl_->root(), range_chunk);
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

Result<std::unique_ptr<Iterator>> Dataset::make_iterator(const FunctionRegistry* functions,
                                                         SplitProvider* splits) const {
  try {
    CAPSTAN_RETURN_IF_ERROR(engine::validate(impl_->root(), functions));
    auto pipeline = std::make_unique<engine::Pipeline>(impl_, functions, splits);
    CAPSTAN_ASSIGN_OR_RETURN(auto root, engine::make_iterator(impl_->root(), *pipeline));
    return engine::wrap_root(std::move(pipeline), std::move(root));
  } catch (const kj::Exception& e) {
    // A definition from elsewhere whose structure is damaged.
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

}  // namespace capstan::data
