# The tf.data service dispatcher: datasets, jobs, tasks and splits.
@0xe3479fb2b64b2584;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";

# Split providers of a DYNAMIC job (one per source of its pipeline): more than
# any real pipeline has; a bound on what a job or a TaskDef can make a daemon
# allocate.
const maxSplitProviders :Int64 = 1024;

enum ProcessingMode {
  off @0;          # every worker runs the whole dataset
  dynamic @1;      # the dispatcher hands out splits; each element once
  file @2;         # static sharding by file
  data @3;         # static sharding by element
  fileOrData @4;   # by file when the source has files, else by element
  hint @5;         # SHARD_HINT replaced by (number of workers, worker index)
}

# How data workers send a dataset's elements to readers (TF's
# `compression` argument of register_dataset / distribute); chosen at
# registration, for every job of the dataset. lib/data/compression.h has
# the rules.
enum ElementCompression {
  auto @0;   # zstd where it pays: not to a reader on the worker's host, not
             # for small tensors, not when the task's samples do not shrink
  none @1;   # raw bytes
  zstd @2;   # every tensor worth it (>= 64 bytes) that shrinks
}

struct JobParams {
  datasetId @0 :Text;
  jobName @1 :Text;          # empty: an anonymous job only its creator reads
  processingMode @2 :ProcessingMode;
  numConsumers @3 :Int64;    # coordinated reads: > 0
  crossTrainerCache @4 :Bool;
  crossTrainerCacheBytes @5 :Int64;
}

struct TaskInfo {
  taskId @0 :Int64;
  jobId @1 :Int64;
  workerAddress @2 :Text;
  datasetId @3 :Text;
  # The task's worker was lost (no heartbeat for worker_timeout_ms) and no
  # live worker could take the task yet: it waits for one.
  waitingForWorker @4 :Bool;
}

# What a data worker is told to run.
struct TaskDef {
  taskId @0 :Int64;
  jobId @1 :Int64;
  datasetId @2 :Text;
  definition @3 :Data;       # the pipeline, rewritten for static sharding
  processingMode @4 :ProcessingMode;
  numConsumers @5 :Int64;
  numWorkers @6 :Int64;
  workerIndex @7 :Int64;
  crossTrainerCache @8 :Bool;
  crossTrainerCacheBytes @9 :Int64;
  numSplitProviders @10 :Int64;  # DYNAMIC: one per source of the pipeline
  compression @11 :ElementCompression;  # the dataset's, from its registration
}

struct DatasetSummary {
  datasetId @0 :Text;
  fingerprint @1 :UInt64;
  bytes @2 :UInt64;
  compression @3 :ElementCompression;
}

struct JobSummary {
  jobId @0 :Int64;
  jobName @1 :Text;
  datasetId @2 :Text;
  processingMode @3 :ProcessingMode;
  numClients @4 :Int64;
  numTasks @5 :Int64;
  finished @6 :Bool;
}

struct WorkerSummary {
  address @0 :Text;
  numTasks @1 :Int64;
  lastHeartbeatSecondsAgo @2 :Float64;
}

interface DataDispatcher extends(Common.Node) {
  # The same definition with the same compression always gets the same id.
  # compression: "AUTO" (also ""), "NONE" or "ZSTD", any case; another value
  # is InvalidArgument.
  registerDataset @0 (definition :Data, compression :Text) -> (datasetId :Text);
  getDatasetDefinition @1 (datasetId :Text) -> (definition :Data);
  # Creates or joins a job; named jobs are shared (same name with other
  # parameters: InvalidArgument).
  getOrCreateJob @2 (params :JobParams) -> (jobId :Int64, jobClientId :Int64);
  releaseJobClient @3 (jobClientId :Int64) -> ();
  # A consumer's heartbeat: the tasks to read from, and whether the job is done.
  # knownTasks: the tasksFingerprint of the last list the consumer applied
  # (0: none). While the job's list still has that fingerprint the reply
  # leaves `tasks` empty and sets tasksUnchanged: a job of a thousand tasks
  # is not sent to each of its consumers five times a second. A consumer
  # that sends 0 (or a dispatcher that predates the field) gets the list.
  # intervalMs (in both heartbeats' replies): heartbeat no more often than
  # this (0: as configured); the dispatcher spreads its heartbeat budget
  # over its workers and consumers (data-dispatcher --max-heartbeats-per-s).
  clientHeartbeat @4 (jobClientId :Int64, knownTasks :UInt64)
      -> (tasks :List(TaskInfo), jobFinished :Bool, tasksFingerprint :UInt64, tasksUnchanged :Bool,
          intervalMs :UInt32);
  # A data worker's heartbeat: its tasks now; the reply adds and removes tasks.
  workerHeartbeat @5 (workerAddress :Text, currentTasks :List(Int64))
      -> (newTasks :List(TaskDef), tasksToDelete :List(Int64), intervalMs :UInt32);
  finishTask @6 (workerAddress :Text, taskId :Int64) -> ();
  # DYNAMIC sharding: split number `sequence` (0, 1, 2, ...) of task
  # `taskId` from one split provider of the job. Splits are leased: the
  # first request for a sequence number leases the job's next split to the
  # task (journaled before the reply), and asking again for the same number
  # (a retry after a lost reply, or the task's pipeline rebuilt after its
  # worker restarted) gets the same split. A task's leases end when it
  # finishes. Asking for a number past the next one is InvalidArgument.
  getSplit @7 (jobId :Int64, repetition :Int64, splitProviderIndex :Int64, taskId :Int64, sequence :Int64)
      -> (split :Common.Element, endOfSplits :Bool);
  listDatasets @8 () -> (datasets :List(DatasetSummary));
  listJobs @9 () -> (jobs :List(JobSummary));
  listWorkers @10 () -> (workers :List(WorkerSummary));
}
