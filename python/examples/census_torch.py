"""Census income (UCI adult): the Wide & Deep model written in PyTorch,
trained from Python on Capstan, two training processes:

  --mode ps   parameter-server training, multi-client (TF1's between-graph
              replication): each process keeps the model through
              capstan.torch.PsModule (its parameters are variables on
              Capstan's parameter servers, the tables gathered and updated
              by rows), reads its batches from one data-service job the two
              share, and pushes its gradients for the servers' optimizers
              (Adagrad on the wide part, Adam with a cosine decay on the deep
              part, as examples/census's LibTorch model).
  --mode ddp  data parallel: capstan.torch.DistributedDataParallel over
              Capstan's collectives, each process reading its shard of the
              training file; the same optimizers, in torch.

Then scores adult.test (accuracy and AUC) with the trained parameters.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/census_torch.py --mode ps

It starts what it needs from build/bin (a parameter server and a
coordinator; a data dispatcher and a data worker with the census module)
and stops it at the end. Exits 1 below --target-accuracy or --target-auc.
Run it from a directory other than the repository root (whose torch/
folder would shadow the torch package), or with python3 -P.
"""

import argparse
import contextlib
import math
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch
import torch.multiprocessing as mp

import capstan
import capstan.local
import capstan.torch
from capstan.data import Fn

REPO = pathlib.Path(__file__).resolve().parents[2]
# examples/census/features.h: the wide ids of the 15 wide columns share one id
# space of WIDE_ROWS rows; the first DEEP_FIELDS columns' ids are also the
# embedding table's rows.
WIDE_ROWS = 5085
EMBEDDING_ROWS = 2050
DEEP_FIELDS = 8
EMBEDDING_DIM = 8
NUMERIC = 5
TRAIN_EXAMPLES = 32561


def examples(path):
    """(wide_ids int64[15], numeric float32[5], label float32) per record,
    by the census module's functions."""
    record_defaults = [np.int64(0) if column in (0, 2, 4, 10, 11, 12) else b"" for column in range(15)]
    return (capstan.data.TextLineDataset(str(path), "GZIP")
            .filter(Fn.named("census_is_record"))
            .map(Fn.decode_csv(record_defaults, na_value="?", trim_whitespace=True))
            .map(Fn.named("census_features")))


class WideDeep(torch.nn.Module):
    """logit = bias + the wide rows of the example's ids, summed, + an MLP
    100-75-50-25-1 over the embedded categorical columns and the numeric
    ones (examples/census/torch_model.h, in Python)."""

    def __init__(self, sparse):
        super().__init__()
        self.wide = torch.nn.Embedding(WIDE_ROWS, 1, sparse=sparse)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.embeddings = torch.nn.Embedding(EMBEDDING_ROWS, EMBEDDING_DIM, sparse=sparse)
        layers = []
        width = DEEP_FIELDS * EMBEDDING_DIM + NUMERIC
        for out in (100, 75, 50, 25):
            layers += [torch.nn.Linear(width, out), torch.nn.ReLU()]
            width = out
        self.deep = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
        with torch.no_grad():
            torch.nn.init.zeros_(self.wide.weight)  # as Keras' linear model starts
            torch.nn.init.normal_(self.embeddings.weight, 0, 1 / math.sqrt(EMBEDDING_DIM))
            for name, p in self.deep.named_parameters():
                (torch.nn.init.xavier_uniform_ if name.endswith("weight") else torch.nn.init.zeros_)(p)

    def forward(self, wide_ids, numeric):
        embedded = self.embeddings(wide_ids[:, :DEEP_FIELDS]).flatten(1)
        deep = self.deep(torch.cat([embedded, numeric], 1)).squeeze(1)
        return self.wide(wide_ids).sum((1, 2)) + self.bias + deep


def loss_of(model, batch):
    wide_ids, numeric, labels = (capstan.torch.as_tensor(a) for a in batch)
    return torch.nn.functional.binary_cross_entropy_with_logits(model(wide_ids, numeric), labels)


def steps_per_epoch(args):
    return TRAIN_EXAMPLES // (args.batch_size * args.workers)


def ps_worker(rank, args, coordinator, dispatcher, dataset_id, report):
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # both make the same initial values; the first to create wins
    cluster = capstan.ClusterCoordinator.connect(coordinator)
    model = WideDeep(sparse=True)
    updates = steps_per_epoch(args) * args.workers * args.epochs
    wide = capstan.Optimizer.adagrad(args.wide_learning_rate)
    deep = capstan.Optimizer.adam(args.deep_learning_rate).with_schedule(
        capstan.LearningRateSchedule.cosine_decay(updates))
    # As examples/census (torch_model.h: ps_options): the two tables in two
    # shards, the rest whole.
    two = capstan.Partitioner.fixed_shards(2)
    ps = capstan.torch.PsModule(model, cluster, prefix="census/", optimizer=deep,
                                optimizers={"wide.weight": wide, "bias": wide},
                                partitioners={"wide.weight": two, "embeddings.weight": two})
    batches = capstan.data.service.from_dataset_id(dispatcher, dataset_id, processing_mode="off",
                                                   job_name="census-torch")
    seen, started = 0, None
    for step, batch in enumerate(batches):
        started = started or time.time()  # from the first batch (not the process's start)
        loss = ps.step(lambda: loss_of(model, batch))
        seen += len(batch[2])
        if rank == 0 and step % args.log_every == 0:
            print(f"worker {rank}: step {step:5d}  examples {seen:7d}  loss {loss:.4f}", flush=True)
    report.put((rank, seen, started, time.time()))


def ddp_worker(rank, args, coordinator, report):
    torch.set_num_threads(1)
    cluster = capstan.ClusterCoordinator.connect(coordinator)
    group = cluster.join_group("census-ddp", size=args.workers, rank=rank, timeout=120)
    torch.manual_seed(args.seed + rank)  # construction gives every rank rank 0's values
    model = capstan.torch.DistributedDataParallel(WideDeep(sparse=False), group)
    net = model.module
    updates = steps_per_epoch(args) * args.epochs
    wide = torch.optim.Adagrad([net.wide.weight, net.bias], lr=args.wide_learning_rate,
                               initial_accumulator_value=0.1, eps=1e-7)
    deep = torch.optim.Adam([net.embeddings.weight, *net.deep.parameters()], lr=args.deep_learning_rate,
                            eps=1e-7)
    schedule = torch.optim.lr_scheduler.LambdaLR(deep, lambda u: 0.5 * (1 + math.cos(math.pi * min(u, updates) / updates)))
    capstan.load_module(args.module)
    per_epoch = steps_per_epoch(args)
    # This rank's shard, the same number of batches on every rank (their
    # all-reduces pair up).
    train = (examples(pathlib.Path(args.data_dir) / "adult.data.gz").shard(args.workers, rank)
             .shuffle(10000, seed=args.seed + rank).batch(args.batch_size, drop_remainder=True)
             .take(per_epoch).repeat(args.epochs))
    seen, started = 0, None
    for step, batch in enumerate(train):
        started = started or time.time()
        wide.zero_grad(set_to_none=True)
        deep.zero_grad(set_to_none=True)
        loss = loss_of(model, batch)
        loss.backward()
        wide.step()
        deep.step()
        schedule.step()
        seen += len(batch[2])
        if rank == 0 and step % args.log_every == 0:
            print(f"rank {rank}: step {step:5d}  examples {seen:7d}  loss {float(loss):.4f}", flush=True)
    if rank == 0:
        torch.save(net.state_dict(), args.state_path)
    group.barrier()
    report.put((rank, seen, started, time.time()))


def auc(scores, labels):
    """The area under the ROC curve (ties counted half), by ranks."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return (ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def evaluate(model, args):
    capstan.load_module(args.module)
    scores, labels = [], []
    with torch.no_grad():
        for wide_ids, numeric, y in examples(pathlib.Path(args.data_dir) / "adult.test.gz").batch(4096):
            scores.append(model(capstan.torch.as_tensor(wide_ids), capstan.torch.as_tensor(numeric)).numpy())
            labels.append(np.asarray(y))
    scores, labels = np.concatenate(scores), np.concatenate(labels)
    return float(((scores > 0) == (labels > 0.5)).mean()), float(auc(scores, labels)), len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("ps", "ddp"), default="ps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--wide-learning-rate", type=float, default=0.05)
    parser.add_argument("--deep-learning-rate", type=float, default=0.0005)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=str(REPO / "examples" / "census" / "data"))
    parser.add_argument("--bin-dir", default=str(REPO / "build" / "bin"))
    parser.add_argument("--module", default=str(REPO / "build" / "lib" / "libcensus_module.so"))
    parser.add_argument("--log-every", type=int, default=200)
    parser.add_argument("--target-accuracy", type=float, default=0.855)
    parser.add_argument("--target-auc", type=float, default=0.905)
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers must be 1 or more, not {args.workers}")

    context = mp.get_context("spawn")  # a fresh interpreter per worker (no forked client threads)
    report = context.Queue()
    with contextlib.ExitStack() as stack:
        coordinator = stack.enter_context(capstan.local.ParameterServers(args.bin_dir, ps=2))
        workdir = stack.enter_context(tempfile.TemporaryDirectory())
        args.state_path = str(pathlib.Path(workdir) / "ddp-state.pt")
        started = time.monotonic()
        if args.mode == "ps":
            dispatcher = stack.enter_context(capstan.local.DataService(args.bin_dir, modules=[args.module]))
            train = (examples(pathlib.Path(args.data_dir) / "adult.data.gz").shuffle(10000, seed=args.seed)
                     .repeat(args.epochs).batch(args.batch_size))
            dataset_id = capstan.data.service.register_dataset(dispatcher, train)
            targets = [(ps_worker, (r, args, coordinator, dispatcher, dataset_id, report)) for r in range(args.workers)]
        else:
            targets = [(ddp_worker, (r, args, coordinator, report)) for r in range(args.workers)]
        processes = [context.Process(target=t, args=a) for t, a in targets]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
        failed = [i for i, p in enumerate(processes) if p.exitcode != 0]
        if failed:
            print(f"census_torch: worker(s) {failed} failed", file=sys.stderr)
            return 1
        seconds = time.monotonic() - started
        reports = [report.get() for _ in processes]
        seen = sum(n for _, n, _, _ in reports)
        # Training time: from the first worker's first batch to the last one's end.
        training = max(end for *_, end in reports) - min(begin for _, _, begin, _ in reports)
        # The trained parameters: the servers' (ps) or rank 0's (ddp).
        torch.manual_seed(args.seed)
        model = WideDeep(sparse=False)
        if args.mode == "ps":
            cluster = capstan.ClusterCoordinator.connect(coordinator)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(capstan.torch.as_tensor(cluster.read_variable("census/" + name)).view_as(p))
        else:
            model.load_state_dict(torch.load(args.state_path))
    accuracy, area, total = evaluate(model, args)
    met = accuracy >= args.target_accuracy and area >= args.target_auc
    print(f"census_torch ({args.mode}, {args.workers} processes): {seen} examples in {training:.1f} s "
          f"({seen / training:.0f} examples/s; {seconds:.1f} s with the processes' start); test accuracy {accuracy:.4f}, AUC {area:.4f} over {total} examples "
          f"(targets {args.target_accuracy}, {args.target_auc}) {'PASS' if met else 'FAIL'}", flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
