# The coordinator (TensorFlow's ClusterCoordinator and chief): membership,
# variable placement, the closure queue and checkpoints.
@0x8c4793cdb188e999;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";
using Ps = import "ps.capnp";
using W = import "worker.capnp";

struct Partitioner {
  kind @0 :Text;              # "none", "fixed_shards", "min_size", "max_size"
  numShards @1 :Int64;
  minShardBytes @2 :Int64;
  maxShardBytes @3 :Int64;
  maxShards @4 :Int64;
  bytesPerString @5 :Int64;
}

struct VariableSpec {
  name @0 :Text;
  initial @1 :Common.Tensor;  # the whole initial value (older callers, small values)
  optimizer @2 :Ps.OptimizerConfig;
  partitioner @3 :Partitioner;
  # Instead of `initial` (unset): the variable is `dtype` and `shape`, and
  # its value is `initializer`'s, computed by the parameter servers
  # (initializer set), or zeros that the program then overwrites shard by
  # shard with ParameterServer.assignRows (valueFromProgram), telling the
  # coordinator with variableWritten.
  initializer @4 :Ps.Initializer;
  dtype @5 :Common.DType;
  shape @6 :List(Int64);
  valueFromProgram @7 :Bool;
}

struct ShardPlacement {
  name @0 :Text;              # "w/part_0"
  psTask @1 :Int32;
  psAddress @2 :Text;
  firstRow @3 :Int64;
  rows @4 :Int64;
}

struct VariablePlacement {
  name @0 :Text;
  dtype @1 :Common.DType;
  shape @2 :List(Int64);
  shards @3 :List(ShardPlacement);
  # An embedding table: one shard per parameter server, by task; key k on
  # shard table_shard_of(k, number of shards). shape is [0, dim].
  isTable @4 :Bool;
  table @5 :Ps.TableConfig;
}

struct Placements {
  version @0 :Int64;
  variables @1 :List(VariablePlacement);
}

# Synchronous training (MirroredStrategy, the worker-servers as replicas).
struct MirroredVariableSpec {
  name @0 :Text;
  initial @1 :Common.Tensor;    # float32 or float64
  optimizer @2 :Ps.OptimizerConfig;
}

struct StrategyOptions {
  minReplicas @0 :Int32;        # a step waits (up to timeoutMs) for this many workers
  settings @1 :W.CollectiveSettings;
}

struct ReplicaInfo {
  workerId @0 :Int64;
  taskIndex @1 :Int32;
  rank @2 :Int32;
  holds @3 :Bool;
  step @4 :Int64;
  checksum @5 :UInt64;
  error @6 :Text;               # why the worker did not answer; empty when it did
}

struct ReportedScalar {
  tag @0 :Text;      # "loss", "train/accuracy": at most 128 bytes
  value @1 :Float64; # finite
  step @2 :Int64;
}

interface Coordinator extends(Common.Node) {
  # A worker joins; the coordinator calls back through `worker`.
  registerWorker @0 (worker :W.Worker, taskIndex :Int32, functions :List(Text), address :Text)
      -> (workerId :Int64, taskIndex :Int32);
  # `address`: the worker's advertised RPC address, shown on the status page
  # (empty from a worker that does not know it yet).
  # taskIndex -1: the coordinator assigns the lowest index no registered
  # worker has, and answers with it.
  # `awaitingValue`: the program must write the value (spec.valueFromProgram;
  # the variable is new, or an earlier program did not finish writing it),
  # then call variableWritten.
  createVariable @1 (spec :VariableSpec) -> (placement :VariablePlacement, awaitingValue :Bool);
  placements @2 () -> (placements :Placements);
  # (clientId, requestSeq), when clientId is not 0, names the request: a
  # retry of one the coordinator has seen answers the same closure instead
  # of scheduling it again. The reply comes once the closure is journaled
  # (with work_dir); `durable` says the coordinator keeps its queue and
  # results across a restart, so a client may retry after reconnecting.
  # `encodedArgs` (when set, instead of `args`): see ScheduleEntry.
  schedule @3 (function :Text, args :Common.Element, clientId :UInt64, requestSeq :Int64,
               encodedArgs :Data)
      -> (closureId :Int64, durable :Bool);
  join @4 () -> ();
  done @5 () -> (done :Bool);
  # `encoded`: the caller takes the value as `encodedValue` (see
  # ScheduleEntry.encodedArgs), which the coordinator answers unless the
  # value is larger than its inline limit (then `value`, as without).
  fetch @6 (closureId :Int64, encoded :Bool) -> (value :Common.Element, encodedValue :Data);
  # The program will not fetch these closures again (their RemoteValues
  # went): their values are dropped (those still queued or running, when
  # they finish). Releasing one twice is fine. INVALID_ARGUMENT, nothing
  # released, for an id never handed out or more than 65536 ids. A non-zero
  # clientId counts as the client heard from: the SDK sends an empty list
  # as a heartbeat, and a client silent for the coordinator's
  # client_grace_ms has all its values released. `incarnation`: the
  # scheduleMany answer's, that the ids came with; ids from another
  # coordinator process (one restarted without its journal, whose ids mean
  # other closures) are ignored. 0: any.
  release @7 (closureIds :List(Int64), clientId :UInt64, incarnation :UInt64) -> ();
  # Per-worker datasets: the definition of each worker's pipeline comes from
  # `definition` with SHARD_HINT resolved to (numWorkers, workerIndex). A
  # non-empty `name` finds the dataset of that name again (a program that
  # restarted): the same id, its iterators where they were; ALREADY_EXISTS
  # when the definition differs.
  createPerWorkerDataset @8 (definition :Data, name :Text) -> (datasetId :Int64);
  saveCheckpoint @9 (directory :Text, step :Int64, maxToKeep :Int32) -> (path :Text);
  # TF's default restores the variables the checkpoint has and leaves the
  # others (listed in notInCheckpoint); strict refuses them (NOT_FOUND).
  restoreCheckpoint @10 (path :Text, strict :Bool) -> (step :Int64, notInCheckpoint :List(Text));
  numWorkers @11 () -> (count :Int32);
  # The closures the registered workers have (union), for clients that
  # check names before pipelining schedule calls.
  closureNames @12 () -> (names :List(Text));
  # Per-worker datasets from a dataset function the workers' modules
  # register: each worker calls it with its input context.
  createPerWorkerDatasetFromFunction @13 (function :Text, name :Text) -> (datasetId :Int64);
  # Whether the coordinator still counts this worker (it drops workers that
  # stop answering pings; a worker that wakes up registers again).
  workerAlive @14 (workerId :Int64) -> (alive :Bool);
  # Collective groups (capstan/collectives.h): joins the next group `name`
  # of `size` ranks as `rank` (-1: the lowest free one), reachable at
  # `address` (its CollectiveEndpoint). Returns when all `size` have joined,
  # with every member's address by rank and the group's generation (one
  # more each time a group of that name forms); UNAVAILABLE naming the
  # missing ranks after timeoutMs.
  joinGroup @15 (name :Text, size :Int32, rank :Int32, address :Text, timeoutMs :Int64)
      -> (generation :Int64, rank :Int32, addresses :List(Text));
  # Creates strategy `name` with its mirrored variables (or, for a
  # reconnecting program, finds it: the same names, dtypes and shapes).
  # `durable`: the coordinator journals its strategies (work_dir), so a
  # program whose link breaks reconnects and goes on.
  createStrategy @16 (name :Text, variables :List(MirroredVariableSpec), options :StrategyOptions)
      -> (durable :Bool);
  # One synchronous step: `function` runs on every live worker at once, as
  # the replicas of one group (re-formed first when the workers changed or
  # the last step failed). The values by replica, the steps run, the
  # group's epoch and the replicas' task indexes.
  # With a step input (distributeStepInput), `examples` are the examples
  # each replica took and `inputPosition` the input's positions consumed
  # after this step.
  runStep @17 (strategy :Text, function :Text, args :Common.Element)
      -> (values :List(Common.Element), step :Int64, epoch :Int64, taskIndexes :List(Int32),
          examples :List(Int64), inputPosition :Int64);
  # A mirrored variable's value (replica 0's) and the optimizer step.
  readMirrored @18 (strategy :Text, name :Text) -> (value :Common.Tensor, step :Int64);
  # The group and every replica's step and checksum.
  strategyStatus @19 (strategy :Text) -> (epoch :Int64, steps :Int64, replicas :List(ReplicaInfo));
  # A worker that is leaving (SIGTERM: preemption, a rolling restart): it
  # gets no more closures or steps; returns once the closures it runs have
  # finished and their results are in, a checkpoint is saved when the
  # coordinator's checkpoint_dir is set (checkpoint_on_preemption), and it
  # is no longer counted. NOT_FOUND for an unknown worker id.
  leaveWorker @20 (workerId :Int64, reason :Text) -> ();
  # A program's training figures (loss, accuracy, examples/s) for the
  # status page's plots: the coordinator keeps the last 600 points of at
  # most 32 tags.
  reportScalars @21 (scalars :List(ReportedScalar)) -> ();
  # Dynamic embedding tables (EmbeddingTableSpec): one shard on every
  # parameter server. Idempotent for the same spec (a reconnecting program).
  createEmbeddingTable @22 (name :Text, config :Ps.TableConfig) -> (placement :VariablePlacement);
  # Writes the rows of a table changed since checkpoint `sinceCheckpoint`
  # (empty: every row) to a safetensors file at `path` on the coordinator's
  # machine; the number of rows written.
  exportEmbeddingTable @23 (name :Text, sinceCheckpoint :Text, path :Text) -> (rows :Int64);
  # schedule for several closures in one call (a program that schedules
  # faster than the round trip sends what piled up meanwhile together).
  # Each entry is handled as its own schedule call, in order, with the
  # same clientId: a retry of an entry answers the closure it scheduled;
  # an entry's error is that entry's outcome and does not stop the ones
  # after it. At most 4096 entries (INVALID_ARGUMENT beyond). Answered
  # once every entry is journaled. `values` fetches the entries' values by
  # index: a program calls it pipelined, before this call's answer has
  # come (Cap'n Proto promise pipelining), so a fetch right after schedule
  # costs no extra round trip.
  # `releases`: closure ids released as by `release` (with
  # `releaseIncarnation`), carried here so that a program dropping
  # RemoteValues costs no call of its own. `incarnation`: random for each
  # coordinator process without a journal (its closure ids start again at
  # 1); 0 for a durable one, whose ids outlive a restart.
  scheduleMany @24 (entries :List(ScheduleEntry), clientId :UInt64, releases :List(Int64),
                    releaseIncarnation :UInt64)
      -> (outcomes :List(ScheduleOutcome), durable :Bool, values :ClosureValues, incarnation :UInt64);
  # The program has written the whole value of variable `name`, created
  # with valueFromProgram (journaled: a restarted coordinator no longer
  # asks for it). NOT_FOUND for an unknown variable.
  variableWritten @25 (name :Text) -> ();
  # Gives strategy `strategy` its step input (exactly-once input): the
  # finite dataset `definition` (serialized Dataset), held whole by every
  # worker, of which each step takes the next positions (a fresh
  # permutation each epoch from `seed` when `shuffle`), split among the
  # step's replicas: `globalBatch` examples a step among however many
  # replicas there are, or `perReplicaBatch` each (exactly one > 0). A
  # failed step's positions go to the next step. The per-worker dataset's
  # id: pass its argument to the step's closure. The same call again (a
  # reconnecting program) hands back the same id.
  distributeStepInput @26 (strategy :Text, definition :Data, globalBatch :Int64, perReplicaBatch :Int64,
                           seed :UInt64, shuffle :Bool) -> (datasetId :Int64);
  # Where each registered worker's time went and how slow it is: its runs
  # (closures and synchronous steps), their phases summed, and its
  # straggler score (WorkerTimes); `totals`: every run's, of every worker
  # the coordinator has seen (taskIndex -1).
  workerStats @27 () -> (workers :List(WorkerStats), totals :WorkerStats);
  # The daemons of the cluster this coordinator knows: itself, its
  # parameter servers and its registered workers (capstanctl trace and dump
  # ask each of them).
  members @28 () -> (members :List(ClusterMember));
}

struct ClusterMember {
  role @0 :Common.Role;
  taskIndex @1 :Int32;
  address @2 :Text;
}

# Seconds, summed over a worker's runs: queued at the coordinator, then on
# the worker waiting for input, the parameter servers and the collectives,
# out of `total` (the runs' wall time there). `busy`: the smoothed seconds
# per run, collectives left out; `score`: that relative to the median
# worker's (NaN until the worker has run enough); `straggler`: the log named
# it slow.
struct WorkerStats {
  taskIndex @0 :Int32;
  address @1 :Text;
  runs @2 :Int64;
  queued @3 :Float64;
  input @4 :Float64;
  ps @5 :Float64;
  collective @6 :Float64;
  total @7 :Float64;
  busy @8 :Float64;
  score @9 :Float64;
  straggler @10 :Bool;
}

interface ClosureValues {
  # fetch of entry `index` of the scheduleMany call that returned this: its
  # value once it has finished, or the entry's or the closure's error.
  # INVALID_ARGUMENT for an index past the entries.
  # `encoded`: as Coordinator.fetch's.
  fetch @0 (index :UInt32, encoded :Bool) -> (value :Common.Element, encodedValue :Data);
}

struct ScheduleEntry {
  function @0 :Text;
  args @1 :Common.Element;
  requestSeq @2 :Int64;
  # The arguments as one flat Element message (rpc::element_to_bytes), set
  # instead of `args`: the coordinator keeps, journals and hands these bytes
  # to the worker as they are, never decoding them. For arguments whose
  # encoding fits the connection's inline limit; larger ones go as `args`
  # (their tensors pulled in chunks).
  encodedArgs @3 :Data;
}

struct ScheduleOutcome {
  union {
    closureId @0 :Int64;
    error @1 :Common.ErrorDetail;
  }
}
