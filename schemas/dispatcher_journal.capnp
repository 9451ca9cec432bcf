# The data dispatcher's journal records: one DispatcherUpdate per state
# change (daemons/data_dispatcher/dispatcher_state.h has the meaning of each).
# Each record is one flat Cap'n Proto message; the journal's framing (length +
# CRC32C, torn-tail rule) is sdk/src/journal/journal_format.h.
#
# Evolve as any Cap'n Proto schema: add fields and union members with new
# ordinals; never renumber or retype one.
@0xbae0c1250205d41e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire::journal");

struct DispatcherUpdate {
  union {
    registerDataset @0 :RegisterDataset;
    registerWorker @1 :RegisterWorker;
    createJob @2 :CreateJob;
    acquireJobClient @3 :AcquireJobClient;
    releaseJobClient @4 :ReleaseJobClient;
    createTask @5 :CreateTask;
    createPendingTask @6 :CreatePendingTask;
    clientHeartbeat @7 :ClientHeartbeat;
    finishTask @8 :FinishTask;
    removeTask @9 :RemoveTask;
    produceSplit @10 :ProduceSplit;
    garbageCollectJob @11 :GarbageCollectJob;
    reassignTask @12 :ReassignTask;
  }

  struct RegisterDataset {
    datasetId @0 :Text;
    fingerprint @1 :UInt64;
    compression @2 :UInt8;      # wire::ElementCompression (0, AUTO, in older journals)
  }
  struct RegisterWorker {
    address @0 :Text;
    transferAddress @1 :Text;
    tags @2 :List(Text);
  }
  struct CreateJob {
    jobId @0 :Int64;
    datasetId @1 :Text;
    jobName @2 :Text;
    processingMode @3 :UInt8;   # data_service::ProcessingMode
    numConsumers @4 :Int64;
    numSplitProviders @5 :Int64;
    targetWorkers @6 :UInt8;    # data_service::TargetWorkers
    crossTrainerCache @7 :Bool;
  }
  struct AcquireJobClient {
    jobClientId @0 :Int64;
    jobId @1 :Int64;
  }
  struct ReleaseJobClient {
    jobClientId @0 :Int64;
    releaseTimeMicros @1 :Int64;
  }
  struct CreateTask {
    taskId @0 :Int64;
    jobId @1 :Int64;
    workerAddress @2 :Text;
  }
  struct CreatePendingTask {
    taskId @0 :Int64;
    jobId @1 :Int64;
    workerAddress @2 :Text;
    startingRound @3 :Int64;
  }
  struct ClientHeartbeat {
    jobClientId @0 :Int64;
    taskAccepted @1 :Bool;
    union {
      noRejection @2 :Void;
      taskRejectedNewTargetRound @3 :Int64;
    }
  }
  struct FinishTask {
    taskId @0 :Int64;
  }
  struct RemoveTask {
    taskId @0 :Int64;
  }
  struct ProduceSplit {
    jobId @0 :Int64;
    repetition @1 :Int64;
    splitProviderIndex @2 :Int64;
    finished @3 :Bool;
    # The task the split is leased to (finished = false); -1 in journals
    # written before leases, whose splits belong to no task.
    taskId @4 :Int64 = -1;
  }
  struct GarbageCollectJob {
    jobId @0 :Int64;
  }
  struct ReassignTask {
    taskId @0 :Int64;
    workerAddress @1 :Text;
  }
}
