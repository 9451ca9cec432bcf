"""TensorFlow's answer to issue 35's kill: the census Wide & Deep trained
synchronously by 2 worker processes under
tf.distribute.MultiWorkerMirroredStrategy, Keras model.fit with
keras.callbacks.BackupAndRestore; one worker is killed with SIGKILL every
--kill-every seconds. MWMS cannot go on with a worker missing, so this
script does what a supervisor (Kubernetes, systemd) must do for it: kill the
survivor too and restart every worker --restart-after seconds after the
kill; BackupAndRestore resumes each from the last backup. The figure to
compare with Capstan's side (issue 35's failure bench) is the time lost per
failure.

    bench/peers/.venv/bin/python bench/peers/mwms_failure.py [--seconds 300] [--kill-every 30]
        [--restart-after 2] [--batch-size 256] [--save-freq 50] [--no-kill | --no-baseline]
        [--survivor-wait 0] [--data-dir examples/census/data] [--dir DIR]

(bench/peers/venv.sh makes the venv; on a shared 2-core machine prefix
`nice -n 19`.) Two phases, each --seconds long, each on a fresh pair of
workers and an empty backup directory: a failure-free run (--no-baseline
skips it; --baseline-rate gives its figure instead), then the run with
failures (--no-kill skips it). A phase's clock starts at the first step
either worker completes (process start, TensorFlow's import, the cluster's
start and the tracing of the step are not in it: the first start is
printed apart); kills fall at that time + k x --kill-every, whether or not
the job has recovered from the last one; the victim alternates, worker 1
first (worker 0 is the chief: it writes the backup and leads TF's
coordination service).

The job (one `mwms_failure.py worker` process per task, TF_CONFIG with two
workers on free loopback ports, kept across restarts as a supervisor keeps
addresses; CPU only):
  - the model of census_ps.py (torch_model.h's Wide & Deep, its features
    and constants, census_ps.input_functions) as a Keras functional model:
    wide = Embedding(bias_id, 1, zeros) summed over the 15 wide ids + bias,
    deep = Embedding(embedding_rows, 8, truncated normal 1/sqrt(8)) of the
    first 8 ids and the 5 numeric features through Dense 100-75-50-25 (ReLU,
    Glorot uniform) -> 1; sigmoid cross-entropy from logits
  - input: adult.data(.gz) -> filter -> shuffle(10000, a new seed per
    start) -> repeat -> batch(--batch-size, the global batch, default 256) ->
    features -> prefetch, sharded by AutoShardPolicy.DATA (one file: TF's
    AUTO would fail); MWMS splits each global batch between the 2 workers
  - model.fit(epochs=10**6, steps_per_epoch=census's epoch at this batch,
    verbose=0) with BackupAndRestore(save_freq=--save-freq steps, default
    50): the chief writes the backup (weights and optimizer state, the step
    counter among them) to DIR/<phase>/backup; worker 1 writes its copy to a
    scratch directory of its own (as tf_keras does for non-chief workers;
    Keras 3 would otherwise have both write one file) and both restore
    from the chief's. Files are written beside and renamed into place, so a
    kill mid-write leaves the previous backup whole.
  - a callback logs every completed step: the wall time and the global step
    (the optimizer's iterations, which the backup restores) to
    DIR/<phase>/steps-w<i>.log, which this script reads.

Figures (a summary, RESULT lines in bench/compare's format, though it does
not run this bench, and one JSON line):
  failure-free steps/s   global steps per second in the failure-free phase
  steps/s with failures  steps committed / --seconds: committed = the
                         global step at the phase's end minus the one at its
                         start (what the model state holds; steps trained
                         after the last backup and lost in a kill are not;
                         if the job is restarting at the end, its last
                         backup's step)
  step efficiency        committed / attempted (attempted: every step any
                         incarnation completed, redone ones included)
  kill -> next step      from each kill to the first step the restarted job
                         completes, p50 / max (a kill that comes before the
                         job recovered from the previous one has none)
  steps redone           per kill: the last step completed before the kill
                         minus the step the restart restored (the backup's
                         age), total and mean
  time lost per failure  (failure-free steps/s x --seconds - committed) /
                         failures / failure-free steps/s, in seconds of
                         failure-free training: restart, TF's start-up,
                         re-tracing and the redone steps together
  ... in phase           the same with the failure phase's own rate while
                         the job was up (each incarnation's first to last
                         step) for the failure-free rate: steadier where the
                         machine's load changes between the phases
  survivor               for each kill, when the surviving worker's fit
                         raised (and what), and whether the process exited
                         by itself before the harness killed it (after how
                         long, its exit status) or was still there
                         (--survivor-wait S waits up to S s for it before the
                         restart, to see what TF does on its own)

What differs from Capstan's side (issue 35's bench):
  - Capstan restarts only the killed worker; its strategy goes on with the
    live ones meanwhile. MWMS cannot: every process restarts, re-imports
    TensorFlow, re-forms the cluster and re-traces the step.
  - The backup is every --save-freq steps, so up to that many steps are
    redone; Capstan's strategy (issue 35) redoes only the failed step.
  - Keras 3's BackupAndRestore restores the weights, the optimizer and the
    epoch, not the position in the epoch: the input restarts at the
    epoch's start (reshuffled), so examples are neither exactly-once nor
    counted here.
  - One Adam (learning rate --learning-rate, default 0.0005) on every
    variable: Keras' fit takes one optimizer; Capstan's census uses Adagrad
    on the wide part and Adam on the deep part. Step cost is about the same
    (the tables are small); convergence is not compared here.
  - Hashing and initial values as census_ps.py (FarmHash, TF's generators).
  - Keras 3.15's fit needs two patches under MWMS (in worker_main, with the
    errors they avoid): the model is built from a local batch, and each
    worker's logs (the loss) are its own rather than reduced across workers.
    Neither touches the training step: the optimizer all-reduces the
    gradients every step.

Seen (TF 2.21, Keras 3.15, a shared 2-core machine): when worker 1 dies,
worker 0's collective raises UnavailableError ("Collective ops is aborted
by: recvmsg:Connection reset by peer") within a second and the process
exits (status 1) a second or two later. When worker 0 dies (the chief and
the coordination service's leader), worker 1 raised only after 13 s and its
process took 37 s to exit (--survivor-wait 45), so a supervisor that waits
for exits loses that too. Every figure here moves with the machine's load:
a nice -n 19 run beside a compile gets little CPU, and TF's restart (import,
cluster, tracing) is CPU-bound.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import peer_common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow loads)
from peer_common import result  # noqa: E402

TRAINING_EXAMPLES = 32561  # adult.data's rows: census's epoch


# ---------------------------------------------------------------- worker --

def worker_main(argv):
    parser = argparse.ArgumentParser(prog="mwms_failure.py worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--save-freq", type=int, required=True)
    parser.add_argument("--learning-rate", type=float, required=True)
    args = parser.parse_args(argv)

    # Die with the harness, however it ends.
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)

    log = open(os.path.join(args.dir, f"steps-w{args.index}.log"), "a", buffering=1)
    log.write(f"start {args.incarnation} {time.time():.6f}\n")

    import math
    import tensorflow as tf
    import keras
    keras.config.disable_traceback_filtering()
    import census_ps as census

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if strategy.num_replicas_in_sync != 2:
        print(f"worker {args.index}: {strategy.num_replicas_in_sync} replicas in sync, not 2 (TF_CONFIG "
              f"{os.environ.get('TF_CONFIG')})", file=sys.stderr, flush=True)
        return 1
    is_record, features = census.input_functions(tf)
    compression = "GZIP" if args.data.endswith(".gz") else ""

    def dataset():
        options = tf.data.Options()  # one file: each worker keeps every 2nd batch of the same order
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return (tf.data.TextLineDataset(args.data, compression_type=compression)
                .filter(is_record)
                .shuffle(10000, seed=args.incarnation * 2 + 1)  # both workers alike, new per start
                .repeat()
                .batch(args.batch_size, drop_remainder=True)
                .map(lambda lines: (lambda w, n, y: ((w, n), y))(*features(lines)),
                     num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE)
                .with_options(options))

    with strategy.scope():
        wide_ids = keras.Input(shape=(census.NUM_WIDE_FIELDS,), dtype="int64", name="wide_ids")
        numeric = keras.Input(shape=(len(census.NUMERIC_MEAN),), dtype="float32", name="numeric")
        wide = keras.layers.Embedding(census.BIAS_ID, 1, embeddings_initializer="zeros", name="wide")(wide_ids)
        wide = keras.layers.Dense(1, kernel_initializer="ones", use_bias=True, trainable=True, name="wide_sum")(
            keras.layers.Flatten()(wide))
        stddev = 1.0 / math.sqrt(census.EMBEDDING_DIM)
        deep_ids = keras.layers.Lambda(lambda ids: ids[:, :census.DEEP_FIELDS], output_shape=(census.DEEP_FIELDS,))(
            wide_ids)
        embedded = keras.layers.Embedding(
            census.EMBEDDING_ROWS, census.EMBEDDING_DIM,
            embeddings_initializer=keras.initializers.TruncatedNormal(stddev=stddev), name="embeddings")(deep_ids)
        x = keras.layers.Concatenate()([keras.layers.Flatten()(embedded), numeric])
        for width in census.LAYERS[1:-1]:
            x = keras.layers.Dense(width, activation="relu")(x)
        deep = keras.layers.Dense(1)(x)
        logit = keras.layers.Flatten()(keras.layers.Add()([wide, deep]))
        model = keras.Model([wide_ids, numeric], logit)
        # The wide part is a sum of rows, as torch_model.h has it: Keras has
        # no sum-of-embeddings layer, so a Dense whose kernel is fixed at
        # ones sums them, and its bias is the model's bias.
        model.get_layer("wide_sum").kernel.trainable = False
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))

    scratch = os.path.join(args.dir, f"scratch-w{args.index}")
    backup = SharedBackup(os.path.join(args.dir, "backup"), scratch, args.index == 0, args.save_freq, keras,
                          on_saved=lambda step: log.write(f"backup {args.incarnation} {time.time():.6f} {step}\n"))

    class StepLog(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            log.write(f"restored {args.incarnation} {time.time():.6f} {int(self.model.optimizer.iterations.numpy())}\n")

        def on_train_batch_end(self, batch, logs=None):
            log.write(f"step {args.incarnation} {time.time():.6f} {int(self.model.optimizer.iterations.numpy())}\n")

    # Keras 3.15's fit builds the model's optimizer and metrics from the
    # first distributed batch reduced with strategy.reduce, which MWMS
    # cannot do for a nested batch ((ids, numeric), label): "Attempt to
    # convert a value (PerReplica...) to a Tensor". Build from one local
    # batch instead; the training steps themselves are Keras' own.
    sample = next(iter(dataset().take(1)))

    def symbolic_build(iterator=None, data_batch=None):
        del iterator, data_batch
        with strategy.scope():
            model._symbolic_build(data_batch=sample)
    model._maybe_symbolic_build = symbolic_build

    # And its step function reduces each scalar log (the loss) across
    # workers with strategy.reduce("MEAN", v, axis=0), which fails for a
    # scalar under MWMS ("Invalid reduction dimension 0 for input with 0
    # dimensions"). Take the non-MWMS path: each worker's logs are its own
    # (this script does not read them); the gradients are still all-reduced
    # by the optimizer, every step.
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer
    keras_tf_trainer._collective_all_reduce_multi_worker = lambda strategy: False

    steps_per_epoch = TRAINING_EXAMPLES // args.batch_size
    try:
        model.fit(dataset(), epochs=10 ** 6, steps_per_epoch=steps_per_epoch, verbose=0,
                  callbacks=[backup.callback, StepLog()])
    except Exception as e:
        # When this worker noticed its peer's death, and how (the exit may
        # come much later, or never).
        log.write(f"error {args.incarnation} {time.time():.6f} {type(e).__name__}\n")
        raise
    return 0


class SharedBackup:
    """keras.callbacks.BackupAndRestore made safe for two workers: the chief
    (index 0) saves to backup_dir, the other worker to its own scratch_dir
    (every worker must save: a save reads variables, which can take part in
    collectives); both restore from backup_dir. Each file is written beside
    and renamed into place."""

    def __init__(self, backup_dir, scratch_dir, is_chief, save_freq, keras, on_saved=None):
        outer = self
        self.save_dir = backup_dir if is_chief else scratch_dir
        self.on_saved = on_saved if is_chief else None  # called with the step once a backup is in place

        class Callback(keras.callbacks.BackupAndRestore):
            def _save_model(self):
                os.makedirs(outer.save_dir, exist_ok=True)
                weights = os.path.join(outer.save_dir, "latest.weights.h5")
                metadata = os.path.join(outer.save_dir, "training_metadata.json")
                self.model.save_weights(weights + ".tmp.weights.h5", overwrite=True)
                os.replace(weights + ".tmp.weights.h5", weights)
                with open(metadata + ".tmp", "w") as f:
                    json.dump({"epoch": self._current_epoch, "batch": self._last_batch_seen,
                               "step": int(self.model.optimizer.iterations.numpy())}, f)
                os.replace(metadata + ".tmp", metadata)
                if outer.on_saved:
                    outer.on_saved(int(self.model.optimizer.iterations.numpy()))

        self.callback = Callback(backup_dir, save_freq=save_freq, delete_checkpoint=False)


# --------------------------------------------------------------- harness --

class Job:
    """The two worker processes of one incarnation of the job; each in a
    process group of its own."""

    def __init__(self, args, phase_dir, ports, incarnation):
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        self.procs = []
        self.started = time.time()
        for index in range(len(ports)):
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
                                                         "task": {"type": "worker", "index": index}}),
                       CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
            err = open(os.path.join(phase_dir, f"w{index}-{incarnation}.err"), "w")
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "worker", "--index", str(index),
                 "--incarnation", str(incarnation), "--dir", phase_dir, "--data", args.data,
                 "--batch-size", str(args.batch_size), "--save-freq", str(args.save_freq),
                 "--learning-rate", str(args.learning_rate)],
                env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, start_new_session=True))
            err.close()

    def kill(self, index):
        proc = self.procs[index]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def kill_all(self):
        for index in range(len(self.procs)):
            self.kill(index)


LIVE_JOBS = []  # every Job started and not yet killed, for cleanup on any exit


def read_log(phase_dir, workers):
    """(steps, restores, starts, backups): steps = [(time, incarnation,
    global step)], restores = {incarnation: global step restored}, starts =
    {incarnation: first start time}, backups = [(time, global step)] in
    place, errors = {(incarnation, worker): (time, exception type)}; from
    every worker's log."""
    steps, restores, starts, backups, errors = [], {}, {}, [], {}
    for index in range(workers):
        path = os.path.join(phase_dir, f"steps-w{index}.log")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3 or not line.endswith("\n"):
                    continue  # a line cut by the kill
                kind, incarnation, t = fields[0], int(fields[1]), float(fields[2])
                if kind == "step":
                    steps.append((t, incarnation, int(fields[3])))
                elif kind == "restored":
                    restores[incarnation] = int(fields[3])
                elif kind == "start":
                    starts[incarnation] = min(t, starts.get(incarnation, t))
                elif kind == "backup":
                    backups.append((t, int(fields[3])))
                elif kind == "error":
                    errors[(incarnation, index)] = (t, fields[3])
    steps.sort()
    backups.sort()
    return steps, restores, starts, backups, errors


def run_phase(args, name, kills):
    """Runs one phase; returns its figures."""
    phase_dir = os.path.join(args.dir, name)
    os.makedirs(phase_dir)
    ports = [peer_common.free_port() for _ in range(2)]
    incarnation = 0
    job = Job(args, phase_dir, ports, incarnation)
    LIVE_JOBS.append(job)

    deadline = time.time() + args.start_timeout
    while True:
        steps, _, starts, _, _ = read_log(phase_dir, 2)
        if steps:
            break
        for index, proc in enumerate(job.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"worker {index} exited ({proc.returncode}) before its first step: "
                                   f"see {phase_dir}/w{index}-0.err")
        if time.time() > deadline:
            raise RuntimeError(f"no step within --start-timeout {args.start_timeout} s: see {phase_dir}/w*-0.err")
        time.sleep(0.1)
    t0, _, step0 = steps[0]
    end = t0 + args.seconds
    cold_start = t0 - starts[0]
    print(f"  {name}: first step {cold_start:.1f} s after the workers started; running {args.seconds:.0f} s",
          flush=True)

    events = []  # per kill: {"time", "victim", "incarnation", "survivor"}
    unplanned = []
    next_kill = t0 + args.kill_every if kills else float("inf")
    while time.time() < end:
        now = time.time()
        if now >= next_kill:
            victim = 1 - len(events) % 2  # worker 1 first
            kill_time = time.time()
            job.kill(victim)
            event = {"time": kill_time, "victim": victim, "incarnation": incarnation}
            # What the survivor does on its own until the restart.
            survivor = job.procs[1 - victim]
            wait_until = kill_time + max(args.restart_after, args.survivor_wait)
            while time.time() < wait_until and survivor.poll() is None:
                time.sleep(0.02)
            if survivor.poll() is None:
                event["survivor"] = {"exited": False, "waited_s": time.time() - kill_time}
            else:
                event["survivor"] = {"exited": True, "after_s": time.time() - kill_time, "rc": survivor.returncode}
            job.kill_all()
            LIVE_JOBS.remove(job)
            time.sleep(max(0.0, kill_time + args.restart_after - time.time()))
            incarnation += 1
            event["restart_time"] = time.time()
            job = Job(args, phase_dir, ports, incarnation)
            LIVE_JOBS.append(job)
            events.append(event)
            next_kill += args.kill_every
            while next_kill <= time.time():  # a survivor wait longer than --kill-every
                next_kill += args.kill_every
            continue
        exited = [i for i, p in enumerate(job.procs) if p.poll() is not None]
        if exited:
            # Not our kill: restart the job, as a supervisor would, and say so.
            unplanned.append({"time": now, "workers": exited,
                              "rc": [job.procs[i].returncode for i in exited]})
            job.kill_all()
            LIVE_JOBS.remove(job)
            incarnation += 1
            job = Job(args, phase_dir, ports, incarnation)
            LIVE_JOBS.append(job)
        time.sleep(0.05)
    job.kill_all()
    LIVE_JOBS.remove(job)

    steps, restores, starts, backups, errors = read_log(phase_dir, 2)
    in_window = [s for s in steps if t0 <= s[0] <= end]
    # Committed at the end: the live job's last step; if it has made none
    # yet (still restarting), what it will restore: the last backup.
    if in_window and in_window[-1][1] == incarnation:
        end_step = in_window[-1][2]
    else:
        end_step = max([b for t, b in backups if t <= end] + [step0])
    committed = end_step - step0
    attempted = len({(inc, step) for _, inc, step in in_window})
    recoveries, redone = [], []
    # The job's rate while up, in this phase: each incarnation from its first
    # step to its last (the load of a shared machine changes between phases).
    up_steps = up_seconds = 0.0
    for inc in sorted({s[1] for s in in_window}):
        mine = [s for s in in_window if s[1] == inc]
        up_steps += len({s[2] for s in mine}) - 1
        up_seconds += mine[-1][0] - mine[0][0]
    for event in events:
        noticed = errors.get((event["incarnation"], 1 - event["victim"]))
        if noticed:
            event["survivor"]["error_after_s"] = noticed[0] - event["time"]
            event["survivor"]["error"] = noticed[1]
        before = [s for s in steps if s[1] == event["incarnation"] and s[0] <= event["time"]]
        after = [s for s in steps if s[1] > event["incarnation"] and s[0] > event["time"]]
        next_kill_time = min([e["time"] for e in events if e["time"] > event["time"]] + [float("inf")])
        if after and after[0][1] == event["incarnation"] + 1 and after[0][0] < next_kill_time:
            event["recovery_s"] = after[0][0] - event["time"]
            event["start_to_step_s"] = after[0][0] - starts.get(event["incarnation"] + 1, event["restart_time"])
            recoveries.append(event["recovery_s"])
        restored = restores.get(event["incarnation"] + 1)
        if before and restored is not None:
            event["last_step"] = before[-1][2]
            event["restored_step"] = restored
            event["redone"] = before[-1][2] - restored
            redone.append(event["redone"])
    return {"name": name, "seconds": args.seconds, "t0": t0, "cold_start_s": cold_start, "committed": committed,
            "up_steps_per_s": up_steps / up_seconds if up_seconds > 0 else 0.0,
            "attempted": attempted, "steps_per_s": committed / args.seconds, "kills": events,
            "unplanned": unplanned, "recoveries": recoveries, "redone": redone, "dir": phase_dir}


def summarize(args, baseline, failures):
    out = {"batch_size": args.batch_size, "save_freq": args.save_freq, "seconds": args.seconds,
           "kill_every": args.kill_every, "restart_after": args.restart_after}
    rate = baseline["steps_per_s"] if baseline else args.baseline_rate
    if baseline:
        print(f"failure-free: {baseline['committed']} steps in {args.seconds:.0f} s = {rate:.2f} steps/s "
              f"({rate * args.batch_size:.0f} examples/s); first step {baseline['cold_start_s']:.1f} s after start")
        out["failure_free_steps_per_s"] = rate
        out["cold_start_s"] = baseline["cold_start_s"]
        result("mwms_failure_free_steps_per_s", rate, "steps/s")
    if failures:
        f = failures
        failures_n = len(f["kills"]) + len(f["unplanned"])
        print(f"with a kill every {args.kill_every:.0f} s, restart {args.restart_after:.0f} s later: "
              f"{f['committed']} steps committed in {args.seconds:.0f} s = {f['steps_per_s']:.2f} steps/s; "
              f"{len(f['kills'])} kills, {len(f['unplanned'])} unplanned exits")
        efficiency = f["committed"] / f["attempted"] if f["attempted"] else 0.0
        print(f"  step efficiency (committed / attempted): {f['committed']} / {f['attempted']} = {efficiency:.3f}")
        out.update(steps_per_s_with_failures=f["steps_per_s"], committed=f["committed"], attempted=f["attempted"],
                   step_efficiency=efficiency, kills=len(f["kills"]), unplanned=len(f["unplanned"]))
        if f["recoveries"]:
            r = sorted(f["recoveries"])
            p50, worst = statistics.median(r), r[-1]
            print(f"  kill -> next step of the restarted job: p50 {p50:.1f} s, max {worst:.1f} s "
                  f"({len(r)} of {len(f['kills'])} kills recovered before the next)")
            out.update(recovery_p50_s=p50, recovery_max_s=worst, recovered=len(r))
            result("mwms_kill_to_next_step_p50", p50, "s")
        if f["redone"]:
            print(f"  steps redone (trained after the last backup, lost, trained again): {sum(f['redone'])} "
                  f"(mean {statistics.mean(f['redone']):.1f} per kill; backup every {args.save_freq} steps)")
            out.update(steps_redone=sum(f["redone"]), steps_redone_mean=statistics.mean(f["redone"]))
        for k, e in enumerate(f["kills"]):
            s = e["survivor"]
            fate = (f"exited by itself after {s['after_s']:.1f} s (status {s['rc']})" if s["exited"]
                    else f"still running {s['waited_s']:.1f} s after the kill (killed by the harness)")
            if "error" in s:
                fate = f"raised {s['error']} {s['error_after_s']:.1f} s after the kill, " + fate
            recovered = (f"first step {e['recovery_s']:.1f} s after the kill "
                         f"({e['start_to_step_s']:.1f} s after the restart)" if "recovery_s" in e
                         else "no step before the next kill or the end")
            redone = (f", steps {e['restored_step']}..{e['last_step']} redone" if "redone" in e else "")
            print(f"  kill {k + 1} at +{e['time'] - f['t0']:.0f} s "
                  f"(worker {e['victim']}): survivor {fate}; {recovered}{redone}")
        out["survivors"] = [e["survivor"] for e in f["kills"]]
        if rate and failures_n:
            lost_steps = (rate * args.seconds - f["committed"]) / failures_n
            lost = lost_steps / rate
            print(f"  time lost per failure: ({rate:.2f} x {args.seconds:.0f} - {f['committed']}) / {failures_n} "
                  f"= {lost_steps:.0f} steps = {lost:.1f} s of failure-free training")
            out.update(time_lost_per_failure_s=lost, steps_lost_per_failure=lost_steps)
            result("mwms_time_lost_per_failure", lost, "s")
        up = f["up_steps_per_s"]
        if up and failures_n:
            lost_steps = (up * args.seconds - f["committed"]) / failures_n
            print(f"  the same from this phase's own rate while up ({up:.2f} steps/s): "
                  f"({up:.2f} x {args.seconds:.0f} - {f['committed']}) / {failures_n} = {lost_steps:.0f} steps = "
                  f"{lost_steps / up:.1f} s per failure")
            out.update(up_steps_per_s=up, time_lost_per_failure_in_phase_s=lost_steps / up)
            if rate and abs(up / rate - 1) > 0.1:
                print(f"  (the failure-free phase ran at {rate:.2f} steps/s, {100 * (up / rate - 1):+.0f}%: the "
                      f"machine's load changed between the phases; the figure from this phase's own rate is "
                      f"the steadier one)")
            result("mwms_time_lost_per_failure_in_phase", lost_steps / up, "s")
        result("mwms_steps_per_s_with_failures", f["steps_per_s"], "steps/s")
        result("mwms_step_efficiency", efficiency, "fraction")
    print("JSON " + json.dumps(out), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300, help="each phase's length (default 300)")
    parser.add_argument("--kill-every", type=float, default=30)
    parser.add_argument("--restart-after", type=float, default=2, help="restart all workers this long after a kill")
    parser.add_argument("--survivor-wait", type=float, default=0,
                        help="wait up to this long for the survivor to exit by itself before restarting")
    parser.add_argument("--batch-size", type=int, default=256, help="the global batch (default 256)")
    parser.add_argument("--save-freq", type=int, default=50, help="BackupAndRestore's save_freq in steps")
    parser.add_argument("--learning-rate", type=float, default=0.0005)
    parser.add_argument("--no-kill", action="store_true", help="only the failure-free phase")
    parser.add_argument("--no-baseline", action="store_true", help="only the phase with failures")
    parser.add_argument("--baseline-rate", type=float, default=0.0,
                        help="failure-free steps/s for --no-baseline's time lost")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--data-dir", default=os.path.join(REPO, "examples", "census", "data"),
                        help="holds adult.data.gz or adult.data (default examples/census/data)")
    parser.add_argument("--dir", default="", help="logs and backups (default .run/mwms_failure/<time>)")
    args = parser.parse_args()
    if args.no_kill and args.no_baseline:
        parser.error("--no-kill and --no-baseline leave nothing to run")
    args.data = next((os.path.abspath(os.path.join(args.data_dir, n)) for n in ("adult.data.gz", "adult.data")
                      if os.path.isfile(os.path.join(args.data_dir, n))), None)
    if args.data is None:
        print(f"mwms_failure.py: no adult.data(.gz) in {args.data_dir} (--data-dir)", file=sys.stderr)
        return 2
    args.dir = os.path.abspath(args.dir or os.path.join(REPO, ".run", "mwms_failure", time.strftime("%Y%m%d-%H%M%S")))
    os.makedirs(args.dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    print(f"MultiWorkerMirroredStrategy + BackupAndRestore(save_freq={args.save_freq}), census Wide & Deep, "
          f"2 workers, global batch {args.batch_size}, {args.data}; logs in {args.dir}", flush=True)
    baseline = failures = None
    try:
        if not args.no_baseline:
            baseline = run_phase(args, "failure-free", kills=False)
        if not args.no_kill:
            failures = run_phase(args, "failures", kills=True)
    except KeyboardInterrupt:
        print("mwms_failure.py: interrupted", file=sys.stderr)
        return 130
    finally:
        for job in list(LIVE_JOBS):
            job.kill_all()
    with open(os.path.join(args.dir, "phases.json"), "w") as f:
        json.dump({"baseline": baseline, "failures": failures}, f, indent=1)
    summarize(args, baseline, failures)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main())
