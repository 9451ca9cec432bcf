// The kernels of source ops: datasets made from arguments, files or the data
// service (op_kernel.h).
#include <algorithm>
#include <optional>
#include <set>

#include "data/definition.h"
#include "data/io/file.h"
#include "data/op_kernel.h"
#include "data/ops.h"
#include "data/saved_dataset.h"
#include "data/service_reader.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;
using Inputs = OpKernel::Inputs;

// An op's tensors, decoded from the definition once for the pipeline.
// Nothing to save: they are the definition's.
struct DecodedElement : PipelineState {
  void save(StateWriter&) override {}
  Status restore(StateReader&) override { return Status::Ok(); }
  Mutex mutex;
  std::optional<Element> element GUARDED_BY(mutex);
};

// ---- range ---------------------------------------------------------------------

int64_t range_cardinality(Op::Reader op) {
  auto r = op.getRange();
  if (r.getStep() == 0) return kUnknownCardinality;
  __int128 span = static_cast<__int128>(r.getStop()) - r.getStart();
  __int128 step = r.getStep();
  if ((span > 0) != (step > 0) || span == 0) return 0;
  __int128 n = (span + step + (step > 0 ? -1 : 1)) / step;
  return static_cast<int64_t>(n);
}

constexpr OpKernel kRange{
    .which = Op::RANGE,
    .name = "range",
    .inputs = Inputs::kNone,
    .describe_args =
        [](Op::Reader op, std::ostream& out) {
          auto r = op.getRange();
          out << r.getStart() << ", " << r.getStop() << ", " << r.getStep();
        },
    .cardinality = range_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getRange().getStep() == 0) return invalid_op(op, "step must not be 0");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      auto r = op.getRange();
      return make_range(r.getStart(), r.getStop(), r.getStep());
    },
    .split_provider = [](Op::Reader op, int64_t range_chunk) -> Result<std::unique_ptr<SplitProvider>> {
      return make_range_split_provider(std::max<int64_t>(range_cardinality(op), 0), range_chunk);
    },
    .read_splits = [](Op::Reader op, SplitProvider* splits) {
      return make_split_range(op.getRange().getStart(), op.getRange().getStep(), splits);
    },
};

// ---- from_tensors, from_tensor_slices ----------------------------------------------------------

constexpr OpKernel kFromTensors{
    .which = Op::FROM_TENSORS,
    .name = "from_tensors",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader, std::ostream& out) { out << "..."; },
    .cardinality = [](Op::Reader) -> int64_t { return 1; },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      // Decoded once per pipeline; every iterator (repeat() makes one per
      // epoch) yields the same tensors, as TF's dataset holds its tensors.
      auto decoded = pipeline.state<DecodedElement>(op_key(op));
      MutexLock lock(decoded->mutex);
      if (!decoded->element) {
        CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensors()));
        decoded->element = std::move(e);
      }
      return make_from_tensors(*decoded->element);
    },
};

constexpr OpKernel kFromTensorSlices{
    .which = Op::FROM_TENSOR_SLICES,
    .name = "from_tensor_slices",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader, std::ostream& out) { out << "..."; },
    .cardinality = [](Op::Reader op) -> int64_t {
      auto components = op.getFromTensorSlices().getComponents();
      if (components.size() == 0 || components[0].getShape().size() == 0) return kUnknownCardinality;
      return components[0].getShape()[0];
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensorSlices()));
      auto it = make_from_tensor_slices(e);
      if (!it.ok()) return it.status().with_context("from_tensor_slices");
      return it;
    },
};

// ---- File sources -----------------------------------------------------------------

// The files with k % num_workers == index.
std::vector<std::string> share_of(capnp::List<capnp::Text>::Reader files, int64_t num_workers,
                                  int64_t index) {
  std::vector<std::string> mine;
  for (unsigned k = 0; k < files.size(); ++k) {
    if (static_cast<int64_t>(k) % num_workers == index) mine.emplace_back(files[k].cStr());
  }
  return mine;
}

void set_texts(capnp::List<capnp::Text>::Builder out, const std::vector<std::string>& values) {
  for (unsigned k = 0; k < values.size(); ++k) out.set(k, values[k]);
}

void describe_files(capnp::List<capnp::Text>::Reader files, std::ostream& out) {
  out << files.size() << " files";
}

constexpr OpKernel::FileSource kListFilesSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> {
      std::set<std::string> matched;
      for (const auto& pattern : texts(op.getListFiles().getPatterns())) {
        CAPSTAN_ASSIGN_OR_RETURN(auto files, io::match_files(pattern));
        if (files.empty()) return Status::InvalidArgument("list_files: no files matched pattern: " + pattern);
        matched.insert(files.begin(), files.end());
      }
      return std::vector<std::string>(matched.begin(), matched.end());
    },
    // shard(num_workers, index) right after list_files (the matches are
    // sorted, so every worker sees the same list).
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          capnp::MallocMessageBuilder scratch;
          scratch.setRoot(op.asReader());
          // Every worker must order the files the same way before taking its
          // share: an unseeded shuffle would hand workers overlapping files.
          auto listed = scratch.getRoot<Op>().getListFiles();
          if (listed.getShuffle() && !listed.getHasSeed()) {
            listed.setHasSeed(true);
            listed.setSeed(0x5eed);
          }
          auto shard = op.initShard();
          shard.setNumShards(num_workers);
          shard.setIndex(index);
          op.setInput(scratch.getRoot<Op>().asReader());
        },
    .read_splits = [](Op::Reader, SplitProvider* splits) { return make_split_files(splits); },
};

constexpr OpKernel kListFiles{
    .which = Op::LIST_FILES,
    .name = "list_files",
    .inputs = Inputs::kNone,
    .describe_args =
        [](Op::Reader op, std::ostream& out) { out << op.getListFiles().getPatterns().size() << " patterns"; },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getListFiles().getPatterns().size() == 0) return invalid_op(op, "no file patterns given");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto l = op.getListFiles();
      std::optional<uint64_t> seed;
      if (l.getHasSeed()) seed = l.getSeed();
      return make_list_files(texts(l.getPatterns()), l.getShuffle(), seed, pipeline, op_key(op));
    },
    .file_source = &kListFilesSource,
};

constexpr OpKernel::FileSource kTextLineSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts(op.getTextLine().getFiles()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getTextLine().getFiles(), num_workers, index);
          set_texts(op.getTextLine().initFiles(static_cast<unsigned>(mine.size())), mine);
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          return make_split_text_line(splits, from_wire(op.getTextLine().getCompression()));
        },
};

constexpr OpKernel kTextLine{
    .which = Op::TEXT_LINE,
    .name = "text_line_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getTextLine().getFiles(), out); },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return make_text_line(texts(op.getTextLine().getFiles()), from_wire(op.getTextLine().getCompression()));
    },
    .file_source = &kTextLineSource,
};

constexpr OpKernel::FileSource kTfRecordSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts(op.getTfRecord().getFiles()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getTfRecord().getFiles(), num_workers, index);
          set_texts(op.getTfRecord().initFiles(static_cast<unsigned>(mine.size())), mine);
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          return make_split_tfrecord(splits, from_wire(op.getTfRecord().getCompression()));
        },
};

Result<IteratorPtr> make_tfrecord_source(Op::Reader op, Pipeline& pipeline) {
  auto t = op.getTfRecord();
  auto files = texts(t.getFiles());
  Compression compression = from_wire(t.getCompression());
  int64_t reads = t.getNumParallelReads();
  if (reads == kAutotune) reads = pipeline.cpu_budget();
  if (reads <= 1 || files.size() <= 1) return make_tfrecord(std::move(files), compression);
  // TF: num_parallel_reads interleaves the files, one record at a time.
  int64_t cycle = std::min<int64_t>(reads, static_cast<int64_t>(files.size()));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor file_tensor,
                           Tensor::from_strings(files, {static_cast<int64_t>(files.size())}));
  Element slices;
  slices.components.push_back(std::move(file_tensor));
  CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr file_iterator, make_from_tensor_slices(slices));
  InterleaveFunction fn = [compression](const Element& e) -> Result<Dataset> {
    return Dataset::tfrecord_dataset({std::string(e.components[0].string_at(0))}, compression);
  };
  return make_interleave(std::move(file_iterator), std::move(fn), cycle, 1,
                         /*parallel=*/true, /*deterministic=*/true, pipeline);
}

constexpr OpKernel kTfRecord{
    .which = Op::TF_RECORD,
    .name = "tfrecord_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getTfRecord().getFiles(), out); },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_parallel(op, op.getTfRecord().getNumParallelReads(), "num_parallel_reads");
    },
    .make = make_tfrecord_source,
    .file_source = &kTfRecordSource,
};

constexpr OpKernel::FileSource kFixedLengthSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> {
      return texts(op.getFixedLength().getFiles());
    },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getFixedLength().getFiles(), num_workers, index);
          set_texts(op.getFixedLength().initFiles(static_cast<unsigned>(mine.size())), mine);
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          auto f = op.getFixedLength();
          return make_split_fixed_length(splits, f.getRecordBytes(), f.getHeaderBytes(), f.getFooterBytes(),
                                         from_wire(f.getCompression()));
        },
};

constexpr OpKernel kFixedLength{
    .which = Op::FIXED_LENGTH,
    .name = "fixed_length_record_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getFixedLength().getFiles(), out); },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      auto f = op.getFixedLength();
      CAPSTAN_RETURN_IF_ERROR(check_positive(op, f.getRecordBytes(), "record_bytes"));
      if (f.getHeaderBytes() < 0 || f.getFooterBytes() < 0) {
        return invalid_op(op, "header_bytes and footer_bytes must not be negative");
      }
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      auto f = op.getFixedLength();
      return make_fixed_length(texts(f.getFiles()), f.getRecordBytes(), f.getHeaderBytes(), f.getFooterBytes(),
                               from_wire(f.getCompression()));
    },
    .file_source = &kFixedLengthSource,
};

// ---- load ------------------------------------------------------------------------

constexpr OpKernel::FileSource kLoadSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts(op.getLoad().getShards()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getLoad().getShards(), num_workers, index);
          set_texts(op.getLoad().initShards(static_cast<unsigned>(mine.size())), mine);
          op.getLoad().setNumElements(kUnknownCardinality);  // a share of them
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          return make_split_saved(splits, from_wire(op.getLoad().getCompression()));
        },
};

constexpr OpKernel kLoad{
    .which = Op::LOAD,
    .name = "load",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getLoad().getPath().cStr(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = op.getLoad().getNumElements();
      return n >= 0 ? n : kUnknownCardinality;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getLoad().getShards().size() == 0) return invalid_op(op, "no shard files");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return make_saved_reader(texts(op.getLoad().getShards()), from_wire(op.getLoad().getCompression()));
    },
    .file_source = &kLoadSource,
};

// ---- data_service ----------------------------------------------------------------

constexpr OpKernel kDataService{
    .which = Op::DATA_SERVICE,
    .name = "data_service",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << service::describe_data_service_args(op); },
    // Decided by the service's workers and processing mode.
    .cardinality = [](Op::Reader) -> int64_t { return kUnknownCardinality; },
    .validate = [](Op::Reader op, const FunctionRegistry*) { return service::validate_data_service(op); },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return service::make_service_reader(service::config_from_op(op));
    },
};

constexpr OpKernel kSourceKernels[] = {kRange,     kFromTensors, kFromTensorSlices, kListFiles, kTextLine,
                                       kTfRecord, kFixedLength, kLoad,             kDataService};

}  // namespace

std::span<const OpKernel> source_kernels() { return kSourceKernels; }

}  // namespace capstan::data::engine
