// The tensor codec: a wire Element (Cap'n Proto) from outside bytes, as a
// cache, snapshot or closure-argument file hands it to element_from_bytes.
#include <string>

#include "fuzz/fuzz_util.h"
#include "rpc/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  // Malformed input is an InvalidArgument result, never a throw or a crash.
  (void)capstan::rpc::element_from_bytes(bytes);
  return 0;
}
