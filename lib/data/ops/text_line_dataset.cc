// text_line_dataset(files): one string scalar per line.
#include "data/io/text_line.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

// The lines of `files`, decompressed as `op` says.
IteratorPtr read_text_lines(Op::Reader op, FileQueue files) {
  const Compression compression = from_wire(op.getTextLine().getCompression());
  return std::make_unique<FileRecordIterator<io::TextLineReader>>(
      std::move(files),
      [compression](const std::string& file) { return io::TextLineReader::open(file, to_io(compression)); },
      "text_line");
}

}  // namespace

CAPSTAN_DATASET_OP(kTextLineKernel) = {
    .which = Op::TEXT_LINE,
    .name = "text_line_dataset",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { describe_files(op.getTextLine().getFiles(), out); },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return read_text_lines(op, FileQueue(texts(op.getTextLine().getFiles())));
    },
    .file_source = &kFileListSource<&Op::Reader::getTextLine, &Op::Builder::getTextLine, read_text_lines>,
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
