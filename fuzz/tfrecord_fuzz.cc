// TFRecord files (plain and GZIP): framing, CRCs, truncation.
#include "data/io/tfrecord.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using capstan::data::io::Compression;
  capstan::fuzz::InputFile file(data, size);
  for (Compression c : {Compression::kNone, Compression::kGzip}) {
    auto reader = capstan::data::io::TFRecordReader::open(file.path(), c);
    if (!reader.ok()) continue;
    std::string record;
    for (int i = 0; i < 1000; ++i) {
      auto more = (*reader)->read(&record);
      if (!more.ok() || !*more) break;
    }
  }
  return 0;
}
