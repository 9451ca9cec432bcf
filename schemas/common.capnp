# Types every role shares: tensors, elements, errors, node identity, and the
# gate that guards every daemon.
@0xc89a092e21025445;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");

enum DType {
  invalid @0;
  float16 @1;
  bfloat16 @2;
  float32 @3;
  float64 @4;
  int8 @5;
  int16 @6;
  int32 @7;
  int64 @8;
  uint8 @9;
  bool @10;
  string @11;
}

# A row-major tensor. Small buffers travel inline in the message that carries
# the tensor. Larger ones stay with the sender, which hands out a ByteSource;
# the receiver pulls the buffer in chunks small enough for one message each, so
# a tensor of any size crosses intact while every message stays under the
# reader's traversal limit.
#
# Inline buffers above a few KiB are not copied into the message either: the
# message references the sender's memory and carries a Lease that keeps it
# alive. The receiver releases the lease when it drops the message, which it
# can only do after the message has arrived, so the memory outlives the write.
struct Tensor {
  dtype @0 :DType;
  shape @1 :List(Int64);
  union {
    inline @2 :Data;
    chunked @3 :ChunkedBuffer;
    # Only in data-service replies (getElements): the buffer compressed by
    # the data worker (lib/data/compression.h), decompressed by the reader.
    compressed @5 :CompressedBuffer;
  }
  lease @4 :Lease;
}

enum Codec {
  zstd @0;
}

# A tensor's buffer (the bytes `inline` would carry) compressed as one frame.
# The receiver checks rawSize against dtype and shape, and against its own
# limit, before it decompresses into the tensor's buffer.
struct CompressedBuffer {
  codec @0 :Codec;
  rawSize @1 :UInt64;
  data @2 :Data;
}

interface Lease {}

struct ChunkedBuffer {
  byteSize @0 :UInt64;
  chunkSize @1 :UInt32;   # every chunk but the last has exactly this size
  source @2 :ByteSource;
}

interface ByteSource {
  # Chunk i covers bytes [i * size, min((i + 1) * size, byteSize)), where size
  # is the request's chunkSize if set, else the buffer's: a receiver whose
  # reader takes larger messages asks for larger chunks (the whole buffer in
  # one message, which it can then keep instead of copying).
  read @0 (index :UInt32, chunkSize :UInt32) -> (data :Data);
}

# A tuple of tensors: what datasets yield and closures take and return.
struct Element {
  components @0 :List(Tensor);
  names @1 :List(Text);   # empty, or one name per component
}

# Status codes with the meaning of capstan::StatusCode (and absl/gRPC).
enum StatusCode {
  ok @0;
  cancelled @1;
  unknown @2;
  invalidArgument @3;
  deadlineExceeded @4;
  notFound @5;
  alreadyExists @6;
  permissionDenied @7;
  resourceExhausted @8;
  failedPrecondition @9;
  aborted @10;
  outOfRange @11;
  unimplemented @12;
  internal @13;
  unavailable @14;
  dataLoss @15;
  unauthenticated @16;
}

# An error reported as a value (e.g. one closure's failure in a batch).
# Failed calls themselves raise Cap'n Proto exceptions whose description
# starts with "[capstan:CODE] ".
struct ErrorDetail {
  code @0 :StatusCode;
  message @1 :Text;
}

enum Role {
  unknown @0;
  coordinator @1;
  ps @2;
  worker @3;
  dataDispatcher @4;
  dataWorker @5;
}

# Who a daemon is.
struct NodeInfo {
  role @0 :Role;
  taskIndex @1 :Int32;      # -1 when the daemon has no index in a cluster spec
  version @2 :Text;
  uptimeSeconds @3 :Float64;
  rpcAddress @4 :Text;      # host:port the daemon listens on
  httpPort @5 :UInt16;
  pid @6 :Int64;
  ready @7 :Bool;           # has every peer it needs (see /readyz)
  gpuCount @8 :Int32;       # CUDA devices visible (0 without CUDA)
}

# A span of work (capstan/trace.h): kind is trace::kind_name's ("closure",
# "step", "phase", "rpc", "collective", "read", "checkpoint", "schedule",
# "user"); times are nanoseconds on the daemon's trace clock.
struct TraceEvent {
  kind @0 :Text;
  name @1 :Text;
  detail @2 :Text;
  startNs @3 :Int64;
  endNs @4 :Int64;
  thread @5 :UInt32;
  async @6 :Bool;     # may overlap the thread's other spans (an RPC)
  failed @7 :Bool;
  id @8 :UInt64;
  flowIn @9 :UInt64;  # a flow (a closure's id) that ends here; 0: none
  flowOut @10 :UInt64;
}

struct TraceThread {
  index @0 :UInt32;
  name @1 :Text;
}

# A flight record: state is "started", "finished" or "failed"; endNs is 0
# while started.
struct FlightRecord {
  id @0 :UInt64;
  kind @1 :Text;
  name @2 :Text;
  detail @3 :Text;
  state @4 :Text;
  startNs @5 :Int64;
  endNs @6 :Int64;
  thread @7 :UInt32;
}

# What every role's service offers besides its own methods.
interface Node {
  info @0 () -> (info :NodeInfo);
  # Diagnostics: returns the element unchanged (tensor round trips, latency).
  echo @1 (element :Element) -> (element :Element);
  # Diagnostics: receives the element and returns its size (upload speed).
  discard @2 (element :Element) -> (byteCount :UInt64);
  # The daemon's trace clock (the caller measures its offset).
  clock @3 () -> (nowNs :Int64);
  # Records `seconds` (0 < seconds <= 600) of spans, at most `maxEvents`
  # (1 to 500000; more are counted in `dropped`), and answers them.
  # FAILED_PRECONDITION while another trace records here.
  trace @4 (seconds :Float64, maxEvents :UInt32)
      -> (events :List(TraceEvent), threads :List(TraceThread), dropped :UInt64,
          startNs :Int64, endNs :Int64);
  # The flight recorder: the last spans, oldest first, and the clock now.
  flight @5 () -> (records :List(FlightRecord), nowNs :Int64, capacity :UInt32);
}

# The bootstrap capability of every daemon. A connection holds nothing but
# the gate until it presents the cluster token; with no token configured the
# cluster is open and any token (including "") is accepted.
interface Gate {
  login @0 (token :Text, clientName :Text) -> (node :Node);
}
