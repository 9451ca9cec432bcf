// The tensor codec: a wire Element (Cap'n Proto) from outside bytes.
#include <capnp/serialize.h>

#include "fuzz/fuzz_util.h"
#include "rpc/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size % sizeof(capnp::word) != 0) return 0;
  kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(data), size / sizeof(capnp::word));
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 1 << 20;
    capnp::FlatArrayMessageReader message(words, options);
    (void)capstan::rpc::read_element_inline(message.getRoot<capstan::wire::Element>());
  } catch (const kj::Exception&) {
    // Malformed framing: Cap'n Proto refuses it.
  }
  return 0;
}
