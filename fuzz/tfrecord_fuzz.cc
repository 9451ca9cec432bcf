// TFRecord files (plain and GZIP): framing, CRCs, truncation. read() and
// read_tensor() (which parses plain files in place from its chunk) must give
// the same records and the same error on every input, or the harness aborts.
#include <cstdlib>

#include "data/io/tfrecord.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using capstan::data::io::Compression;
  using capstan::data::io::TFRecordReader;
  capstan::fuzz::InputFile file(data, size);
  for (Compression c : {Compression::kNone, Compression::kGzip}) {
    auto strings = TFRecordReader::open(file.path(), c);
    auto tensors = TFRecordReader::open(file.path(), c);
    if (!strings.ok() || !tensors.ok()) continue;
    std::string record;
    capstan::Tensor tensor;
    for (int i = 0; i < 1000; ++i) {
      auto more = (*strings)->read(&record);
      auto more_tensor = (*tensors)->read_tensor(&tensor);
      if (more.ok() != more_tensor.ok()) std::abort();
      if (!more.ok()) {
        if (more.status().to_string() != more_tensor.status().to_string()) std::abort();
        break;
      }
      if (*more != *more_tensor) std::abort();
      if (!*more) break;
      if (tensor.string_at(0) != record || (*strings)->offset() != (*tensors)->offset()) std::abort();
    }
  }
  return 0;
}
