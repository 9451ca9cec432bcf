#!/usr/bin/env python3
"""Checks a Capstan cluster trace against the Chrome trace event format.

Usage: check_trace.py FILE [--processes NAME,...] [--kinds CAT,...] [--flows N]

Checks: the file is a JSON object with a traceEvents list; every event has
ph, ts, pid and tid (numbers where they must be); complete events ("X")
have a dur >= 0 and nest on each thread (no two overlap without one
holding the other); no time is negative; async events ("b"/"e") pair by
category and id (or id2), the end after the start; every flow id has one start ("s") and at least one
finish ("f", binding point "e"), the finish on another process, no earlier
than the start (clocks aligned within 2 ms plus half of each end's clock
round trip, the error the file's otherData says its offsets have: a loaded
machine's round trips run to milliseconds); each process is named; at
least the named processes (by the start of their names), event categories
and N flows are there. Prints a summary; exits 1 naming the first problem.
"""
import argparse
import collections
import json
import sys

CLOCK_SLACK_US = 2000.0


def fail(message):
    print("check_trace: FAIL: " + message)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--processes", default="")
    parser.add_argument("--kinds", default="")
    parser.add_argument("--flows", type=int, default=0)
    args = parser.parse_args()
    with open(args.file, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            fail(f"not JSON: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("not a JSON object with a traceEvents list")
    events = doc["traceEvents"]
    # Each process's clock offset is good to half its measured round trip.
    half_round_trip_us = {}
    for p in doc.get("otherData", {}).get("processes", []):
        half_round_trip_us[p.get("pid")] = float(p.get("clock_round_trip_ns", 0)) / 2000.0
    names = {}
    slices = collections.defaultdict(list)
    asyncs = {}
    flow_starts = {}
    flow_ends = collections.defaultdict(list)
    categories = collections.Counter()
    for i, e in enumerate(events):
        for key in ("ph", "ts", "pid", "tid"):
            if key not in e:
                fail(f"event {i} has no '{key}': {e}")
        if not isinstance(e["ts"], (int, float)) or not isinstance(e["pid"], int) or not isinstance(e["tid"], int):
            fail(f"event {i} has a non-numeric ts, pid or tid: {e}")
        if e["ts"] < 0:
            fail(f"event {i} has a negative ts (viewers drop it): {e}")
        ph = e["ph"]
        if ph == "M":
            if e.get("name") == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        if "name" not in e:
            fail(f"event {i} has no name: {e}")
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                fail(f"complete event {i} has no duration >= 0: {e}")
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
            categories[e.get("cat", "")] += 1
        elif ph in ("b", "e"):
            aid = e.get("id", json.dumps(e.get("id2"), sort_keys=True) if "id2" in e else None)
            if aid is None:
                fail(f"async event {i} has neither id nor id2: {e}")
            key = (e["pid"], e.get("cat"), aid)
            if ph == "b":
                if key in asyncs:
                    fail(f"async event {i} begins id {aid} twice")
                asyncs[key] = e["ts"]
                categories[e.get("cat", "")] += 1
            else:
                if key not in asyncs:
                    fail(f"async event {i} ends id {aid}, never begun")
                if e["ts"] < asyncs.pop(key):
                    fail(f"async event {i} ends before it begins")
        elif ph == "s":
            if e["id"] in flow_starts:
                fail(f"flow {e['id']} starts twice")
            flow_starts[e["id"]] = e
        elif ph == "f":
            if e.get("bp") != "e":
                fail(f"flow end {i} does not bind to its enclosing slice (bp 'e'): {e}")
            flow_ends[e["id"]].append(e)
        else:
            fail(f"event {i} has an unexpected phase '{ph}': {e}")
    if asyncs:
        fail(f"{len(asyncs)} async event(s) begun and never ended")
    # Durations nest on each thread.
    for (pid, tid), spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, name in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-3:
                fail(f"on pid {pid} tid {tid}, '{name}' [{start}, {end}] overlaps "
                     f"'{stack[-1][2]}' [{stack[-1][0]}, {stack[-1][1]}] without nesting in it")
            stack.append((start, end, name))
    # Flows: one start, finishes on another process, no earlier.
    for fid, start in flow_starts.items():
        ends = flow_ends.get(fid)
        if not ends:
            fail(f"flow {fid} starts on pid {start['pid']} and never finishes")
        for end in ends:
            if end["pid"] == start["pid"]:
                fail(f"flow {fid} finishes on the process it started on")
            slack = CLOCK_SLACK_US + half_round_trip_us.get(start["pid"], 0.0) + half_round_trip_us.get(end["pid"], 0.0)
            if end["ts"] + slack < start["ts"]:
                fail(f"flow {fid} finishes {start['ts'] - end['ts']:.0f} us before it starts "
                     f"(more than the clocks' {slack:.0f} us of error)")
            if not (any(s[0] <= end["ts"] <= s[1] for s in slices[(end["pid"], end["tid"])])):
                fail(f"flow {fid}'s finish is inside no slice of its thread")
        if not any(s[0] <= start["ts"] <= s[1] for s in slices[(start["pid"], start["tid"])]):
            fail(f"flow {fid}'s start is inside no slice of its thread")
    for fid in flow_ends:
        if fid not in flow_starts:
            fail(f"flow {fid} finishes but never starts")
    used = {e["pid"] for e in events if e["ph"] != "M"}
    for pid in used:
        if pid not in names:
            fail(f"pid {pid} has events but no process_name")
    for wanted in filter(None, args.processes.split(",")):
        if not any(n.startswith(wanted) for n in names.values()):
            fail(f"no process named '{wanted}...' (have: {sorted(names.values())})")
    for wanted in filter(None, args.kinds.split(",")):
        if categories[wanted] == 0:
            fail(f"no '{wanted}' events (have: {dict(categories)})")
    if len(flow_starts) < args.flows:
        fail(f"{len(flow_starts)} flow(s) from a schedule to a run, wanted at least {args.flows}")
    print(f"check_trace: OK: {len(events)} events, {len(names)} processes, {len(flow_starts)} flows, "
          f"categories {dict(sorted(categories.items()))}")


if __name__ == "__main__":
    main()
