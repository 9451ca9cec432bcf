// The public Dataset and Fn (capstan/data/dataset.h). Each method writes its
// op into a new definition (schemas/dataset.capnp) or asks the engine
// (lib/data) about one; what an op does when it runs is its kernel's, in
// lib/data/ops/<op>.cc.
#include "capstan/data/dataset.h"

#include "data/definition.h"
#include "data/engine.h"
#include "data/saved_dataset.h"
#include "rpc/tensor_codec.h"

namespace capstan::data {
namespace {

using Op = wire::Op;

wire::Tri tri(std::optional<bool> value) {
  if (!value) return wire::Tri::DEFAULT;
  return *value ? wire::Tri::YES : wire::Tri::NO;
}

std::shared_ptr<Fn::Impl> new_fn(Fn::Impl::Kind kind) {
  auto impl = std::make_shared<Fn::Impl>();
  impl->kind = kind;
  return impl;
}

}  // namespace

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

// ---- Sources ------------------------------------------------------------------------

Dataset Dataset::range(int64_t stop) { return range(0, stop, 1); }

Dataset Dataset::range(int64_t start, int64_t stop, int64_t step) {
  return build_dataset(nullptr, [&](Op::Builder op) {
    auto r = op.initRange();
    r.setStart(start);
    r.setStop(stop);
    r.setStep(step);
  });
}

Dataset Dataset::from_tensors(Element element) {
  return build_dataset(nullptr, [&](Op::Builder op) { rpc::write_element_inline(op.initFromTensors(), element); });
}

Dataset Dataset::from_tensor_slices(Element element) {
  return build_dataset(nullptr,
               [&](Op::Builder op) { rpc::write_element_inline(op.initFromTensorSlices(), element); });
}

Dataset Dataset::list_files(std::vector<std::string> patterns, bool shuffle,
                            std::optional<uint64_t> seed) {
  return build_dataset(nullptr, [&](Op::Builder op) {
    auto l = op.initListFiles();
    set_texts(l.initPatterns(static_cast<unsigned>(patterns.size())), patterns);
    l.setShuffle(shuffle);
    l.setHasSeed(seed.has_value());
    l.setSeed(seed.value_or(0));
  });
}

Dataset Dataset::text_line_dataset(std::vector<std::string> files, Compression compression) {
  return text_line_definition(files, compression);
}

Dataset Dataset::tfrecord_dataset(std::vector<std::string> files, Compression compression,
                                  int64_t num_parallel_reads) {
  return tfrecord_definition(files, compression, num_parallel_reads);
}

Dataset Dataset::fixed_length_record_dataset(std::vector<std::string> files, int64_t record_bytes,
                                             int64_t header_bytes, int64_t footer_bytes,
                                             Compression compression) {
  return build_dataset(nullptr, [&](Op::Builder op) {
    auto f = op.initFixedLength();
    set_texts(f.initFiles(static_cast<unsigned>(files.size())), files);
    f.setRecordBytes(record_bytes);
    f.setHeaderBytes(header_bytes);
    f.setFooterBytes(footer_bytes);
    f.setCompression(data::to_wire(compression));
  });
}

Dataset Dataset::zip(const std::vector<Dataset>& datasets) {
  return build_dataset(datasets.empty() ? nullptr : &datasets.front(), [&](Op::Builder op) {
    op.setZip();
    auto inputs = op.initInputs(static_cast<unsigned>(datasets.size()));
    for (size_t i = 0; i < datasets.size(); ++i) {
      inputs.setWithCaveats(static_cast<unsigned>(i), datasets[i].impl()->root());
    }
  });
}

// ---- Transformations ------------------------------------------------------------------

Dataset Dataset::map(Fn fn, int64_t num_parallel_calls, std::optional<bool> deterministic) const {
  return derive_dataset(*this, [&](Op::Builder op) {
    auto m = op.initMap();
    fn.impl()->write(m.initFn());
    m.setNumParallelCalls(num_parallel_calls);
    m.setDeterministic(tri(deterministic));
  });
}

Dataset Dataset::filter(Fn fn) const {
  return derive_dataset(*this, [&](Op::Builder op) { fn.impl()->write(op.initFilter().initFn()); });
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  return derive_dataset(*this, [&](Op::Builder op) {
    auto b = op.initBatch();
    b.setBatchSize(batch_size);
    b.setDropRemainder(drop_remainder);
  });
}

Dataset Dataset::padded_batch(int64_t batch_size, std::vector<Shape> padded_shapes,
                              std::vector<Tensor> padding_values, bool drop_remainder) const {
  return derive_dataset(*this, [&](Op::Builder op) {
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
  return derive_dataset(*this, [&](Op::Builder op) {
    auto s = op.initShuffle();
    s.setBufferSize(buffer_size);
    s.setHasSeed(seed.has_value());
    s.setSeed(seed.value_or(0));
    s.setReshuffleEachIteration(reshuffle_each_iteration);
  });
}

Dataset Dataset::repeat(int64_t count) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initRepeat().setCount(count); });
}

Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  return shard_definition(*this, num_shards, index);
}

Dataset Dataset::interleave(Fn fn, int64_t cycle_length, int64_t block_length,
                            int64_t num_parallel_calls, std::optional<bool> deterministic) const {
  return derive_dataset(*this, [&](Op::Builder op) {
    auto i = op.initInterleave();
    fn.impl()->write(i.initFn());
    i.setCycleLength(cycle_length);
    i.setBlockLength(block_length);
    i.setNumParallelCalls(num_parallel_calls);
    i.setDeterministic(tri(deterministic));
  });
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initPrefetch().setBufferSize(buffer_size); });
}

Dataset Dataset::take(int64_t count) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initTake().setCount(count); });
}

Dataset Dataset::skip(int64_t count) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initSkip().setCount(count); });
}

Dataset Dataset::enumerate(int64_t start) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initEnumerate().setStart(start); });
}

Dataset Dataset::unbatch() const {
  return derive_dataset(*this, [](Op::Builder op) { op.setUnbatch(); });
}

Dataset Dataset::concatenate(const Dataset& other) const {
  return build_dataset(this, [&](Op::Builder op) {
    op.setConcatenate();
    auto inputs = op.initInputs(2);
    inputs.setWithCaveats(0, impl_->root());
    inputs.setWithCaveats(1, other.impl()->root());
  });
}

Dataset Dataset::cache(std::string filename) const {
  return derive_dataset(*this, [&](Op::Builder op) { op.initCache().setFilename(filename); });
}

Dataset Dataset::snapshot(std::string path, Compression compression) const {
  return derive_dataset(*this, [&](Op::Builder op) {
    auto s = op.initSnapshot();
    s.setPath(path);
    s.setCompression(data::to_wire(compression));
  });
}

Result<Dataset> Dataset::load(const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(engine::SavedSpec spec, engine::read_saved_spec(path));
  return build_dataset(nullptr, [&](Op::Builder op) {
    auto l = op.initLoad();
    l.setPath(path);
    set_texts(l.initShards(static_cast<unsigned>(spec.shards.size())), spec.shards);
    l.setCompression(data::to_wire(spec.compression));
    l.setNumElements(spec.num_elements);
  });
}

Dataset Dataset::rebatch(int64_t batch_size, bool drop_remainder) const {
  return derive_dataset(*this, [&](Op::Builder op) {
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
  return resolve_shard_hints(*this, num_shards, index);
}

// ---- Running, inspecting, saving ------------------------------------------------------

int64_t Dataset::cardinality() const { return cardinality_of(impl_->root()); }

Result<std::unique_ptr<Iterator>> Dataset::make_iterator(const FunctionRegistry* functions) const {
  return engine::make_root_iterator(impl_, functions, {});
}

Result<std::unique_ptr<Iterator>> Dataset::make_iterator(const FunctionRegistry* functions,
                                                         SplitProvider* splits) const {
  if (splits == nullptr) return engine::make_root_iterator(impl_, functions, {});
  return engine::make_root_iterator(impl_, functions, {splits});
}

Result<std::unique_ptr<Iterator>> Dataset::make_iterator(const FunctionRegistry* functions,
                                                         std::vector<SplitProvider*> splits) const {
  return engine::make_root_iterator(impl_, functions, std::move(splits));
}

Result<std::vector<std::unique_ptr<SplitProvider>>> Dataset::make_split_providers(int64_t range_chunk) const {
  return engine::make_root_split_providers(*impl_, range_chunk);
}

Result<std::unique_ptr<SplitProvider>> Dataset::make_split_provider(int64_t range_chunk) const {
  return engine::make_root_split_provider(*impl_, range_chunk);
}

Status Dataset::save(const std::string& path, const SaveOptions& options) const {
  return engine::save_dataset(impl_, path, options);
}

std::string Dataset::serialize() const {
  auto bytes = impl_->words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<Dataset> Dataset::deserialize(const std::string& bytes) { return parse_definition(bytes); }

std::string Dataset::debug_string() const { return describe_definition(impl_->root()); }

}  // namespace capstan::data
