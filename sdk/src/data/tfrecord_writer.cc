// The public TFRecordWriter over the pipeline engine's writer.
#include "capstan/data/tfrecord.h"

#include "data/io/tfrecord.h"

namespace capstan::data {

struct TFRecordWriter::Impl {
  std::unique_ptr<io::TFRecordWriter> writer;
};

TFRecordWriter::TFRecordWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TFRecordWriter::~TFRecordWriter() = default;

Result<std::unique_ptr<TFRecordWriter>> TFRecordWriter::open(const std::string& path, Compression compression) {
  auto writer = io::TFRecordWriter::open(
      path, compression == Compression::kGzip ? io::Compression::kGzip : io::Compression::kNone);
  if (!writer.ok()) return writer.status();
  auto impl = std::make_unique<Impl>();
  impl->writer = std::move(*writer);
  return std::unique_ptr<TFRecordWriter>(new TFRecordWriter(std::move(impl)));
}

Status TFRecordWriter::write(std::string_view record) { return impl_->writer->write(record); }

Status TFRecordWriter::close() { return impl_->writer->close(); }

}  // namespace capstan::data
