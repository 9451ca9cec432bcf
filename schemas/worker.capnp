# The worker (TensorFlow's /job:worker): runs closures.
@0xb5935e4722569e80;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";

interface Worker extends(Common.Node) {
  # Runs a registered closure with `args`. `attempt` is 1 for a closure's
  # first run and grows each time it is re-queued after a worker failure;
  # `numWorkers` is the number of workers registered when it was dispatched.
  # `deadlineUnixMs` (0: none) is when the coordinator gives up on the run
  # (its closure_timeout_ms).
  # `workerIndex` is this worker's task index as the coordinator knows it
  # (given or assigned); -1 from a coordinator older than the field.
  runClosure @0 (closureId :Int64, function :Text, args :Common.Element,
                 placementVersion :Int64, attempt :UInt32, numWorkers :UInt32,
                 deadlineUnixMs :Int64, workerIndex :Int32 = -1)
      -> (result :Common.Element);
  # Builds this worker's iterator of a per-worker dataset: `definition` is
  # the serialized pipeline already specialised for this worker.
  createDataset @1 (datasetId :Int64, definition :Data) -> ();
  # Builds this worker's iterator from a dataset function of its modules,
  # called with the input context (numWorkers, workerIndex).
  createDatasetFromFunction @2 (datasetId :Int64, function :Text, numWorkers :Int32,
                                workerIndex :Int32) -> ();
  # Cancels a closure this worker runs (or is about to run): its context's
  # cancelled() turns true and its result is abandoned (the runClosure call
  # answers Cancelled). Unknown ids are remembered briefly (the cancel may
  # overtake the run) and otherwise ignored.
  cancelClosure @3 (closureId :Int64) -> ();
}
