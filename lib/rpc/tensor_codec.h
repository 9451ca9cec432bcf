// Converting Tensor/Element to and from their Cap'n Proto form.
//
// Tiny buffers (under 4 KiB) are copied into the message: cheaper than any
// bookkeeping. Buffers up to `inline_limit` are referenced, not copied, by the
// message, which carries a Lease capability holding the tensor until the
// receiver drops the message. Larger ones stay with the sender: the message
// carries a ByteSource capability that holds a reference to the tensor, and the
// receiver pulls the buffer chunk by chunk, each chunk's reply referencing
// the tensor's memory directly (Orphanage::referenceExternalData). Several
// chunks are in flight at once, so the transfer streams at socket speed, and
// no message exceeds the reader's traversal limit whatever the tensor's
// size.
//
// Must be used on the thread that runs the KJ loop of the message.
#ifndef CAPSTAN_SDK_SRC_RPC_TENSOR_CODEC_H_
#define CAPSTAN_SDK_SRC_RPC_TENSOR_CODEC_H_

#include <kj/async.h>

#include <cstddef>
#include <cstdint>

#include "capstan/tensor.h"
#include "capstan_schemas/common.capnp.h"

namespace capstan::rpc {

struct CodecOptions {
  // Buffers up to this size travel inline.
  size_t inline_limit = 256 * 1024;
  // Size of each pulled chunk; must leave room under the peer's message limit.
  uint32_t chunk_size = 32u << 20;
};

// Pick chunk sizes that fit under a reader traversal limit of
// `max_message_bytes`.
CodecOptions codec_options_for(uint64_t max_message_bytes);

wire::DType to_wire(DType dtype);
// kInvalid for an unknown wire value.
DType from_wire(wire::DType dtype);

void write_tensor(wire::Tensor::Builder builder, const Tensor& tensor, const CodecOptions& options);
void write_element(wire::Element::Builder builder, const Element& element,
                   const CodecOptions& options);

// Self-contained encodings for data at rest (pipeline definitions, cache
// files): the bytes are always copied into the message, never referenced.
void write_tensor_inline(wire::Tensor::Builder builder, const Tensor& tensor);
void write_element_inline(wire::Element::Builder builder, const Element& element);
// InvalidArgument for malformed input, including a chunked tensor.
Result<Tensor> read_tensor_inline(wire::Tensor::Reader reader);
Result<Element> read_element_inline(wire::Element::Reader reader);

// An element as one self-contained byte string (a flat Cap'n Proto message),
// and back (InvalidArgument for bytes that are not one).
std::string element_to_bytes(const Element& element);
Result<Element> element_from_bytes(const std::string& bytes);

// The reader need only stay valid until the call returns: everything the
// promise still needs is copied out first. Malformed input (unknown dtype,
// negative dimension, sizes that disagree, bad string offsets) rejects the
// promise with InvalidArgument.
kj::Promise<Tensor> read_tensor(wire::Tensor::Reader reader);
kj::Promise<Element> read_element(wire::Element::Reader reader);

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_TENSOR_CODEC_H_
