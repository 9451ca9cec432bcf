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

struct CoordinatorUpdate {
  union {
    createVariable @0 :Variable;
    addDataset @1 :Dataset;
    # The checkpoint a lost parameter server is restored from.
    lastCheckpoint @2 :Text;
  }

  struct Variable {
    name @0 :Text;
    dtype @1 :Common.DType;
    shape @2 :List(Int64);
    optimizer @3 :Ps.OptimizerConfig;
    shards @4 :List(Shard);
    # The placer's round-robin counter after this variable.
    placerCounter @5 :Int64;
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
  }
}
