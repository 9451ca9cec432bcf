# The tf.data service worker: runs task pipelines and serves their elements.
@0x92963e32f245775c;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";

struct GetElementsRequest {
  taskId @0 :Int64;
  jobClientId @1 :Int64;
  consumerIndex @2 :Int64;   # coordinated reads; -1 otherwise
  roundIndex @3 :Int64;      # coordinated reads
  maxElements @4 :Int32;     # replies carry up to this many (batching small elements)
  maxBytes @5 :Int64;
  trainerId @6 :Text;        # cross-trainer cache
  # First-come reads: 1, 2, 3, ... per (task, jobClientId); 0 turns
  # acknowledgement off. Several may be in flight (see `acknowledged`); the
  # worker serves one consumer's numbered requests to a task in their
  # order. A request with a number already served and not acknowledged is
  # a retry (that reply was lost) and gets the same reply again.
  # `received` is how many elements of this task the consumer had when it
  # sent the request: a worker that restarted skips them when it rebuilds
  # the task's pipeline.
  requestSequence @7 :Int64;
  received @8 :Int64;
  # The consumer runs on this worker's host: AUTO compression sends raw
  # (compressing only costs on loopback).
  localConsumer @9 :Bool;
  # Requests in flight (lib/data/service_reader.h has the protocol): the
  # number of the last request whose reply, and every earlier one, the
  # consumer received. The worker keeps its replies after that number (up
  # to kMaxRequestsInFlight) and drops the rest; a request with a kept
  # number is a retry and gets that reply again. -1 (an older consumer):
  # requestSequence - 1, one request at a time.
  acknowledged @10 :Int64 = -1;
  # Shared memory with a consumer on this worker's host
  # (lib/data/shm_region.h): `client` names the consumer's region on this
  # worker (0: no shared memory); `region` is the token of the region the
  # consumer mapped (0: none yet, offer one of about `regionBytes` if
  # `bootId` is this host's).
  shm :group {
    client @11 :UInt64;
    bootId @12 :Text;
    regionBytes @13 :Int64;
    region @14 :UInt64;
  }
  # The consumer takes up to this many bytes of tensors inline in one reply
  # (within its message limit): the worker sends the elements that fit in
  # it (summed in order) in the reply itself, not as ByteSources the
  # consumer pulls with one more round trip; the others' tensors over the
  # worker's inline limit (256 KiB) go as ByteSources. 0 (an older
  # consumer): no element counts as fitting.
  inlineLimit @15 :UInt64;
}

# A region a data worker offers: a sealed memfd the consumer opens as
# /proc/<pid>/fd/<fd> and checks (size, seals, token) before mapping it.
struct ShmOffer {
  pid @0 :Int64;
  fd @1 :Int32;
  token @2 :UInt64;
  bytes @3 :UInt64;
}

# A tensor of a reply that travels in the shared region: its placeholder in
# `elements` is an empty tensor of the same dtype; its bytes are
# region[offset, offset + length), a record the consumer releases when it
# drops the tensor (lib/data/shm_region.h).
struct ShmTensor {
  element @0 :UInt32;
  component @1 :UInt32;
  dtype @2 :Common.DType;
  shape @3 :List(Int64);
  offset @4 :UInt64;
  length @5 :UInt64;
}

interface DataWorker extends(Common.Node) {
  # Elements of a task, in order. endOfSequence when the task has no more;
  # an empty list without it means "none ready yet, ask again". An error of
  # the task's pipeline (an element's, or RESOURCE_EXHAUSTED over the task's
  # memory budget) comes back as pipelineError, after the elements before
  # it, so that a consumer tells it apart from a failed call: a call's
  # UNAVAILABLE or RESOURCE_EXHAUSTED (the worker is away or busy) is worth
  # retrying, the pipeline's is the consumer's to raise.
  getElements @0 (request :GetElementsRequest)
      -> (elements :List(Common.Element), endOfSequence :Bool, pipelineError :Common.ErrorDetail,
          shmOffer :ShmOffer, shmTensors :List(ShmTensor));
}
