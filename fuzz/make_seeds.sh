#!/usr/bin/env bash
# Writes the seed corpora in fuzz/corpus/NAME: small valid inputs of each
# format (the fuzzers mutate from there). Run from the repository root; needs
# python3 and the capnp tool (Debian: capnproto).
set -euo pipefail
cd "$(dirname "$0")/.."
c=fuzz/corpus
mkdir -p $c/{tfrecord,example,csv,safetensors,manifest,journal,definition,tensor_codec,config}
enc() {  # SCHEMA STRUCT TEXT OUT
  echo "$3" | capnp encode -I/usr/include "$1" "$2" >"$4"
}

python3 - "$c" <<'PY'
import gzip, json, os, struct, sys
c = sys.argv[1]

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def tfrecord(records):
    out = b""
    for r in records:
        length = struct.pack("<Q", len(r))
        out += length + struct.pack("<I", masked(length)) + r + struct.pack("<I", masked(r))
    return out

def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])

def field(num, wire, payload):
    key = varint((num << 3) | wire)
    return key + (varint(len(payload)) + payload if wire == 2 else payload)

def feature(kind, values):
    # Feature: bytes_list = 1, float_list = 2, int64_list = 3
    if kind == "bytes":
        body = b"".join(field(1, 2, v) for v in values)
        return field(1, 2, body)
    if kind == "float":
        packed = b"".join(struct.pack("<f", v) for v in values)
        return field(2, 2, field(1, 2, packed))
    packed = b"".join(varint(v & 0xFFFFFFFFFFFFFFFF) for v in values)
    return field(3, 2, field(1, 2, packed))

def example(features):
    entries = b"".join(field(1, 2, field(1, 2, k.encode()) + field(2, 2, feature(*v))) for k, v in features.items())
    return field(1, 2, entries)  # Example.features (Features.feature map entries)

ex1 = example({"age": ("int64", [39]), "score": ("float", [0.5, 1.5]), "name": ("bytes", [b"ann"]),
               "tags": ("bytes", [b"a", b"b"]), "ids": ("int64", [1, 2, 3])})
ex2 = example({"score": ("float", [2.0, 3.0]), "name": ("bytes", [b""])})
open(f"{c}/example/full", "wb").write(ex1)
open(f"{c}/example/defaults", "wb").write(ex2)
open(f"{c}/tfrecord/two_records", "wb").write(tfrecord([ex1, b"hello"]))
open(f"{c}/tfrecord/empty_record", "wb").write(tfrecord([b""]))
open(f"{c}/tfrecord/gzip", "wb").write(gzip.compress(tfrecord([ex2, b"x" * 100])))

for name, line in {"plain": "1,2,3.5,4.25,hello", "quoted": '7,-8,1e3,-0.5,"a ""quoted"", field"',
                   "missing": "?,,?,,", "spaces": " 1 , 2 , 3 , 4 , five "}.items():
    open(f"{c}/csv/{name}", "w").write(line)

def safetensors(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
open(f"{c}/safetensors/two", "wb").write(safetensors(
    {"__metadata__": {"step": "3"}, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
     "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]}}, bytes(24)))
open(f"{c}/safetensors/empty", "wb").write(safetensors({}, b""))

manifest = {"format_version": 1, "step": 7, "variables": [
    {"name": "b", "dtype": "float64", "shape": [2], "partitioning": [2],
     "shards": [{"name": "b/part_0", "file": "ps-0.safetensors", "first_row": 0, "rows": 2}],
     "optimizer": {"kind": "adam", "hyperparameters": {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
                                                       "epsilon": 1e-07}, "nesterov": False},
     "slots": ["m", "v"], "optimizer_step": 7}],
    "files": [{"name": "ps-0.safetensors", "size": 123, "crc32c": 4000000000}]}
open(f"{c}/manifest/one_variable.json", "w").write(json.dumps(manifest, indent=2))
open(f"{c}/manifest/index.json", "w").write(json.dumps({"latest": "ckpt-10", "kept": ["ckpt-5", "ckpt-10"]}))

open(f"{c}/config/tf_config.json", "w").write(json.dumps(
    {"cluster": {"chief": ["h:1"], "ps": ["h:2", "h:3"], "worker": ["h:4"]}, "task": {"type": "ps", "index": 1}}))
open(f"{c}/config/config.yaml", "w").write("port: 7100\nps: [a:1, b:2]\nratio: 0.25\nflag: true\nname: x\n")
PY

j=schemas/dispatcher_journal.capnp
enc $j DispatcherUpdate '(registerDataset = (datasetId = "1000", fingerprint = 42))' $c/journal/register_dataset
enc $j DispatcherUpdate '(createJob = (jobId = 2000, datasetId = "ds", jobName = "train", processingMode = 1, numSplitProviders = 1))' $c/journal/create_job
enc $j DispatcherUpdate '(createTask = (taskId = 4000, jobId = 2000, workerAddress = "w"))' $c/journal/create_task
enc $j DispatcherUpdate '(produceSplit = (jobId = 2000, repetition = 0, splitProviderIndex = 0, finished = false, taskId = 4000))' $c/journal/produce_split
enc $j DispatcherUpdate '(clientHeartbeat = (jobClientId = 3000, taskAccepted = true, noRejection = void))' $c/journal/client_heartbeat

d=schemas/dataset.capnp
enc $d DatasetDef '(root = (range = (start = 0, stop = 10, step = 1)))' $c/definition/range
enc $d DatasetDef '(root = (input = (input = (range = (start = 0, stop = 100, step = 3)), shuffle = (bufferSize = 10, seed = 7, hasSeed = true)), batch = (batchSize = 4, dropRemainder = true)), options = (memoryBudget = 1000000))' $c/definition/shuffle_batch
enc $d DatasetDef '(root = (tfRecord = (files = ["a.tfrecord", "b.tfrecord"], compression = gzip, numParallelReads = 2)))' $c/definition/tfrecord

t=schemas/common.capnp
enc $t Element '(components = [(dtype = int64, shape = [2], inline = 0x"0100000000000000 0200000000000000")])' $c/tensor_codec/int64
enc $t Element '(components = [(dtype = float32, shape = [], inline = 0x"0000803f"), (dtype = bool, shape = [2], inline = 0x"0100")], names = ["x", "y"])' $c/tensor_codec/two
echo "make_seeds: $(find $c -type f | wc -l) seeds in $c"
