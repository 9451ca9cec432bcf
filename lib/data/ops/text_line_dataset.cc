// text_line_dataset(files): one string scalar per line.
#include "data/io/text_line.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

IteratorPtr text_line_iterator(FileQueue files, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TextLineReader>>(
      std::move(files),
      [compression](const std::string& file) { return io::TextLineReader::open(file, to_io(compression)); },
      "text_line");
}

constexpr OpKernel::FileSource kTextLineSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts(op.getTextLine().getFiles()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getTextLine().getFiles(), num_workers, index);
          set_texts(op.getTextLine().initFiles(static_cast<unsigned>(mine.size())), mine);
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          return text_line_iterator(FileQueue(splits), from_wire(op.getTextLine().getCompression()));
        },
};

}  // namespace

CAPSTAN_DATASET_OP(kTextLineKernel) = {
    .which = Op::TEXT_LINE,
    .name = "text_line_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getTextLine().getFiles(), out); },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      auto t = op.getTextLine();
      return text_line_iterator(FileQueue(texts(t.getFiles())), from_wire(t.getCompression()));
    },
    .file_source = &kTextLineSource,
};

}  // namespace capstan::data::engine

namespace capstan::data {

Dataset text_line_definition(const std::vector<std::string>& files, Compression compression) {
  return build_dataset(nullptr, [&](wire::Op::Builder op) {
    auto t = op.initTextLine();
    set_texts(t.initFiles(static_cast<unsigned>(files.size())), files);
    t.setCompression(data::to_wire(compression));
  });
}

}  // namespace capstan::data
