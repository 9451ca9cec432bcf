# The coordinator's journal records (coordinator work_dir): what a restarted
# coordinator must remember. One CoordinatorUpdate per change, appended
# before the change is applied; framing as the dispatcher's journal
# (lib/journal/journal_format.h).
#
# Evolve as any Cap'n Proto schema: add fields and union members with new
# ordinals; never renumber or retype one.
@0xb2ebe8c0a9e391ee;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire::journal");
using Common = import "common.capnp";
using Ps = import "ps.capnp";
using W = import "worker.capnp";

struct CoordinatorUpdate {
  union {
    createVariable @0 :Variable;
    addDataset @1 :Dataset;
    # The checkpoint a lost parameter server is restored from.
    lastCheckpoint @2 :Text;
    # The closure queue: a closure scheduled, finished (a value or an
    # error), the pending error raised to the program, a value released.
    scheduleClosure @3 :Closure;
    closureFinished @4 :Finished;
    errorTaken @5 :Void;
    releaseClosure @6 :Int64;
    # A compacted journal holds the queue as it was instead: every closure
    # kept, then the pending error and the next closure id.
    closureState @7 :ClosureState;
    closureQueue @8 :QueueState;
    # A strategy (MirroredStrategy), as it is after its creation, after
    # each group formed and after a restore seeds it: a later record of a
    # name replaces the earlier one (a compacted journal has the last).
    strategy @9 :Strategy;
  }

  struct Strategy {
    name @0 :Text;
    specs @1 :List(W.MirroredSpec);
    minReplicas @2 :Int32;
    settings @3 :W.CollectiveSettings;
    # The seed no group has taken yet: create()'s initial values (a
    # serialized Element, one tensor per spec, in order; set only while
    # no group has formed), or a restored checkpoint's path and the
    # variables read from it.
    initialValues @4 :Data;
    seedCheckpoint @5 :Text;
    seedFromCheckpoint @6 :List(Text);
    # The last group formed: its epoch, its members' task indexes by rank
    # (worker ids do not outlive a coordinator) and the steps run then.
    epoch @7 :Int64;
    memberTasks @8 :List(Int32);
    steps @9 :Int64;
    # Its step input (hasInput), StepInputConfig's fields; the position
    # is the replicas' (it travels with their state).
    hasInput @10 :Bool;
    inputDatasetId @11 :Int64;
    globalBatch @12 :Int64;
    perReplicaBatch @13 :Int64;
    inputSeed @14 :UInt64;
    inputShuffle @15 :Bool;
  }

  struct ClosureState {
    closure @0 :Closure;
    state @1 :UInt8;        # 0 queued, 2 done, 3 failed, 4 cancelled
    value @2 :Data;
    errorCode @3 :Int32;
    errorMessage @4 :Text;
    # Queued, but the program released it: dropped when it finishes.
    released @5 :Bool;
  }

  struct QueueState {
    errorCode @0 :Int32;    # the pending error; 0: none
    errorMessage @1 :Text;
    nextId @2 :Int64;
  }

  struct Closure {
    id @0 :Int64;
    function @1 :Text;
    args @2 :Data;          # serialized Element, as the queue holds it
    clientId @3 :UInt64;    # the program's schedule request, for retries
    requestSeq @4 :Int64;
  }

  struct Finished {
    id @0 :Int64;
    value @1 :Data;         # when errorCode is 0
    errorCode @2 :Int32;
    errorMessage @3 :Text;
  }

  struct Variable {
    name @0 :Text;
    dtype @1 :Common.DType;
    shape @2 :List(Int64);
    optimizer @3 :Ps.OptimizerConfig;
    shards @4 :List(Shard);
    # The placer's round-robin counter after this variable.
    placerCounter @5 :Int64;
    # An embedding table (shard i on ps task i).
    isTable @6 :Bool;
    table @7 :Ps.TableConfig;
    # How its shards were filled: by an initializer on the parameter
    # servers (set), else with a given value; awaitingValue: the program
    # has not written that value yet (VariableSpec.valueFromProgram). When
    # it has, the variable is journaled again without the flag: a later
    # createVariable record of a name replaces the earlier one.
    initializer @8 :Ps.Initializer;
    awaitingValue @9 :Bool;
  }

  struct Shard {
    name @0 :Text;
    psTask @1 :Int32;
    firstRow @2 :Int64;
    rows @3 :Int64;
  }

  struct Dataset {
    id @0 :Int64;
    definition @1 :Data;
    function @2 :Text;
    name @3 :Text;
    uid @4 :UInt64;
    stepInput @5 :Bool;  # a strategy's step input (not in iterator checkpoints)
  }
}
