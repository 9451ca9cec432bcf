// Safetensors files: the JSON header (offsets, dtypes, shapes) and reads.
#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capstan::fuzz::InputFile file(data, size);
  auto reader = capstan::checkpoint::SafetensorsReader::open(file.path());
  if (!reader.ok()) return 0;
  for (const auto& name : (*reader)->names()) {
    (void)(*reader)->read(name);
    (void)(*reader)->read_rows(name, 0, 1);
  }
  return 0;
}
