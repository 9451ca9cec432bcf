// tfrecord_dataset(files, compression, num_parallel_reads): one string
// scalar per record; parallel reads interleave the files.
#include <algorithm>

#include "data/io/tfrecord.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

IteratorPtr tfrecord_iterator(FileQueue files, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TFRecordReader>>(
      std::move(files),
      [compression](const std::string& file) { return io::TFRecordReader::open(file, to_io(compression)); },
      "tfrecord");
}

// The records of `files`, one file after another, decompressed as `op` says.
IteratorPtr read_tfrecords(Op::Reader op, FileQueue files) {
  return tfrecord_iterator(std::move(files), from_wire(op.getTfRecord().getCompression()));
}

Result<IteratorPtr> make_tfrecord_source(Op::Reader op, Pipeline& pipeline) {
  auto t = op.getTfRecord();
  auto files = texts(t.getFiles());
  Compression compression = from_wire(t.getCompression());
  int64_t reads = t.getNumParallelReads();
  if (reads == kAutotune) reads = pipeline.cpu_budget();
  if (reads <= 1 || files.size() <= 1) return tfrecord_iterator(FileQueue(std::move(files)), compression);
  // TF: num_parallel_reads interleaves the files, one record at a time.
  int64_t cycle = std::min<int64_t>(reads, static_cast<int64_t>(files.size()));
  // The file names as from_tensor_slices would yield them (its name stays in
  // saved states).
  std::vector<Element> names;
  for (const auto& file : files) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor name, string_scalar(file));
    names.push_back(scalar_element(std::move(name)));
  }
  IteratorPtr file_iterator = make_vector_iterator(std::move(names), "from_tensor_slices");
  InterleaveFunction fn = [compression](const Element& e) -> Result<Dataset> {
    return tfrecord_definition({std::string(e.components[0].string_at(0))}, compression, 0);
  };
  return make_interleave(std::move(file_iterator), std::move(fn), cycle, 1,
                         /*parallel=*/true, /*deterministic=*/true, pipeline);
}

}  // namespace

CAPSTAN_DATASET_OP(kTfRecordKernel) = {
    .which = Op::TF_RECORD,
    .name = "tfrecord_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getTfRecord().getFiles(), out); },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_parallel(op, op.getTfRecord().getNumParallelReads(), "num_parallel_reads");
    },
    .make = make_tfrecord_source,
    .file_source = &kFileListSource<&Op::Reader::getTfRecord, &Op::Builder::getTfRecord, read_tfrecords>,
};

}  // namespace capstan::data::engine

namespace capstan::data {

Dataset tfrecord_definition(const std::vector<std::string>& files, Compression compression,
                            int64_t num_parallel_reads) {
  return build_dataset(nullptr, [&](wire::Op::Builder op) {
    auto t = op.initTfRecord();
    set_texts(t.initFiles(static_cast<unsigned>(files.size())), files);
    t.setCompression(data::to_wire(compression));
    t.setNumParallelReads(num_parallel_reads);
  });
}

}  // namespace capstan::data
