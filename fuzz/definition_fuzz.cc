// Dataset definitions (what clients register with the data service).
#include "capstan/data/dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto dataset = capstan::data::Dataset::deserialize(capstan::fuzz::as_string(data, size));
  if (dataset.ok()) {
    (void)dataset->debug_string();
    (void)dataset->cardinality();
  }
  return 0;
}
