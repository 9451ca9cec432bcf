# The parameter server (TensorFlow's /job:ps): holds variable shards and
# their optimizer slots. Shards are named by the coordinator ("w/part_0").
@0xeb130ab1a9feb43f;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";

struct OptimizerConfig {
  kind @0 :Text;              # "none", "sgd", "momentum", "adagrad", "adam", "ftrl"
  learningRate @1 :Float64;
  momentum @2 :Float64;
  nesterov @3 :Bool;
  initialAccumulatorValue @4 :Float64;
  epsilon @5 :Float64;
  beta1 @6 :Float64;
  beta2 @7 :Float64;
  learningRatePower @8 :Float64;
  l1 @9 :Float64;
  l2 @10 :Float64;
  l2Shrinkage @11 :Float64;
  beta @12 :Float64;
  # Unset, or kind "": the constant rate (what a peer older than schedules
  # sends). Such a peer ignores a schedule it receives, so upgrade parameter
  # servers and workers (mirrored variables) before programs that use one.
  schedule @13 :LearningRateSchedule;
}

# capstan::LearningRateSchedule (capstan/training.h): Keras' schedules.
struct LearningRateSchedule {
  kind @0 :Text;               # "constant", "exponential_decay", "piecewise_constant_decay", "cosine_decay"
  decaySteps @1 :Int64;        # exponential_decay, cosine_decay
  decayRate @2 :Float64;       # exponential_decay
  staircase @3 :Bool;          # exponential_decay
  alpha @4 :Float64;           # cosine_decay
  boundaries @5 :List(Int64);  # piecewise_constant_decay
  values @6 :List(Float64);    # piecewise_constant_decay: boundaries + 1 rates
}

struct ShardInfo {
  name @0 :Text;
  dtype @1 :Common.DType;
  shape @2 :List(Int64);      # a table's: [rows, dim]
  optimizer @3 :OptimizerConfig;
  step @4 :Int64;
  bytes @5 :UInt64;
  table @6 :Bool;             # a shard of an embedding table
}

# A dynamic embedding table (EmbeddingTableSpec in capstan/training.h).
struct TableConfig {
  dtype @0 :Common.DType;
  dim @1 :Int64;
  initializer @2 :Text;       # "zeros", "constant", "random_normal"
  initValue @3 :Float64;
  initMean @4 :Float64;
  initStddev @5 :Float64;
  initSeed @6 :UInt64;
  optimizer @7 :OptimizerConfig;
  minCount @8 :Int64;
  admitProbability @9 :Float64;
  ttlSteps @10 :Int64;
  ttlSeconds @11 :Int64;
  maxRows @12 :Int64;
  maxBytes @13 :Int64;
  eviction @14 :Text;         # "lru", "lfu"
  defaultValue @15 :Float64;
}

# Rows of a table with their state: keys int64[n], values [n, dim], the
# optimizer's slots [n, dim] each (slot order), meta int64[n, 4]
# (lookups, last update step, last update ms since the epoch, version).
struct TableRows {
  keys @0 :Common.Tensor;
  values @1 :Common.Tensor;
  slots @2 :List(Common.Tensor);
  meta @3 :Common.Tensor;
}

# A variable's initial value, computed by each parameter server for the rows
# it holds (capstan::Initializer, capstan/training.h): element i of the
# logical tensor depends on (kind, parameters, seed, i) only, so the shards
# make the same tensor whatever the partitioning.
struct Initializer {
  kind @0 :Text;              # "zeros", "constant", "random_normal", "truncated_normal",
                              # "random_uniform", "glorot_uniform", "glorot_normal"
  value @1 :Float64;          # constant
  mean @2 :Float64;           # random_normal, truncated_normal
  stddev @3 :Float64;         # random_normal, truncated_normal
  minval @4 :Float64;         # random_uniform
  maxval @5 :Float64;         # random_uniform
  seed @6 :UInt64;            # the random kinds
}

struct NamedTensor {
  name @0 :Text;
  tensor @1 :Common.Tensor;
}

# Checkpoints the parameter server writes and reads itself (beginSave,
# finishSave, restoreShards): the coordinator only says what and where.
struct SaveShard {
  name @0 :Text;
  table @1 :Bool;             # an embedding table's shard
  beginVersion @2 :Int64;     # a table: tag later changes >= this (exportTable's)
}

# What a shard's snapshot holds (beginSave's answer, in request order).
struct SavedShard {
  name @0 :Text;
  dtype @1 :Common.DType;
  shape @2 :List(Int64);      # a table's: [rows, dim]
  slots @3 :List(Text);       # the optimizer's slots written, in order
  step @4 :Int64;
  version @5 :Int64;          # a table: the version before the mark
}

# A shard to fill from a checkpoint (restoreShards).
struct RestoreShard {
  name @0 :Text;              # the shard, created first when absent
  variable @1 :Text;          # the checkpoint's variable
  firstRow @2 :Int64;         # rows [firstRow, firstRow + rows) of it
  rows @3 :Int64;
  dtype @4 :Common.DType;     # the shard as placed now (checked against the checkpoint)
  shape @5 :List(Int64);
  optimizer @6 :OptimizerConfig;
  # An embedding table: this is shard `tablePart` of `tableParts`; its keys
  # are those table_shard_of maps here, from every saved shard.
  table @7 :TableConfig;
  isTable @8 :Bool;
  tablePart @9 :Int32;
  tableParts @10 :Int32;
}

# Peer snapshots (issue 34 item 5): a parameter server keeps in memory a
# copy of its buddy's shards (sendPeerSnapshot, holdPeerSnapshot), which a
# replacement of the buddy reads back instead of a disk checkpoint
# (restoreFromPeer, readPeerCopy). See "Recovery from a peer's memory" in
# docs/design.md.
struct PeerVariable {         # a variable shard, whole
  name @0 :Text;
  value @1 :Common.Tensor;
  optimizer @2 :OptimizerConfig;
  slots @3 :List(NamedTensor);  # the optimizer's slot order
  step @4 :Int64;
}

struct PeerTable {            # a table shard's rows: all (full) or those changed
  name @0 :Text;
  config @1 :TableConfig;
  full @2 :Bool;              # the rows replace the holder's; else they are upserted
  rows @3 :TableRows;
  step @4 :Int64;
}

struct PeerDelta {
  sourceTask @0 :Int32;       # the server copied (its task in --ps)
  baseSequence @1 :Int64;     # the copy this applies on; 0: a full copy
  sequence @2 :Int64;         # > baseSequence
  takenMs @3 :Int64;          # when the source took it, ms since the epoch
  variables @4 :List(PeerVariable);
  tables @5 :List(PeerTable);
  removed @6 :List(Text);     # shards gone since baseSequence
}

interface ParameterServer extends(Common.Node) {
  # Idempotent for an identical shard (a reconnecting coordinator): the
  # same dtype, shape and optimizer (the value, or the initializer, is not
  # compared: the shard keeps what it has learned).
  # `initializer` set (instead of `initial`): the server computes the
  # shard's value, rows [firstRow, firstRow + rows) of a variable of
  # `dtype` and `logicalShape` (the whole variable's shape; a scalar: [],
  # firstRow 0, rows 1). Older callers leave it unset and send `initial`.
  createShard @0 (name :Text, initial :Common.Tensor, optimizer :OptimizerConfig,
                  initializer :Initializer, dtype :Common.DType, logicalShape :List(Int64),
                  firstRow :Int64, rows :Int64) -> ();
  # `inlineLimit`: the caller takes a value of up to this many bytes inline
  # in the answer (its reader's limit), saving the round trip that pulls a
  # larger one through a ByteSource; 0 (older callers): the server's own
  # limit. At most 256 MiB is honored.
  read @1 (name :Text, inlineLimit :UInt64) -> (value :Common.Tensor);
  gather @2 (name :Text, ids :Common.Tensor, inlineLimit :UInt64) -> (rows :Common.Tensor);
  assign @3 (name :Text, value :Common.Tensor) -> ();
  assignAdd @4 (name :Text, delta :Common.Tensor) -> ();
  # hasLearningRate: the update uses learningRate (finite, >= 0) instead of
  # the optimizer's rate and schedule (capstan::ApplyOptions); unset (older
  # callers): the optimizer's own. A bad rate fails the call, nothing applied.
  applyDense @5 (name :Text, gradient :Common.Tensor, step :Int64,
                 hasLearningRate :Bool, learningRate :Float64) -> ();
  applySparse @6 (name :Text, ids :Common.Tensor, rows :Common.Tensor, step :Int64,
                  hasLearningRate :Bool, learningRate :Float64) -> ();
  listShards @7 () -> (shards :List(ShardInfo));
  readSlots @8 (name :Text) -> (slots :List(NamedTensor));
  # Restores slots and the optimizer step of a shard.
  setSlots @9 (name :Text, slots :List(NamedTensor), step :Int64) -> ();
  removeShard @10 (name :Text) -> ();

  # Embedding tables (one shard of a table per parameter server; keys are
  # routed by the client). Idempotent for an identical config.
  createTable @11 (name :Text, config :TableConfig) -> ();
  # ids: int64[n]. insert=false never inserts (evaluation).
  # `inlineLimit` as in read.
  lookupTable @12 (name :Text, ids :Common.Tensor, insert :Bool, inlineLimit :UInt64) -> (rows :Common.Tensor);
  # hasLearningRate, learningRate as in applyDense.
  applyTable @13 (name :Text, ids :Common.Tensor, gradients :Common.Tensor, step :Int64,
                  hasLearningRate :Bool, learningRate :Float64) -> ();
  # The rows whose version > sinceVersion. beginVersion > 0: first tag the
  # changes from now on with max(beginVersion, version + 1) (a checkpoint's
  # mark). version: the version in force before the mark.
  exportTable @14 (name :Text, sinceVersion :Int64, beginVersion :Int64)
      -> (rows :TableRows, step :Int64, version :Int64);
  # Inserts or overwrites rows (clear: drop every row first), sets the step
  # counter and makes later changes tagged > version.
  importTable @15 (name :Text, rows :TableRows, clear :Bool, step :Int64, version :Int64) -> ();

  # Writes rows [firstRow, firstRow + rows.shape[0]) of shard `name` (its
  # own row numbers, from 0) with `rows`: the shard's dtype and row shape,
  # the range inside the shard. A program writes a given initial value so,
  # straight to the servers, in chunks. Slots and step stay as they are.
  assignRows @16 (name :Text, firstRow :Int64, rows :Common.Tensor) -> ();

  # Takes a consistent snapshot of each shard (copy-on-write values, copied
  # slots; a table's rows, marked as exportTable's beginVersion does), answers,
  # and writes the snapshot as the safetensors file `directory`/`file` in the
  # background, fsynced. `directory` is a checkpoint's "ckpt-<step>.tmp"
  # directory and `file` a plain "*.safetensors" name that must not exist.
  beginSave @17 (directory :Text, file :Text, shards :List(SaveShard))
      -> (saveId :UInt64, shards :List(SavedShard));
  # Waits for save `saveId` to be on disk: the file's size and CRC32C. Once
  # per save (NotFound after, or for an unknown id).
  finishSave @18 (saveId :UInt64) -> (size :UInt64, crc32c :UInt32);
  # Fills (creating where absent) each shard from the committed checkpoint at
  # `checkpoint`, reading only the files and rows it needs: value, slots of
  # the same optimizer kind, step; a table's rows for this shard's keys.
  restoreShards @19 (checkpoint :Text, shards :List(RestoreShard)) -> ();

  # Peer snapshots. Takes this server's changes since the delta `holder`
  # acknowledged last (every shard the first time, after a failure, when the
  # holder changed, or with `full`) and sends them to the parameter server
  # at `holder` ("host:port") as source task `sourceTask` (holdPeerSnapshot).
  # Answers what went.
  sendPeerSnapshot @20 (holder :Text, sourceTask :Int32, full :Bool)
      -> (sequence :Int64, full :Bool, shards :UInt32, bytes :UInt64);
  # Keeps (full) or updates this server's in-memory copy of the source's
  # shards. FailedPrecondition when the delta builds on a copy not held
  # (the source then sends a full one); ResourceExhausted past the memory
  # limit for copies.
  holdPeerSnapshot @21 (delta :PeerDelta) -> ();
  # The copy of `sourceTask`'s shards `shards` (every one when empty) held
  # here, whole. NotFound when no copy is held or it lacks a shard.
  readPeerCopy @22 (sourceTask :Int32, shards :List(Text)) -> (delta :PeerDelta);
  # A replacement of `sourceTask`: reads `shards` from the copy held at
  # `holder` (readPeerCopy) and creates them here with their values, slots,
  # steps and rows. Answers the copy's sequence and when it was taken.
  restoreFromPeer @23 (holder :Text, sourceTask :Int32, shards :List(Text))
      -> (sequence :Int64, takenMs :Int64, shards :UInt32);
}
