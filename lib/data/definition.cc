#include "data/definition.h"

#include <capnp/any.h>
#include <capnp/dynamic.h>

#include <cstring>
#include <sstream>

#include "data/op_kernel.h"
#include "data/saved_dataset.h"
#include "rpc/errors.h"
#include "rpc/tensor_codec.h"

namespace capstan::data {
namespace {

using Op = wire::Op;

// Builds a new definition whose root op is filled by `fill`, with the
// options of `options_from` (or defaults).
template <typename Fill>
Dataset build(const Dataset* options_from, Fill fill) {
  capnp::MallocMessageBuilder message;
  auto def = message.initRoot<wire::DatasetDef>();
  if (options_from != nullptr) def.setOptions(options_from->impl()->def().getOptions());
  fill(def.initRoot());
  return Dataset(std::make_shared<const Dataset::Impl>(message));
}

// A transformation of `input`: `fill` sets the op, the input is copied in.
template <typename Fill>
Dataset derive(const Dataset& input, Fill fill) {
  return build(&input, [&input, &fill](Op::Builder op) {
    fill(op);
    op.setInput(input.impl()->root());
  });
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& values) {
  for (size_t i = 0; i < values.size(); ++i) list.set(static_cast<unsigned>(i), values[i]);
}

wire::Tri tri(std::optional<bool> value) {
  if (!value) return wire::Tri::DEFAULT;
  return *value ? wire::Tri::YES : wire::Tri::NO;
}

std::shared_ptr<Fn::Impl> new_fn(Fn::Impl::Kind kind) {
  auto impl = std::make_shared<Fn::Impl>();
  impl->kind = kind;
  return impl;
}

void describe(Op::Reader op, std::ostream& out) {
  const engine::OpKernel* kernel = engine::find_op_kernel(op.which());
  if (kernel == nullptr) {
    if (op.hasInput()) {
      describe(op.getInput(), out);
      out << ".";
    }
    out << "unknown_op_" << static_cast<unsigned>(op.which()) << "(...)";
    return;
  }
  auto args = [&]() {
    if (kernel->describe_args != nullptr) kernel->describe_args(op, out);
  };
  switch (kernel->inputs) {
    case engine::OpKernel::Inputs::kNone:
      out << kernel->name << "(";
      args();
      break;
    case engine::OpKernel::Inputs::kOne:
      if (op.hasInput()) describe(op.getInput(), out);
      out << "." << kernel->name << "(";
      args();
      break;
    case engine::OpKernel::Inputs::kMany: {
      out << kernel->name << "(";
      bool first = true;
      for (auto input : op.getInputs()) {
        if (!first) out << ", ";
        first = false;
        describe(input, out);
      }
      break;
    }
  }
  out << ")";
}

void resolve_hints(Op::Builder op, int64_t num_shards, int64_t index) {
  if (op.isShard()) {
    auto shard = op.getShard();
    if (shard.getNumShards() == kShardHint) shard.setNumShards(num_shards);
    if (shard.getIndex() == kShardHint) shard.setIndex(index);
  }
  if (op.hasInput()) resolve_hints(op.getInput(), num_shards, index);
  for (auto input : op.getInputs()) resolve_hints(input, num_shards, index);
}

}  // namespace

// ---- Impl ---------------------------------------------------------------------

capnp::ReaderOptions definition_reader_options() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = uint64_t{1} << 60;
  options.nestingLimit = 256;
  return options;
}

Dataset::Impl::Impl(capnp::MessageBuilder& message)
    : Impl(capnp::messageToFlatArray(message)) {}

Dataset::Impl::Impl(kj::Array<capnp::word> words_in) : words(kj::mv(words_in)) {
  reader = std::make_unique<capnp::FlatArrayMessageReader>(words.asPtr(),
                                                          definition_reader_options());
}

bool Dataset::Impl::contains(const void* address) const {
  auto* p = static_cast<const capnp::word*>(address);
  return p >= words.begin() && p < words.end();
}

const void* op_key(wire::Op::Reader op) {
  return capnp::AnyStruct::Reader(op).getDataSection().begin();
}

const char* op_name(wire::Op::Which which) {
  const engine::OpKernel* kernel = engine::find_op_kernel(which);
  return kernel != nullptr ? kernel->name : "unknown op";
}

std::string fn_name(wire::Fn::Reader fn) {
  switch (fn.which()) {
    case wire::Fn::NAMED: return fn.getNamed().cStr();
    case wire::Fn::DECODE_CSV: return "decode_csv";
    case wire::Fn::PARSE_EXAMPLE: return "parse_example";
    case wire::Fn::CAST: return "cast";
    case wire::Fn::TFRECORD_DATASET: return "tfrecord_dataset";
    case wire::Fn::TEXT_LINE_DATASET: return "text_line_dataset";
  }
  return "unknown function";
}

wire::Compression to_wire(Compression compression) {
  return compression == Compression::kGzip ? wire::Compression::GZIP : wire::Compression::NONE;
}

Compression from_wire(wire::Compression compression) {
  return compression == wire::Compression::GZIP ? Compression::kGzip : Compression::kNone;
}

// ---- Fn -------------------------------------------------------------------------

Fn Fn::named(std::string name) {
  auto impl = new_fn(Impl::Kind::kNamed);
  impl->name = std::move(name);
  return Fn(std::move(impl));
}

Fn Fn::decode_csv(CsvSpec spec) {
  auto impl = new_fn(Impl::Kind::kDecodeCsv);
  impl->csv = std::move(spec);
  return Fn(std::move(impl));
}

Fn Fn::parse_example(FeatureSpec spec) {
  auto impl = new_fn(Impl::Kind::kParseExample);
  impl->features = std::move(spec);
  return Fn(std::move(impl));
}

Fn Fn::cast(DType dtype) {
  auto impl = new_fn(Impl::Kind::kCast);
  impl->dtype = dtype;
  return Fn(std::move(impl));
}

Fn Fn::tfrecord_dataset(Compression compression) {
  auto impl = new_fn(Impl::Kind::kTfRecordDataset);
  impl->compression = compression;
  return Fn(std::move(impl));
}

Fn Fn::text_line_dataset(Compression compression) {
  auto impl = new_fn(Impl::Kind::kTextLineDataset);
  impl->compression = compression;
  return Fn(std::move(impl));
}

void Fn::Impl::write(wire::Fn::Builder builder) const {
  switch (kind) {
    case Kind::kNamed: builder.setNamed(name); break;
    case Kind::kDecodeCsv: {
      auto spec = builder.initDecodeCsv();
      auto defaults = spec.initRecordDefaults(static_cast<unsigned>(csv.record_defaults.size()));
      for (size_t i = 0; i < csv.record_defaults.size(); ++i) {
        rpc::write_tensor_inline(defaults[static_cast<unsigned>(i)], csv.record_defaults[i]);
      }
      spec.setFieldDelim(csv.field_delim);
      spec.setUseQuoteDelim(csv.use_quote_delim);
      spec.setNaValue(csv.na_value);
      auto cols = spec.initSelectCols(static_cast<unsigned>(csv.select_cols.size()));
      for (size_t i = 0; i < csv.select_cols.size(); ++i) cols.set(static_cast<unsigned>(i), csv.select_cols[i]);
      spec.setTrimWhitespace(csv.trim_whitespace);
      break;
    }
    case Kind::kParseExample: {
      auto list = builder.initParseExample(static_cast<unsigned>(features.size()));
      unsigned i = 0;
      for (const auto& [key, feature] : features) {
        auto f = list[i++];
        f.setKey(key);
        if (const auto* fixed = std::get_if<FixedLenFeature>(&feature)) {
          f.setDtype(rpc::to_wire(fixed->dtype));
          auto group = f.initFixedLen();
          auto shape = group.initShape(static_cast<unsigned>(fixed->shape.size()));
          for (size_t d = 0; d < fixed->shape.size(); ++d) shape.set(static_cast<unsigned>(d), fixed->shape[d]);
          if (fixed->default_value) {
            group.setHasDefault(true);
            rpc::write_tensor_inline(group.initDefaultValue(), *fixed->default_value);
          }
        } else {
          f.setDtype(rpc::to_wire(std::get<VarLenFeature>(feature).dtype));
          f.setVarLen();
        }
      }
      break;
    }
    case Kind::kCast: builder.setCast(rpc::to_wire(dtype)); break;
    case Kind::kTfRecordDataset: builder.setTfrecordDataset(data::to_wire(compression)); break;
    case Kind::kTextLineDataset: builder.setTextLineDataset(data::to_wire(compression)); break;
  }
}

// ---- Sources ------------------------------------------------------------------------

Dataset Dataset::range(int64_t stop) { return range(0, stop, 1); }

Dataset Dataset::range(int64_t start, int64_t stop, int64_t step) {
  return build(nullptr, [&](Op::Builder op) {
    auto r = op.initRange();
    r.setStart(start);
    r.setStop(stop);
    r.setStep(step);
  });
}

Dataset Dataset::from_tensors(Element element) {
  return build(nullptr, [&](Op::Builder op) { rpc::write_element_inline(op.initFromTensors(), element); });
}

Dataset Dataset::from_tensor_slices(Element element) {
  return build(nullptr,
               [&](Op::Builder op) { rpc::write_element_inline(op.initFromTensorSlices(), element); });
}

Dataset Dataset::list_files(std::vector<std::string> patterns, bool shuffle,
                            std::optional<uint64_t> seed) {
  return build(nullptr, [&](Op::Builder op) {
    auto l = op.initListFiles();
    set_texts(l.initPatterns(static_cast<unsigned>(patterns.size())), patterns);
    l.setShuffle(shuffle);
    l.setHasSeed(seed.has_value());
    l.setSeed(seed.value_or(0));
  });
}

Dataset Dataset::text_line_dataset(std::vector<std::string> files, Compression compression) {
  return build(nullptr, [&](Op::Builder op) {
    auto t = op.initTextLine();
    set_texts(t.initFiles(static_cast<unsigned>(files.size())), files);
    t.setCompression(data::to_wire(compression));
  });
}

Dataset Dataset::tfrecord_dataset(std::vector<std::string> files, Compression compression,
                                  int64_t num_parallel_reads) {
  return build(nullptr, [&](Op::Builder op) {
    auto t = op.initTfRecord();
    set_texts(t.initFiles(static_cast<unsigned>(files.size())), files);
    t.setCompression(data::to_wire(compression));
    t.setNumParallelReads(num_parallel_reads);
  });
}

Dataset Dataset::fixed_length_record_dataset(std::vector<std::string> files, int64_t record_bytes,
                                             int64_t header_bytes, int64_t footer_bytes,
                                             Compression compression) {
  return build(nullptr, [&](Op::Builder op) {
    auto f = op.initFixedLength();
    set_texts(f.initFiles(static_cast<unsigned>(files.size())), files);
    f.setRecordBytes(record_bytes);
    f.setHeaderBytes(header_bytes);
    f.setFooterBytes(footer_bytes);
    f.setCompression(data::to_wire(compression));
  });
}

Dataset Dataset::zip(const std::vector<Dataset>& datasets) {
  return build(datasets.empty() ? nullptr : &datasets.front(), [&](Op::Builder op) {
    op.setZip();
    auto inputs = op.initInputs(static_cast<unsigned>(datasets.size()));
    for (size_t i = 0; i < datasets.size(); ++i) {
      inputs.setWithCaveats(static_cast<unsigned>(i), datasets[i].impl()->root());
    }
  });
}

// ---- Transformations ------------------------------------------------------------------

Dataset Dataset::map(Fn fn, int64_t num_parallel_calls, std::optional<bool> deterministic) const {
  return derive(*this, [&](Op::Builder op) {
    auto m = op.initMap();
    fn.impl()->write(m.initFn());
    m.setNumParallelCalls(num_parallel_calls);
    m.setDeterministic(tri(deterministic));
  });
}

Dataset Dataset::filter(Fn fn) const {
  return derive(*this, [&](Op::Builder op) { fn.impl()->write(op.initFilter().initFn()); });
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  return derive(*this, [&](Op::Builder op) {
    auto b = op.initBatch();
    b.setBatchSize(batch_size);
    b.setDropRemainder(drop_remainder);
  });
}

Dataset Dataset::padded_batch(int64_t batch_size, std::vector<Shape> padded_shapes,
                              std::vector<Tensor> padding_values, bool drop_remainder) const {
  return derive(*this, [&](Op::Builder op) {
    auto b = op.initPaddedBatch();
    b.setBatchSize(batch_size);
    b.setDropRemainder(drop_remainder);
    auto shapes = b.initPaddedShapes(static_cast<unsigned>(padded_shapes.size()));
    for (size_t i = 0; i < padded_shapes.size(); ++i) {
      auto dims = shapes.init(static_cast<unsigned>(i), static_cast<unsigned>(padded_shapes[i].size()));
      for (size_t d = 0; d < padded_shapes[i].size(); ++d) dims.set(static_cast<unsigned>(d), padded_shapes[i][d]);
    }
    auto values = b.initPaddingValues(static_cast<unsigned>(padding_values.size()));
    for (size_t i = 0; i < padding_values.size(); ++i) {
      rpc::write_tensor_inline(values[static_cast<unsigned>(i)], padding_values[i]);
    }
  });
}

Dataset Dataset::shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration) const {
  return derive(*this, [&](Op::Builder op) {
    auto s = op.initShuffle();
    s.setBufferSize(buffer_size);
    s.setHasSeed(seed.has_value());
    s.setSeed(seed.value_or(0));
    s.setReshuffleEachIteration(reshuffle_each_iteration);
  });
}

Dataset Dataset::repeat(int64_t count) const {
  return derive(*this, [&](Op::Builder op) { op.initRepeat().setCount(count); });
}

Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  return derive(*this, [&](Op::Builder op) {
    auto s = op.initShard();
    s.setNumShards(num_shards);
    s.setIndex(index);
  });
}

Dataset Dataset::interleave(Fn fn, int64_t cycle_length, int64_t block_length,
                            int64_t num_parallel_calls, std::optional<bool> deterministic) const {
  return derive(*this, [&](Op::Builder op) {
    auto i = op.initInterleave();
    fn.impl()->write(i.initFn());
    i.setCycleLength(cycle_length);
    i.setBlockLength(block_length);
    i.setNumParallelCalls(num_parallel_calls);
    i.setDeterministic(tri(deterministic));
  });
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  return derive(*this, [&](Op::Builder op) { op.initPrefetch().setBufferSize(buffer_size); });
}

Dataset Dataset::take(int64_t count) const {
  return derive(*this, [&](Op::Builder op) { op.initTake().setCount(count); });
}

Dataset Dataset::skip(int64_t count) const {
  return derive(*this, [&](Op::Builder op) { op.initSkip().setCount(count); });
}

Dataset Dataset::concatenate(const Dataset& other) const {
  return build(this, [&](Op::Builder op) {
    op.setConcatenate();
    auto inputs = op.initInputs(2);
    inputs.setWithCaveats(0, impl_->root());
    inputs.setWithCaveats(1, other.impl()->root());
  });
}

Dataset Dataset::cache(std::string filename) const {
  return derive(*this, [&](Op::Builder op) { op.initCache().setFilename(filename); });
}

Dataset Dataset::snapshot(std::string path, Compression compression) const {
  return derive(*this, [&](Op::Builder op) {
    auto s = op.initSnapshot();
    s.setPath(path);
    s.setCompression(data::to_wire(compression));
  });
}

Result<Dataset> Dataset::load(const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(engine::SavedSpec spec, engine::read_saved_spec(path));
  return build(nullptr, [&](Op::Builder op) {
    auto l = op.initLoad();
    l.setPath(path);
    set_texts(l.initShards(static_cast<unsigned>(spec.shards.size())), spec.shards);
    l.setCompression(data::to_wire(spec.compression));
    l.setNumElements(spec.num_elements);
  });
}

Dataset Dataset::rebatch(int64_t batch_size, bool drop_remainder) const {
  return derive(*this, [&](Op::Builder op) {
    auto r = op.initRebatch();
    r.setBatchSize(batch_size);
    r.setDropRemainder(drop_remainder);
  });
}

Dataset Dataset::with_options(Options options) const {
  capnp::MallocMessageBuilder message;
  message.setRoot(impl_->def());
  auto o = message.getRoot<wire::DatasetDef>().getOptions();
  o.setAutotune(options.autotune);
  o.setAutotuneRamBudget(options.autotune_ram_budget);
  o.setAutotuneCpuBudget(options.autotune_cpu_budget);
  o.setDeterministic(options.deterministic);
  o.setMemoryBudget(options.memory_budget);
  return Dataset(std::make_shared<const Impl>(message));
}

Options Dataset::options() const {
  auto o = impl_->def().getOptions();
  Options out;
  out.autotune = o.getAutotune();
  out.autotune_ram_budget = o.getAutotuneRamBudget();
  out.autotune_cpu_budget = o.getAutotuneCpuBudget();
  out.deterministic = o.getDeterministic();
  out.memory_budget = o.getMemoryBudget();
  return out;
}

Dataset Dataset::resolve_shard_hint(int64_t num_shards, int64_t index) const {
  capnp::MallocMessageBuilder message;
  message.setRoot(impl_->def());
  resolve_hints(message.getRoot<wire::DatasetDef>().getRoot(), num_shards, index);
  return Dataset(std::make_shared<const Impl>(message));
}

// ---- Cardinality ------------------------------------------------------------------------

int64_t cardinality_of(wire::Op::Reader op) {
  const engine::OpKernel* kernel = engine::find_op_kernel(op.which());
  if (kernel == nullptr || kernel->cardinality == nullptr) return kUnknownCardinality;
  if (kernel->inputs == engine::OpKernel::Inputs::kOne && !op.hasInput()) return kUnknownCardinality;
  return kernel->cardinality(op);
}

int64_t Dataset::cardinality() const { return cardinality_of(impl_->root()); }

// ---- Serialization ----------------------------------------------------------------------

std::string Dataset::serialize() const {
  auto bytes = impl_->words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

namespace {

// Reads every field the schema names, recursively, so that a pointer of the
// wrong kind (a list where a struct belongs, found by fuzzing) fails here
// rather than in a later typed read. totalSize() alone walks pointers
// without the schema and accepts such a message.
void check_value(capnp::DynamicValue::Reader value, int depth);

void check_struct(capnp::DynamicStruct::Reader s, int depth) {
  if (depth > 512) KJ_FAIL_REQUIRE("dataset definition nested too deeply");
  auto visit = [&](capnp::StructSchema::Field field) {
    auto type = field.getType();
    if (type.isInterface() || type.isAnyPointer()) return;  // capabilities are not read here
    if (!s.has(field)) return;
    check_value(s.get(field), depth + 1);
  };
  for (auto field : s.getSchema().getNonUnionFields()) visit(field);
  KJ_IF_MAYBE(field, s.which()) { visit(*field); }
}

void check_value(capnp::DynamicValue::Reader value, int depth) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      check_struct(value.as<capnp::DynamicStruct>(), depth);
      break;
    case capnp::DynamicValue::LIST:
      for (auto element : value.as<capnp::DynamicList>()) check_value(element, depth + 1);
      break;
    default:
      break;  // leaves (numbers, text, data) were checked by get()
  }
}

}  // namespace

Result<Dataset> Dataset::deserialize(const std::string& bytes) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("dataset definition of " + std::to_string(bytes.size()) +
                                   " bytes is not a Cap'n Proto message");
  }
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    {
      // Touch the whole tree so structural damage shows up here, not later,
      // through a reader whose traversal limit is a small multiple of the
      // message: a definition built by a client reads each word once per
      // pass, while one whose pointers share targets (amplification, found
      // by fuzzing: 120 bytes that took minutes) runs out of budget.
      capnp::ReaderOptions options = definition_reader_options();
      options.traversalLimitInWords = 4 * words.size() + 1024;
      capnp::FlatArrayMessageReader check(words.asPtr(), options);
      auto def = check.getRoot<wire::DatasetDef>();
      (void)def.totalSize();
      check_struct(capnp::toDynamic(def), 0);
    }
    auto impl = std::make_shared<Impl>(kj::mv(words));
    return Dataset(std::move(impl));
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

std::string Dataset::debug_string() const {
  std::ostringstream out;
  describe(impl_->root(), out);
  return out.str();
}

}  // namespace capstan::data
