// fixed_length_record_dataset(files, record_bytes, header_bytes,
// footer_bytes): one string scalar per fixed-size record.
#include "data/io/fixed_length.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

// The records of `files`, laid out and decompressed as `op` says.
IteratorPtr read_fixed_length(Op::Reader op, FileQueue files) {
  auto f = op.getFixedLength();
  const int64_t record_bytes = f.getRecordBytes(), header_bytes = f.getHeaderBytes(),
                footer_bytes = f.getFooterBytes();
  const Compression compression = from_wire(f.getCompression());
  return std::make_unique<FileRecordIterator<io::FixedLengthRecordReader>>(
      std::move(files),
      [=](const std::string& file) {
        return io::FixedLengthRecordReader::open(file, record_bytes, header_bytes, footer_bytes,
                                                 to_io(compression));
      },
      "fixed_length");
}

}  // namespace

CAPSTAN_DATASET_OP(kFixedLengthKernel) = {
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
      return read_fixed_length(op, FileQueue(texts(op.getFixedLength().getFiles())));
    },
    .file_source = &kFileListSource<&Op::Reader::getFixedLength, &Op::Builder::getFixedLength, read_fixed_length>,
};

}  // namespace capstan::data::engine
