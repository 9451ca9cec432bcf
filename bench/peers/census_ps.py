"""TensorFlow's side of bench/census_bench.sh: the census Wide & Deep of
examples/census (torch_model.h, features.h, pipeline.h) trained
asynchronously with tf.distribute.ParameterServerStrategy and
tf.distribute.coordinator.ClusterCoordinator, in examples/s.

Cluster: --ps parameter servers (default 2) and --workers workers (default
2), tf.distribute.Server tasks on loopback ports, one subprocess each, as
census_bench.sh's `scripts/local-cluster.sh up --ps 2 --workers N`
(--in-process puts them in this process). This process is the coordinator.

The model, as torch_model.h has it:
  logit = wide + deep
  wide  = bias + sum of the wide table's rows [bias_id(), 1] for the
          example's 15 wide ids (zeros at first)
  deep  = MLP 100-75-50-25 (ReLU) -> 1 over [the 8-dimensional embeddings
          [embedding_rows(), 8] of the first 8 wide ids (truncated normal,
          deviation 1/sqrt(8)), the 5 standardised numeric features];
          Glorot-uniform weights, zero biases
  loss  = sigmoid cross-entropy, the batch's mean
The wide table and the embeddings are ShardedVariables of 2 shards (one per
ps; Capstan: Partitioner::fixed_shards(2)); the other variables are whole,
placed round-robin on the ps. Optimizers, applied on the ps that holds the
variable (the update ops are placed there), with Capstan's (Keras') rules:
  Adagrad (--wide-learning-rate 0.05, initial accumulator 0.1, epsilon 1e-7)
          on the wide table (sparse: the batch's rows, repeated ids summed
          first) and the bias: ResourceSparseApplyAdagradV2 / ResourceApplyAdagradV2
  Adam    (--deep-learning-rate 0.0005, beta 0.9 / 0.999, epsilon 1e-7) on
          the embeddings and the MLP: ResourceApplyAdam, every row of the
          embedding table each step (the sparse gradient scattered into a
          dense one on the ps), as Keras' Adam and Capstan's sparse Adam do
Features (features.h, feature by feature): vocabulary ids for gender,
education, marital_status, relationship, workclass, race (unknown -> the id
after the list); occupation and native_country hashed into 1,000 buckets;
age bucketized at 18, 25, ..., 65; the crosses education x occupation, age
bucket x education x occupation and native_country x occupation (values
joined by "_X_") hashed into 1,000 buckets; capital_gain, capital_loss and
hours_per_week bucketized at features.h's boundaries; numeric age,
education_num, log1p(capital_gain), log1p(capital_loss), hours_per_week
standardised with features.h's constants. One id space for the wide ids,
with features.h's offsets.

Input: a per-worker dataset (ClusterCoordinator.create_per_worker_dataset)
of adult.data.gz: TextLineDataset (GZIP) -> filter (lines of 15 fields) ->
shuffle(10000) -> repeat -> batch(--batch-size 128, drop_remainder) ->
map(decode_csv and the features, vectorised over the batch) -> prefetch.
The scheduled tf.function takes the worker's next batch, runs the model,
the gradients (tf.GradientTape) and the updates. --steps (default: --epochs
x 255, adult.data's 32,561 rows in batches of 128, what census counts as an
epoch) are scheduled after --warmup steps (not timed: tracing, the first
shuffle buffer); examples/s = timed steps x batch size / (schedule to join).
Then the coordinator reads the variables and evaluates on all of
adult.test: accuracy, ROC AUC, log-loss.

What differs from Capstan's census, and why:
  - Hashing: TensorFlow's tf.strings.to_hash_bucket_fast (FarmHash) of the
    same text where features.h uses FNV-1a 64: the bucket numbers differ,
    their distribution is the same. Crosses hash the joined text
    ("a_X_b"), as features.h does, not feature columns' FingerprintCat64.
  - Shards of the input: under ParameterServerStrategy the dataset function
    is not told which worker runs it (its InputContext has one input
    pipeline), so each worker reads all of adult.data in its own shuffle
    order; census_bench.sh feeds Capstan's workers through the data service
    (2 data workers), census reads each record once per epoch. The number
    of examples a step trains on is the same (one batch of 128).
  - In flight: TensorFlow's coordinator runs one closure per worker at a
    time; census keeps 32 steps scheduled ahead. That is each system's
    design, and part of what is compared.
  - Timing: this script times after --warmup steps (its function traced,
    the shuffle buffers filled); census times every epoch from its first
    step, its start included, which favours TensorFlow a little.
  - Initial values come from TensorFlow's generators (torch's for the MLP in
    Capstan): the same distributions, not the same numbers.
  - Adam's step counter is one variable for all of Adam's variables (as in
    a Keras optimizer); Capstan's parameter servers count each variable's
    updates. With asynchronous workers both are approximations of "step".

    bench/peers/.venv/bin/python bench/peers/census_ps.py [--workers 2] [--ps 2] [--epochs 2 | --steps N]
        [--warmup 30] [--batch-size 128] [--data-dir examples/census/data] [--in-process]

Prints RESULT census_ps_<W>w (examples/s), census_test_accuracy_<W>w and
census_test_auc_<W>w.
"""
import argparse
import math
import os
import sys
import time

import peer_common
from peer_common import result

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINING_EXAMPLES = 32561  # adult.data's rows: census's epoch

# features.h, in its order.
COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
           "relationship", "race", "gender", "capital_gain", "capital_loss", "hours_per_week", "native_country",
           "income_bracket"]
INTEGER_COLUMNS = {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"}
VOCABULARIES = [
    ("gender", ["Female", "Male"]),
    ("education", ["Bachelors", "HS-grad", "11th", "Masters", "9th", "Some-college", "Assoc-acdm", "Assoc-voc",
                   "7th-8th", "Doctorate", "Prof-school", "5th-6th", "10th", "1st-4th", "Preschool", "12th"]),
    ("marital_status", ["Married-civ-spouse", "Divorced", "Married-spouse-absent", "Never-married", "Separated",
                        "Married-AF-spouse", "Widowed"]),
    ("relationship", ["Husband", "Not-in-family", "Wife", "Own-child", "Unmarried", "Other-relative"]),
    ("workclass", ["Self-emp-not-inc", "Private", "State-gov", "Federal-gov", "Local-gov", "Self-emp-inc",
                   "Without-pay", "Never-worked"]),
    ("race", ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]),
]
HASH_BUCKETS = 1000
AGE_BOUNDARIES = [18, 25, 30, 35, 40, 45, 50, 55, 60, 65]
CAPITAL_GAIN_BOUNDARIES = [1, 3000, 5000, 7000, 8000, 10000, 15000]
CAPITAL_LOSS_BOUNDARIES = [1, 1500, 1800, 1900, 2000, 2500]
HOURS_PER_WEEK_BOUNDARIES = [20, 30, 35, 40, 41, 50, 60]
# The wide columns' sizes, in the order of their ids (features.h's WideField).
FIELD_SIZES = ([len(v) + 1 for _, v in VOCABULARIES]  # + the out-of-vocabulary id
               + [HASH_BUCKETS, HASH_BUCKETS, len(AGE_BOUNDARIES) + 1, HASH_BUCKETS, HASH_BUCKETS, HASH_BUCKETS,
                  len(CAPITAL_GAIN_BOUNDARIES) + 1, len(CAPITAL_LOSS_BOUNDARIES) + 1,
                  len(HOURS_PER_WEEK_BOUNDARIES) + 1])
OFFSETS = [sum(FIELD_SIZES[:f]) for f in range(len(FIELD_SIZES))]
NUM_WIDE_FIELDS = len(FIELD_SIZES)            # 15
DEEP_FIELDS = 8                                # the categorical columns the deep part embeds
BIAS_ID = sum(FIELD_SIZES)                     # the wide table's rows (torch_model.h: bias_id())
EMBEDDING_ROWS = OFFSETS[DEEP_FIELDS]          # embedding_rows()
EMBEDDING_DIM = 8
NUMERIC_MEAN = [38.5816, 10.0807, 0.73462, 0.35031, 40.4375]
NUMERIC_STDDEV = [13.6402, 2.57268, 2.45470, 1.58456, 12.3472]
LAYERS = [DEEP_FIELDS * EMBEDDING_DIM + len(NUMERIC_MEAN), 100, 75, 50, 25, 1]


def input_functions(tf):
    """(is_record, features): the filter on lines and the map on a batch of
    lines, as pipeline.h's census_is_record and census_features."""
    defaults = [tf.constant(0, tf.int64) if c in INTEGER_COLUMNS else tf.constant("", tf.string) for c in COLUMNS]

    def is_record(line):
        return tf.size(tf.strings.split(line, ",")) == len(COLUMNS)

    def vocabulary_id(values, vocabulary):
        # std::find over a short list: the first match, or len(list).
        match = tf.equal(tf.expand_dims(values, 1), tf.constant(vocabulary)[tf.newaxis, :])
        found = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int64)
        return tf.where(tf.reduce_any(match, axis=1), found, tf.constant(len(vocabulary), tf.int64))

    def bucketize(values, boundaries):
        return tf.cast(tf.raw_ops.Bucketize(input=values, boundaries=[float(b) for b in boundaries]), tf.int64)

    def features(lines):
        # Fields are separated by ", "; "?" is missing (the column's default).
        lines = tf.strings.regex_replace(tf.strings.strip(lines), r"\s*,\s*", ",")
        row = dict(zip(COLUMNS, tf.io.decode_csv(lines, defaults, na_value="?")))
        age_bucket = bucketize(row["age"], AGE_BOUNDARIES)

        def hashed(text):
            return tf.strings.to_hash_bucket_fast(text, HASH_BUCKETS)

        def cross(*texts):
            return hashed(tf.strings.join(list(texts), separator="_X_"))

        ids = [vocabulary_id(row[name], vocabulary) for name, vocabulary in VOCABULARIES]
        ids += [hashed(row["occupation"]), hashed(row["native_country"]), age_bucket,
                cross(row["education"], row["occupation"]),
                cross(tf.strings.as_string(age_bucket), row["education"], row["occupation"]),
                cross(row["native_country"], row["occupation"]),
                bucketize(row["capital_gain"], CAPITAL_GAIN_BOUNDARIES),
                bucketize(row["capital_loss"], CAPITAL_LOSS_BOUNDARIES),
                bucketize(row["hours_per_week"], HOURS_PER_WEEK_BOUNDARIES)]
        wide_ids = tf.stack(ids, axis=1) + tf.constant(OFFSETS, tf.int64)[tf.newaxis, :]

        def as_float(name):
            return tf.cast(row[name], tf.float64)
        raw = tf.stack([as_float("age"), as_float("education_num"),
                        tf.math.log1p(tf.maximum(as_float("capital_gain"), 0.0)),
                        tf.math.log1p(tf.maximum(as_float("capital_loss"), 0.0)),
                        as_float("hours_per_week")], axis=1)
        numeric = tf.cast((raw - tf.constant(NUMERIC_MEAN, tf.float64)) / tf.constant(NUMERIC_STDDEV, tf.float64),
                          tf.float32)
        # adult.test writes ">50K." with a period.
        label = tf.cast(tf.strings.regex_full_match(row["income_bracket"], ">50K.*"), tf.float32)
        return wide_ids, numeric, label

    return is_record, features


class WideDeep:
    """The variables (created under the strategy's scope) and the forward
    pass of torch_model.h's WideDeep."""

    def __init__(self, tf):
        def variable(name, shape, make):
            # The strategy passes each shard's shape (and offset): the value
            # is made where the shard lives.
            def init(partition_shape=None, partition_offset=None):
                del partition_offset
                return make(partition_shape if partition_shape is not None else shape)
            return tf.Variable(init, shape=shape, dtype=tf.float32, name=name)

        self.wide = variable("wide", [BIAS_ID, 1], lambda s: tf.zeros(s))
        self.bias = variable("bias", [1], lambda s: tf.zeros(s))
        stddev = 1.0 / math.sqrt(EMBEDDING_DIM)
        self.embeddings = variable("embeddings", [EMBEDDING_ROWS, EMBEDDING_DIM],
                                   lambda s: tf.random.truncated_normal(s, stddev=stddev))
        self.layers = []
        for i, (n_in, n_out) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
            limit = math.sqrt(6.0 / (n_in + n_out))
            w = variable(f"deep{i}_weight", [n_in, n_out], lambda s, limit=limit: tf.random.uniform(s, -limit, limit))
            b = variable(f"deep{i}_bias", [n_out], lambda s: tf.zeros(s))
            self.layers.append((w, b))

    def logits(self, tf, wide_ids, numeric):
        wide_part = tf.reduce_sum(tf.nn.embedding_lookup(self.wide, wide_ids), axis=[1, 2]) + self.bias
        embedded = tf.nn.embedding_lookup(self.embeddings, wide_ids[:, :DEEP_FIELDS])
        x = tf.concat([tf.reshape(embedded, [-1, DEEP_FIELDS * EMBEDDING_DIM]), numeric], axis=1)
        for i, (w, b) in enumerate(self.layers):
            x = tf.matmul(x, w) + b
            if i + 1 < len(self.layers):
                x = tf.nn.relu(x)
        return wide_part + tf.squeeze(x, axis=1)


def shards(v):
    """A ShardedVariable's shards, or [v]."""
    return list(v.variables) if hasattr(v, "variables") else [v]


def roc_auc(probabilities, labels):
    """The area under the ROC curve: the Mann-Whitney statistic, ties at
    half."""
    import numpy as np
    _, inverse, counts = np.unique(probabilities, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="timed steps = epochs x 255 (default 2)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps, instead of --epochs")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first (default 30)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--wide-learning-rate", type=float, default=0.05)
    parser.add_argument("--deep-learning-rate", type=float, default=0.0005)
    parser.add_argument("--data-dir", default=os.path.join(REPO, "examples", "census", "data"))
    parser.add_argument("--in-process", action="store_true", help="the ps and worker servers in this process")
    args = parser.parse_args()
    steps_per_epoch = (TRAINING_EXAMPLES + args.batch_size - 1) // args.batch_size
    steps = args.steps if args.steps > 0 else args.epochs * steps_per_epoch
    train_path = os.path.abspath(os.path.join(args.data_dir, "adult.data.gz"))
    test_path = os.path.abspath(os.path.join(args.data_dir, "adult.test.gz"))
    for path in (train_path, test_path):
        if not os.path.isfile(path):
            print(f"census_ps.py: {path} is not a file (--data-dir)", file=sys.stderr)
            return 2

    cluster = peer_common.Cluster(workers=args.workers, ps=args.ps, in_process=args.in_process)
    try:
        import numpy as np
        import tensorflow as tf

        table_shapes = {(BIAS_ID, 1), (EMBEDDING_ROWS, EMBEDDING_DIM)}

        def partitioner(shape, dtype):
            # The two tables in 2 shards (fixed_shards(2)); the rest whole.
            del dtype
            parts = [1] * shape.rank
            if tuple(shape.as_list()) in table_shapes:
                parts[0] = 2
            return parts

        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver(), variable_partitioner=partitioner)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        is_record, features = input_functions(tf)

        with strategy.scope():
            model = WideDeep(tf)

            def slots(v, name, value):
                # A slot beside each shard of v, on the same ps.
                out = []
                for s in shards(v):
                    with strategy.extended.colocate_vars_with(s):
                        out.append(tf.Variable(tf.fill(s.shape, value), trainable=False,
                                               name=f"{s.name.split(':')[0]}/{name}"))
                return out

            adagrad = [(model.wide, slots(model.wide, "accumulator", 0.1)),
                       (model.bias, slots(model.bias, "accumulator", 0.1))]
            adam_vars = [model.embeddings] + [t for layer in model.layers for t in layer]
            adam = [(v, slots(v, "m", 0.0), slots(v, "v", 0.0)) for v in adam_vars]
            adam_iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_iterations")

        wide_lr = tf.constant(args.wide_learning_rate, tf.float32)
        deep_lr, beta_1, beta_2 = args.deep_learning_rate, 0.9, 0.999
        epsilon = tf.constant(1e-7, tf.float32)

        def apply(shard_list, grads, update):
            for s, g in zip(shard_list, grads):
                with tf.device(s.device):
                    update(s, g)

        def replica_step(wide_ids, numeric, label):
            trainables = [s for v in [model.wide, model.bias] + adam_vars for s in shards(v)]
            with tf.GradientTape() as tape:
                logits = model.logits(tf, wide_ids, numeric)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
            grads = dict(zip([id(s) for s in trainables], tape.gradient(loss, trainables)))

            for v, accumulators in adagrad:
                for s, acc in zip(shards(v), accumulators):
                    g = grads[id(s)]
                    with tf.device(s.device):
                        if isinstance(g, tf.IndexedSlices):
                            # Repeated ids summed first, as Keras (and Capstan) do.
                            unique, position = tf.unique(g.indices)
                            values = tf.math.unsorted_segment_sum(g.values, position, tf.size(unique))
                            tf.raw_ops.ResourceSparseApplyAdagradV2(
                                var=s.handle, accum=acc.handle, lr=wide_lr, epsilon=epsilon, grad=values,
                                indices=unique)
                        else:
                            tf.raw_ops.ResourceApplyAdagradV2(var=s.handle, accum=acc.handle, lr=wide_lr,
                                                              epsilon=epsilon, grad=g)
            t = tf.cast(adam_iterations.assign_add(1), tf.float32)
            beta_1_power, beta_2_power = tf.pow(beta_1, t), tf.pow(beta_2, t)
            for v, ms, vs in adam:
                for s, m, second in zip(shards(v), ms, vs):
                    g = grads[id(s)]
                    with tf.device(s.device):
                        if isinstance(g, tf.IndexedSlices):
                            # Every row moves (Keras' Adam): the batch's rows
                            # scattered into a dense gradient here on the ps.
                            g = tf.math.unsorted_segment_sum(g.values, g.indices, s.shape[0])
                        tf.raw_ops.ResourceApplyAdam(var=s.handle, m=m.handle, v=second.handle,
                                                     beta1_power=beta_1_power, beta2_power=beta_2_power,
                                                     lr=tf.constant(deep_lr, tf.float32),
                                                     beta1=tf.constant(beta_1, tf.float32),
                                                     beta2=tf.constant(beta_2, tf.float32), epsilon=epsilon, grad=g)
            correct = tf.reduce_sum(tf.cast(tf.equal(logits > 0, label > 0.5), tf.int64))
            return loss, correct

        def dataset_fn():
            return (tf.data.TextLineDataset(train_path, compression_type="GZIP")
                    .filter(is_record)
                    .shuffle(10000)
                    .repeat()
                    .batch(args.batch_size, drop_remainder=True)
                    .map(features, num_parallel_calls=tf.data.AUTOTUNE)
                    .prefetch(tf.data.AUTOTUNE))

        per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
        per_worker_iterator = iter(per_worker_dataset)

        @tf.function
        def train_step(iterator):
            wide_ids, numeric, label = next(iterator)
            return strategy.run(replica_step, args=(wide_ids, numeric, label))

        def train(n):
            values = [coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(n)]
            coordinator.join()
            return values

        start = time.perf_counter()
        train(args.warmup)
        warmup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        values = train(steps)
        seconds = time.perf_counter() - start
        fetched = [v.fetch() for v in values[-min(steps, steps_per_epoch):]]  # the last epoch's
        train_loss = float(np.mean([loss for loss, _ in fetched]))
        train_accuracy = sum(int(c) for _, c in fetched) / (len(fetched) * args.batch_size)
        rate = steps * args.batch_size / seconds

        # Evaluation here on the coordinator, with the variables' values.
        def value(v):
            return tf.constant(np.concatenate([s.numpy() for s in shards(v)], axis=0))

        class Snapshot:
            pass
        snapshot = Snapshot()
        snapshot.wide, snapshot.bias, snapshot.embeddings = value(model.wide), value(model.bias), value(
            model.embeddings)
        snapshot.layers = [(value(w), value(b)) for w, b in model.layers]
        probabilities, labels = [], []
        test = tf.data.TextLineDataset(test_path, compression_type="GZIP").filter(is_record).batch(4096).map(features)
        for wide_ids, numeric, label in test:
            probabilities.append(tf.sigmoid(WideDeep.logits(snapshot, tf, wide_ids, numeric)).numpy())
            labels.append(label.numpy())
        p, y = np.concatenate(probabilities), np.concatenate(labels)
        accuracy = float(np.mean((p > 0.5) == (y > 0.5)))
        clipped = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
        log_loss = float(-np.mean(np.where(y > 0.5, np.log(clipped), np.log(1 - clipped))))
        auc = roc_auc(p, y)

        print(f"tensorflow {tf.__version__} ParameterServerStrategy + ClusterCoordinator, census Wide & Deep, "
              f"{args.workers} workers, {args.ps} ps, {'in-process' if args.in_process else 'one process per task'}:")
        print(f"  trained {steps} steps x {args.batch_size} = {steps * args.batch_size} examples in {seconds:.1f} s "
              f"({rate:.0f} examples/s; after {args.warmup} warm-up steps in {warmup_seconds:.1f} s)")
        print(f"  last epoch's batches: loss {train_loss:.4f}  accuracy {train_accuracy:.4f}")
        print(f"  adult.test ({len(y)} examples): accuracy {100 * accuracy:.2f}%  AUC {auc:.4f}  "
              f"log-loss {log_loss:.4f}")
        result(f"census_ps_{args.workers}w", rate, "examples/s")
        result(f"census_test_accuracy_{args.workers}w", accuracy, "fraction")
        result(f"census_test_auc_{args.workers}w", auc, "auc")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
