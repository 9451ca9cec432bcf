# Input pipeline definitions: what Dataset builds in the SDK, what the
# dispatcher registers, and what every engine (in-process, worker, data
# worker) executes. A definition is a tree of ops rooted at `root`; each op
# reads its `input` (or `inputs`, for zip and concatenate).
@0x9de6c4d05caa8248;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("capstan::wire");
using Common = import "common.capnp";

struct DatasetDef {
  root @0 :Op;
  options @1 :Options;
}

struct Options {
  autotune @0 :Bool = true;
  autotuneRamBudget @1 :Int64;   # bytes; 0 = half the machine's RAM
  autotuneCpuBudget @2 :Int32;   # threads; 0 = one per core
  deterministic @3 :Bool = true;
  memoryBudget @4 :Int64;        # bytes the buffering ops may hold; 0 = half the machine's RAM
}

enum Compression {
  none @0;
  gzip @1;
}

# Per-op override of Options.deterministic.
enum Tri {
  default @0;
  yes @1;
  no @2;
}

struct Fn {
  union {
    named @0 :Text;
    decodeCsv @1 :CsvSpec;
    parseExample @2 :List(Feature);
    cast @3 :Common.DType;
    tfrecordDataset @4 :Compression;
    textLineDataset @5 :Compression;
  }
}

struct CsvSpec {
  recordDefaults @0 :List(Common.Tensor);
  fieldDelim @1 :Text;
  useQuoteDelim @2 :Bool;
  naValue @3 :Text;
  selectCols @4 :List(Int64);
  trimWhitespace @5 :Bool;
}

struct Feature {
  key @0 :Text;
  dtype @1 :Common.DType;
  union {
    fixedLen :group {
      shape @2 :List(Int64);
      defaultValue @3 :Common.Tensor;
      hasDefault @4 :Bool;
    }
    varLen @5 :Void;
  }
}

struct Op {
  input @0 :Op;
  inputs @1 :List(Op);
  union {
    range :group {
      start @2 :Int64;
      stop @3 :Int64;
      step @4 :Int64;
    }
    fromTensors @5 :Common.Element;
    fromTensorSlices @6 :Common.Element;
    listFiles :group {
      patterns @7 :List(Text);
      shuffle @8 :Bool;
      seed @9 :UInt64;
      hasSeed @10 :Bool;
    }
    textLine :group {
      files @11 :List(Text);
      compression @12 :Compression;
    }
    tfRecord :group {
      files @13 :List(Text);
      compression @14 :Compression;
      numParallelReads @15 :Int64;
    }
    fixedLength :group {
      files @16 :List(Text);
      recordBytes @17 :Int64;
      headerBytes @18 :Int64;
      footerBytes @19 :Int64;
      compression @20 :Compression;
    }
    map :group {
      fn @21 :Fn;
      numParallelCalls @22 :Int64;
      deterministic @23 :Tri;
    }
    filter :group {
      fn @24 :Fn;
    }
    batch :group {
      batchSize @25 :Int64;
      dropRemainder @26 :Bool;
    }
    paddedBatch :group {
      batchSize @27 :Int64;
      paddedShapes @28 :List(List(Int64));
      paddingValues @29 :List(Common.Tensor);
      dropRemainder @30 :Bool;
    }
    shuffle :group {
      bufferSize @31 :Int64;
      seed @32 :UInt64;
      hasSeed @33 :Bool;
      reshuffleEachIteration @34 :Bool;
    }
    repeat :group {
      count @35 :Int64;
    }
    shard :group {
      numShards @36 :Int64;
      index @37 :Int64;
    }
    interleave :group {
      fn @38 :Fn;
      cycleLength @39 :Int64;
      blockLength @40 :Int64;
      numParallelCalls @41 :Int64;
      deterministic @42 :Tri;
    }
    prefetch :group {
      bufferSize @43 :Int64;
    }
    take :group {
      count @44 :Int64;
    }
    skip :group {
      count @45 :Int64;
    }
    zip @46 :Void;
    concatenate @47 :Void;
    cache :group {
      filename @48 :Text;
    }
    rebatch :group {
      batchSize @49 :Int64;
      dropRemainder @50 :Bool;
    }
    # A source that reads a registered dataset through the data service
    # (from_dataset_id / distribute). processingMode holds a
    # DataDispatcher ProcessingMode value; token is the cluster token.
    dataService :group {
      address @51 :Text;
      datasetId @52 :Text;
      processingMode @53 :UInt8;
      jobName @54 :Text;
      consumerIndex @55 :Int64;
      numConsumers @56 :Int64;
      trainerId @57 :Text;
      crossTrainerCache @58 :Bool;
      crossTrainerCacheBytes @59 :Int64;
      maxElementsPerRequest @60 :Int32;
      token @61 :Text;
      # getElements calls kept in flight per task (TF's
      # max_outstanding_requests); 1 waits for each reply.
      maxOutstandingRequests @68 :Int32 = 2;
      # The shared-memory region a reader on a worker's host asks that
      # worker for (0: TCP only).
      sharedMemoryBytes @69 :Int64 = 134217728;
    }
    # A dataset Dataset::save wrote: its shard files and spec, read when
    # load() was called.
    load :group {
      path @62 :Text;
      shards @63 :List(Text);
      compression @64 :Compression;
      numElements @65 :Int64;
    }
    # The input's elements, kept under path/<fingerprint> after the first
    # complete iteration.
    snapshot :group {
      path @66 :Text;
      compression @67 :Compression;
    }
    # Each input element with its index (from `start`) in front, as
    # component 0.
    enumerate :group {
      start @70 :Int64;
    }
    # Each input element split along the first dimension of its components
    # (all the same size) into that many elements (tf.data's unbatch).
    unbatch @71 :Void;
  }
}
