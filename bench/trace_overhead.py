#!/usr/bin/env python3
"""bench/trace_overhead.py: what tracing costs (issue 36), in one run.

    bench/trace_overhead.py --before DIR [--after DIR] [--runs 5]
                            [--benches closure,collective] [--settle 10]

Runs closure_bench and collective_bench from three places, alternating,
round after round (each round rotates the order):

  before  DIR/closure_bench ...  (a build from before the tracing code;
          --before names its bin directory)
  off     the current build (--after, default build/bin), tracing off
  on      the current build with tracing on: closure_bench --trace-seconds
          (every process of the cluster records a trace through the
          throughput and latency runs), collective_bench --trace on

each after the CPUs have settled (90% idle, up to --settle seconds). It
prints, per figure, each variant's median and the median of the per-round
ratios off/before and on/off with their range (the pairs of one round ran
minutes apart at most: the range is the noise of this machine). Higher is
better for closures/s; lower for latencies and all-reduce times.

Python 3 standard library only; figures on stdout, logs in --log-dir.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_idle_share(interval):
    def read():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)
    idle0, total0 = read()
    time.sleep(interval)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)


def settle(max_seconds, wanted=0.9):
    start = time.time()
    while time.time() - start < max_seconds:
        if cpu_idle_share(0.5) >= wanted:
            return
    print(f"# (the CPUs did not settle to {wanted:.0%} idle in {max_seconds} s)", flush=True)


def closure_figures(output):
    out = {}
    for m in re.finditer(r"^RESULT (closures_per_s_\S+|schedule_fetch_p50_\S+) (\S+) (\S+)$", output, re.M):
        out[m.group(1)] = (float(m.group(2)), "higher" if m.group(3) == "closures/s" else "lower")
    return out


def collective_figures(output):
    # op via ranks bytes p50_us algbw busbw
    out = {}
    for line in output.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0] in ("all_reduce", "broadcast", "all_gather") and f[2].isdigit():
            out[f"{f[0]}_{f[1]}_{f[2]}r_{f[3]}B_p50_us"] = (float(f[4]), "lower")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="bin directory of a build from before the tracing code")
    parser.add_argument("--after", default=os.path.join(REPO, os.environ.get("CAPSTAN_BUILD_DIR", "build"), "bin"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--benches", default="closure,collective")
    parser.add_argument("--closure-configs", default="2x1,2x4")
    parser.add_argument("--closures", type=int, default=20000)
    parser.add_argument("--trace-seconds", type=float, default=0,
                        help="closure_bench --trace-seconds (default: measured from a first untraced run)")
    parser.add_argument("--collective-args", default="--ranks 2 --transports shm,tcp --max-bytes 4194304")
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".run", "trace_overhead"))
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    for d in (args.before, args.after):
        for b in ("closure_bench", "collective_bench"):
            if not os.access(os.path.join(d, b), os.X_OK):
                sys.exit(f"trace_overhead: {os.path.join(d, b)} is not an executable; build it "
                         "(--before: a build from before the tracing code, e.g. commit 8bb9d2c)")
    benches = [b for b in args.benches.split(",") if b]
    for b in benches:
        if b not in ("closure", "collective"):
            sys.exit(f"trace_overhead: --benches takes closure and collective, not '{b}'")

    trace_seconds = args.trace_seconds
    closure_args = ["--configs", args.closure_configs, "--no-breakdown", "--closures", str(args.closures)]

    def run(variant, bench, log_name):
        binary = os.path.join(args.before if variant == "before" else args.after, bench + "_bench")
        cmd = [binary] + (closure_args if bench == "closure" else args.collective_args.split())
        if variant == "on":
            cmd += ["--trace-seconds", f"{trace_seconds:.1f}"] if bench == "closure" else ["--trace", "on"]
        settle(args.settle)
        started = time.time()
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.time() - started
        with open(os.path.join(args.log_dir, log_name), "w") as f:
            f.write(" ".join(cmd) + "\n" + done.stdout)
        if done.returncode != 0:
            sys.exit(f"trace_overhead: {' '.join(cmd)} failed (exit {done.returncode}); see {args.log_dir}/{log_name}")
        figures = closure_figures(done.stdout) if bench == "closure" else collective_figures(done.stdout)
        if not figures:
            sys.exit(f"trace_overhead: no figures from {' '.join(cmd)}; see {args.log_dir}/{log_name}")
        return figures, seconds

    if "closure" in benches and trace_seconds <= 0:
        # The trace must cover every config's throughput and latency runs.
        _, seconds = run("off", "closure", "closure-sizing.log")
        configs = len(args.closure_configs.split(","))
        trace_seconds = max(2.0, 1.5 * seconds / configs)
        print(f"# closure_bench --trace-seconds {trace_seconds:.1f} (an untraced run took {seconds:.1f} s "
              f"for {configs} config(s))", flush=True)

    variants = ["before", "off", "on"]
    results = {}  # (bench, variant) -> list of per-round figure dicts
    for r in range(args.runs):
        order = variants[r % 3:] + variants[:r % 3]
        for bench in benches:
            for v in order:
                figures, seconds = run(v, bench, f"{bench}-{v}-{r + 1}.log")
                results.setdefault((bench, v), []).append(figures)
                print(f"# run {r + 1}/{args.runs} {bench}_bench {v}: {seconds:.1f} s", flush=True)

    print(f"\n{'figure':<34} {'before':>10} {'off':>10} {'on':>10}   {'off/before (range)':<24} {'on/off (range)':<24}")
    for bench in benches:
        names = sorted(set().union(*[set(f) for f in results[(bench, "off")]]))
        for name in names:
            per = {}
            for v in variants:
                per[v] = [f[name][0] for f in results[(bench, v)] if name in f]
            if any(len(per[v]) != args.runs for v in variants):
                continue
            better = results[(bench, "off")][0][name][1]

            def ratios(a, b):
                return [x / y for x, y in zip(per[a], per[b]) if y > 0]

            def show(rs):
                if not rs:
                    return "-"
                return f"{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f})"
            print(f"{name:<34} {statistics.median(per['before']):>10.1f} {statistics.median(per['off']):>10.1f} "
                  f"{statistics.median(per['on']):>10.1f}   {show(ratios('off', 'before')):<24} "
                  f"{show(ratios('on', 'off')):<24}")
            print(f"RESULT trace_off_vs_before_{name} {statistics.median(ratios('off', 'before')):.3f} ratio "
                  f"({better} is better)")
            print(f"RESULT trace_on_vs_off_{name} {statistics.median(ratios('on', 'off')):.3f} ratio "
                  f"({better} is better)")
    print("\nratios are per round (the variants of one round ran back to back), then the median over rounds")


if __name__ == "__main__":
    main()
