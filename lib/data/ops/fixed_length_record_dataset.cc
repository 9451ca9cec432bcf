// fixed_length_record_dataset(files, record_bytes, header_bytes,
// footer_bytes): one string scalar per fixed-size record.
#include "data/io/fixed_length.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

IteratorPtr fixed_length_iterator(FileQueue files, int64_t record_bytes, int64_t header_bytes,
                                  int64_t footer_bytes, Compression compression) {
  return std::make_unique<FileRecordIterator<io::FixedLengthRecordReader>>(
      std::move(files),
      [=](const std::string& file) {
        return io::FixedLengthRecordReader::open(file, record_bytes, header_bytes, footer_bytes,
                                                 to_io(compression));
      },
      "fixed_length");
}

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
          return fixed_length_iterator(FileQueue(splits), f.getRecordBytes(), f.getHeaderBytes(), f.getFooterBytes(),
                                       from_wire(f.getCompression()));
        },
};

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
      auto f = op.getFixedLength();
      return fixed_length_iterator(FileQueue(texts(f.getFiles())), f.getRecordBytes(), f.getHeaderBytes(),
                                   f.getFooterBytes(), from_wire(f.getCompression()));
    },
    .file_source = &kFixedLengthSource,
};

}  // namespace capstan::data::engine
