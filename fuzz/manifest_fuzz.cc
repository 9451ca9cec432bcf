// Checkpoint manifests and the checkpoint index (JSON).
#include "checkpoint/manifest.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string json = capstan::fuzz::as_string(data, size);
  (void)capstan::checkpoint::parse_manifest(json, "fuzz");
  (void)capstan::checkpoint::parse_checkpoint_index(json, "fuzz");
  return 0;
}
