// Compression on the wire for the tf.data service (TF's `compression`
// argument of register_dataset / distribute): a data worker compresses the
// tensors of the elements it sends, the reader decompresses them straight
// into the tensors' buffers.
//
// Glossary:
//   mode      what the dataset was registered with: AUTO (the default, as in
//             TF), NONE, ZSTD (wire::ElementCompression; parse_compression reads
//             the user's string).
//   frame     one tensor's buffer (the bytes an inline tensor carries:
//             values, or for strings offsets then bytes) as one zstd frame;
//             it travels as Tensor.compressed (schemas/common.capnp) with
//             its raw size.
//   probe     AUTO compresses the first kAutoProbeTensors eligible tensors of
//             a task and keeps compressing only while the frames come out at
//             most kAutoMaxRatio of the raw bytes; after that it still
//             compresses one eligible tensor in kAutoReprobeEvery, so a
//             pipeline whose data changes is followed.
//
// Which tensors travel compressed:
//   NONE  none.
//   ZSTD  every tensor of kZstdMinBytes..kMaxFrameRawBytes whose frame is
//         smaller than its raw bytes.
//   AUTO  none to a consumer on the worker's host (compressing only costs
//         where bytes are cheap; the bench, bench/compression_bench.cc,
//         measures it); otherwise tensors of kAutoMinBytes..kMaxFrameRawBytes
//         while the probe says they shrink, each only if its frame is at
//         most kAutoMaxRatio of its raw bytes.
//   A reply stops compressing once its frames stand for kMaxReplyRawBytes
//   raw bytes; the rest goes raw.
//
// The reader refuses (InvalidArgument, never a crash) a frame whose raw
// size disagrees with dtype x shape, exceeds kMaxFrameRawBytes, or would take
// the reply's decompressed bytes over kMaxReplyRawBytes (no decompression
// bomb), a frame that is corrupt or decompresses to another size, and an
// unknown codec.
#ifndef CAPSTAN_LIB_DATA_COMPRESSION_H_
#define CAPSTAN_LIB_DATA_COMPRESSION_H_

#include <kj/array.h>
#include <kj/async.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan_schemas/common.capnp.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

namespace capstan::data {

// zstd level 1: on census and TFRecord batches (bench/compression_bench.cc)
// level 3 shrinks 27-64 KB tensors by at most 2.5% more and 1 MB ones not
// at all, and compresses 1 MB ones 14% slower.
constexpr int kZstdLevel = 1;
constexpr size_t kZstdMinBytes = 64;
constexpr size_t kAutoMinBytes = 1024;
constexpr double kAutoMaxRatio = 0.85;
constexpr int kAutoProbeTensors = 16;
constexpr int kAutoReprobeEvery = 128;
// Bounds on what a frame and a reply's frames stand for (sender and reader).
constexpr uint64_t kMaxFrameRawBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxReplyRawBytes = uint64_t{256} << 20;

// "AUTO" or "" (the default), "NONE", "ZSTD", in any case; anything else is
// InvalidArgument naming the value and the accepted ones.
Result<wire::ElementCompression> parse_compression(std::string_view value);
// "AUTO", "NONE", "ZSTD"; "INVALID(n)" for a value outside the enum.
std::string compression_name(wire::ElementCompression compression);
// Whether `compression` is a value this build knows (a newer peer may send
// others).
bool known_compression(wire::ElementCompression compression);

// One tensor's buffer as a zstd frame, in word-aligned memory (a message can
// reference it without a copy).
struct Frame {
  kj::Array<capnp::word> storage;
  size_t size = 0;          // bytes of `storage` the frame uses
  uint64_t raw_size = 0;    // the tensor's byte_size()

  const kj::byte* data() const { return storage.asBytes().begin(); }
};

// Compresses `tensor`'s buffer (any dtype, empty included) at `level`.
// ResourceExhausted over kMaxFrameRawBytes; Internal if zstd fails.
Result<Frame> compress_tensor(const Tensor& tensor, int level = kZstdLevel);

// The reader's side of a frame: checks everything in the header comment,
// then decompresses into a new tensor of `dtype` and `shape`.
// `reply_raw_bytes` accumulates the raw bytes of one reply's frames.
Result<Tensor> decompress_tensor(DType dtype, const Shape& shape, wire::Codec codec, uint64_t raw_size,
                                 const kj::byte* frame, size_t frame_size, uint64_t* reply_raw_bytes);

// What one element of a reply sends compressed: frames[i] for component i,
// null for a component sent raw; empty when nothing is compressed.
using ElementFrames = std::vector<std::shared_ptr<const Frame>>;

// Decides, tensor by tensor, what a task's replies send compressed (the
// rules in the header comment) and compresses it. Thread-safe: concurrent
// getElements calls of one task share it.
class WireCompressor {
 public:
  explicit WireCompressor(wire::ElementCompression mode, int level = kZstdLevel);

  // Whether any tensor of a reply to this consumer can be compressed (when
  // not, frames() returns empties without looking).
  bool active(bool local_consumer) const;
  // One ElementFrames per element. Called on the worker's pool.
  std::vector<ElementFrames> frames(const std::vector<Element>& elements, bool local_consumer);

  // AUTO: whether the probe currently says compress.
  bool auto_compressing() const;

 private:
  // Whether to compress a tensor of `bytes` (AUTO: the probe's say).
  bool should_try(size_t bytes);
  void record(uint64_t raw, uint64_t compressed);

  const wire::ElementCompression mode_;
  const int level_;

  mutable Mutex mutex_;
  int64_t probed_ GUARDED_BY(mutex_) = 0;       // tensors compressed to learn the ratio
  int64_t skipped_ GUARDED_BY(mutex_) = 0;      // eligible tensors sent raw since the last probe
  uint64_t probe_raw_ GUARDED_BY(mutex_) = 0;   // decayed sums over the probes
  uint64_t probe_wire_ GUARDED_BY(mutex_) = 0;
  bool compressing_ GUARDED_BY(mutex_) = true;  // AUTO: the probe's verdict
};

// write_element / read_element of rpc/tensor_codec.h, with compressed
// components. An empty `frames` writes exactly what rpc::write_element does.
// Must be called on the message's loop thread; the frames stay alive with
// the message (a Lease holds them).
void write_element(wire::Element::Builder builder, const Element& element, const ElementFrames& frames,
                   const rpc::CodecOptions& options);
// Decompresses compressed components at once (on the calling thread) and
// reads the others with rpc::read_tensor. `reply_raw_bytes` must stay valid
// only until the call returns.
kj::Promise<Element> read_element(wire::Element::Reader reader, uint64_t* reply_raw_bytes);

// Whether `address` ("host:port") names this host: a loopback address,
// localhost, this host's name, or an address of one of its interfaces. A
// name it would have to resolve counts as remote.
bool is_local_address(const std::string& address);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_COMPRESSION_H_
