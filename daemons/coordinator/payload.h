// Closure payloads (arguments and values) as the coordinator holds them: one
// flat Element message each (rpc::element_to_bytes), as the program encoded
// it. The coordinator keeps, journals and forwards those bytes and never
// decodes them; only a payload that came or goes as a Common.Element (an
// older client or worker, or one larger than the connection's inline limit,
// whose tensors travel in chunks) is converted, here.
//
// Must be used on the thread of the KJ loop of the messages.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PAYLOAD_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PAYLOAD_H_

#include <capnp/common.h>
#include <capnp/serialize.h>
#include <kj/async.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "capstan/status.h"
#include "capstan_schemas/common.capnp.h"
#include "rpc/tensor_codec.h"

namespace capstan::coordinator {

inline std::string payload_of(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

inline kj::ArrayPtr<const kj::byte> payload_bytes(const std::string& payload) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(payload.data()), payload.size());
}

// InvalidArgument unless `data` is framed as one flat Cap'n Proto message
// (whole words, a segment table that adds up to its size). Checks the frame
// only, in time independent of the payload's size: a truncated or padded
// payload is refused when it is scheduled; the worker reads the contents.
inline Status check_payload_frame(capnp::Data::Reader data) {
  if (data.size() == 0 || data.size() % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("encodedArgs of " + std::to_string(data.size()) +
                                   " bytes is not a flat message (send rpc::element_to_bytes of the arguments)");
  }
  // The segment table is in the first words; read from an aligned copy.
  constexpr size_t kTableWords = 64;
  capnp::word table[kTableWords];
  size_t words = std::min(kTableWords, data.size() / sizeof(capnp::word));
  std::memcpy(table, data.begin(), words * sizeof(capnp::word));
  size_t expected = 0;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 expected = capnp::expectedSizeInWordsFromPrefix(kj::arrayPtr(table, words));
               })) {
    return Status::InvalidArgument(std::string("encodedArgs is not a flat message: ") + e->getDescription().cStr());
  }
  if (expected != data.size() / sizeof(capnp::word)) {
    return Status::InvalidArgument("encodedArgs of " + std::to_string(data.size()) + " bytes frames a message of " +
                                   std::to_string(expected * sizeof(capnp::word)) +
                                   " bytes (truncated or padded; send rpc::element_to_bytes of the arguments)");
  }
  return Status::Ok();
}

// A payload that came as a Common.Element, as the flat message it is kept as.
inline kj::Promise<std::string> payload_from_element(wire::Element::Reader element) {
  return rpc::read_element(element).then([](Element&& read) { return rpc::element_to_bytes(read); });
}

// Writes `payload` as a Common.Element (for a caller that does not take the
// encoded form, or a payload past the inline limit: its tensors are then
// referenced or pulled in chunks). InvalidArgument for bytes that are not an
// element, which the worker that produced them would have refused.
inline Status write_payload_element(wire::Element::Builder out, const std::string& payload,
                                    const rpc::CodecOptions& codec) {
  CAPSTAN_ASSIGN_OR_RETURN(Element element, rpc::element_from_bytes(payload));
  rpc::write_element(out, element, codec);
  return Status::Ok();
}

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PAYLOAD_H_
