# The worker (TensorFlow's /job:worker): runs closures.
@0xb5935e4722569e80;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";
using Ps = import "ps.capnp";

# Synchronous training (MirroredStrategy): a worker holds a replica of each
# strategy's mirrored variables. The coordinator forms the replicas into a
# collective group at step boundaries (prepareReplica, then formReplica on
# every member), runs each step's closure on every member at once
# (runClosure with `strategy` and `epoch`), and has rank 0 write the
# strategy's file of a checkpoint itself (saveReplica); a restore sends the
# source the checkpoint's path, not the values (formReplica's
# seedCheckpoint).

struct MirroredSpec {
  name @0 :Text;
  dtype @1 :Common.DType;
  shape @2 :List(Int64);
  optimizer @3 :Ps.OptimizerConfig;
}

struct MirroredValue {
  name @0 :Text;
  value @1 :Common.Tensor;
  slotNames @2 :List(Text);     # the parameter servers' slot names
  slots @3 :List(Common.Tensor);
}

struct MirroredState {
  step @0 :Int64;               # optimizer steps applied
  variables @1 :List(MirroredValue);
}

struct CollectiveSettings {
  timeoutMs @0 :Int64;
  transport @1 :Text;           # "auto", "tcp", "shm"
  tcpStreams @2 :Int32;
}

# The positions [start, start + count) of a strategy's step input that this
# replica reads in this step; the step as a whole takes [first, end) (see
# lib/types/replica.h StepInput).
struct StepInput {
  datasetId @0 :Int64;
  start @1 :Int64;
  count @2 :Int64;
  first @3 :Int64;
  end @4 :Int64;
  seed @5 :UInt64;
  shuffle @6 :Bool;
  weight @7 :Float64;
}

struct ClosureRunSpec {
  closureId @0 :Int64;
  function @1 :Text;
  args @2 :Common.Element;
  placementVersion @3 :Int64;
  attempt @4 :UInt32;
  numWorkers @5 :UInt32;
  deadlineUnixMs @6 :Int64;
  workerIndex @7 :Int32 = -1;
  # The arguments as the program encoded them (ScheduleEntry.encodedArgs),
  # set instead of `args`; the worker then answers `encodedValue`.
  encodedArgs @8 :Data;
}

# Where a run's time went on the worker, in seconds (capstan/phases.h):
# waiting for input, the parameter servers and the collectives; `total` is
# the run's wall time there (compute: what the others leave of it).
struct RunPhases {
  input @0 :Float64;
  ps @1 :Float64;
  collective @2 :Float64;
  total @3 :Float64;
}

struct ClosureOutcome {
  # A value's run: where its time went.
  phases @3 :RunPhases;
  union {
    value @0 :Common.Element;
    error @1 :Common.ErrorDetail;
    # The value as one flat Element message (rpc::element_to_bytes): the
    # answer to a run sent with encodedArgs, unless the value is larger than
    # the worker's inline limit (then `value`).
    encodedValue @2 :Data;
  }
}

interface Worker extends(Common.Node) {
  # Runs a registered closure with `args`. `attempt` is 1 for a closure's
  # first run and grows each time it is re-queued after a worker failure;
  # `numWorkers` is the number of workers registered when it was dispatched.
  # `deadlineUnixMs` (0: none) is when the coordinator gives up on the run
  # (its closure_timeout_ms).
  # `workerIndex` is this worker's task index as the coordinator knows it
  # (given or assigned); -1 from a coordinator older than the field.
  # A synchronous step names its strategy and the epoch (generation) of the
  # group it runs in; the closure then reaches the group and the mirrored
  # variables through its context.
  # `encodedArgs` (as ClosureRunSpec's), set instead of `args`: the value
  # comes back as `encodedResult`, unless it is larger than the worker's
  # inline limit (then `result`).
  # `stepInput` (hasStepInput): a synchronous step's share of its
  # strategy's exactly-once input (StepInput); `inputTaken`: the closure
  # read it (the step consumed its positions). `phases`: where the run's
  # time went.
  runClosure @0 (closureId :Int64, function :Text, args :Common.Element,
                 placementVersion :Int64, attempt :UInt32, numWorkers :UInt32,
                 deadlineUnixMs :Int64, workerIndex :Int32 = -1,
                 strategy :Text, epoch :Int64, encodedArgs :Data,
                 stepInput :StepInput, hasStepInput :Bool)
      -> (result :Common.Element, encodedResult :Data, inputTaken :Bool, phases :RunPhases);
  # Several closures of the parameter-server kind (no strategy) in one
  # call, run one after another in the order given, as if each had come
  # in its own runClosure: the coordinator batches them when its queue is
  # deep, so a worker still runs one closure at a time per slot. The
  # outcomes come back together, one per run, in the same order. After a
  # run fails, the runs after it are not started: they answer ABORTED
  # (run lost, the coordinator queues them again, or drops them when the
  # failure cancelled them). At most 1024 runs (INVALID_ARGUMENT beyond).
  runClosures @11 (runs :List(ClosureRunSpec)) -> (outcomes :List(ClosureOutcome));
  # Builds this worker's iterator of a per-worker dataset: `definition` is
  # the serialized pipeline already specialised for this worker. `uid`
  # names the dataset across coordinator restarts (0: none): a worker that
  # registers again with a restarted coordinator keeps the iterator of a
  # dataset it is sent again with the same uid, where it was.
  createDataset @1 (datasetId :Int64, definition :Data, uid :UInt64) -> ();
  # Builds this worker's iterator from a dataset function of its modules,
  # called with the input context (numWorkers, workerIndex).
  createDatasetFromFunction @2 (datasetId :Int64, function :Text, numWorkers :Int32,
                                workerIndex :Int32, uid :UInt64) -> ();
  # Cancels a closure this worker runs (or is about to run): its context's
  # cancelled() turns true and its result is abandoned (the runClosure call
  # answers Cancelled). Unknown ids are remembered briefly (the cancel may
  # overtake the run) and otherwise ignored.
  cancelClosure @3 (closureId :Int64) -> ();

  # Whether this worker holds a replica of `strategy`'s variables, their
  # optimizer step and a checksum of values, slots and step, and how far
  # the strategy's step input was consumed with them.
  replicaStatus @4 (strategy :Text) -> (holds :Bool, step :Int64, checksum :UInt64, inputPosition :Int64);
  # Listens for the group of `epoch` on this worker's collective host;
  # answers the address the other members dial.
  prepareReplica @5 (strategy :Text, epoch :Int64) -> (address :Text);
  # Forms the group (this worker is `rank` of addresses.size()) and brings
  # the replica to the state of member `source`: the source sends it, from
  # `seed` when hasSeed (initial values, a restored checkpoint) or from what
  # it holds; the others take it. Answers the replica's step and checksum
  # and how it reaches each member ("self", "shm", "tcp").
  # `seedCheckpoint` (the source only; "": none): the source reads the
  # variables `seedFromCheckpoint` from the committed checkpoint at that
  # path itself (values, slots of the same optimizer kind, the step; each
  # file's CRC32C checked) and takes the others from `seed` (hasSeed).
  formReplica @6 (strategy :Text, epoch :Int64, rank :Int32, addresses :List(Text), source :Int32,
                  variables :List(MirroredSpec), seed :MirroredState, hasSeed :Bool,
                  settings :CollectiveSettings, seedCheckpoint :Text, seedFromCheckpoint :List(Text),
                  inputPosition :Int64)
      -> (step :Int64, checksum :UInt64, transports :List(Text));
  # The replica's values, slots and step (reads of a mirrored variable).
  readReplica @7 (strategy :Text) -> (state :MirroredState);
  # Aborts the group of `epoch` (a member was lost mid-step): a step
  # running here fails at once instead of waiting for its deadline.
  abortReplica @8 (strategy :Text, epoch :Int64, reason :Text) -> ();

  # The position of this worker's iterator of a per-worker dataset
  # (Iterator::save), for a model checkpoint; NOT_FOUND when it has none.
  saveIterator @9 (datasetId :Int64) -> (state :Data);
  # Replaces that iterator with a new one of the same dataset restored to
  # `state`; INVALID_ARGUMENT for a state of another dataset (the old
  # iterator stays).
  restoreIterator @10 (datasetId :Int64, state :Data) -> ();

  # Writes this replica's variables, slots and step as
  # `directory`/mirrored-<strategy>.safetensors (checkpoint/mirrored_files.h):
  # the state at a step boundary (taken under the replica's lock, as
  # readReplica's), written after it is released. `directory` must be a
  # checkpoint being saved (<dir>/ckpt-<step>.tmp, existing here:
  # INVALID_ARGUMENT, NOT_FOUND) and the file must not exist
  # (ALREADY_EXISTS); NOT_FOUND when this worker holds no replica. Answers
  # the file's name, size and CRC32C (computed as it was written), the step
  # and each variable's dtype, shape and slots, for the manifest.
  saveReplica @12 (strategy :Text, directory :Text)
      -> (file :Text, size :UInt64, crc32c :UInt32, step :Int64, variables :List(Ps.SavedShard));
}
