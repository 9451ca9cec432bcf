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
  # acknowledgement off. A request with the number of the previous one is a
  # retry (that reply was lost) and gets the same reply again; the next
  # number acknowledges it. `received` is how many elements of this task the
  # consumer has received: a worker that restarted skips them when it
  # rebuilds the task's pipeline.
  requestSequence @7 :Int64;
  received @8 :Int64;
  # The consumer runs on this worker's host: AUTO compression sends raw
  # (compressing only costs on loopback).
  localConsumer @9 :Bool;
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
      -> (elements :List(Common.Element), endOfSequence :Bool, pipelineError :Common.ErrorDetail);
}
