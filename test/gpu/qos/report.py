"""Table of bench.sh's results: production p50/p99 against alone, trainer throughput against solo and
against the idle share production leaves.

  python3 report.py RESULTS_DIR alone solo CONFIG...

For each configuration, model and load: the p99 and p50 ratios to alone (median over the repetitions,
min-max in brackets; each repetition is compared with alone's repetition of the same arrival times), the
trainers' steps inside the production phases against the solo rate (all trainers together), the same
against the idle share production leaves in that repetition (1 - its GPU-busy fraction alone, serve.py:
where one context runs at a time, the most the trainers can have), and whether production's output
digest and the trainers' loss digests equal the alone and solo runs'.
"""
import json
import os
import statistics
import sys


def phases(d):
    out = {}
    path = os.path.join(d, "serve.json")
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            out[(r["model"], r["load"], r["rep"])] = r
    return out


def trainers(d):
    out = []
    for f in sorted(os.listdir(d)):
        if f.startswith("train") and f.endswith(".json"):
            out.append(json.load(open(os.path.join(d, f))))
    return out


def solo_rate(t):
    ends = t["ends"]
    if len(ends) < 10:
        return 0.0
    ends = ends[3:]  # past the first steps (cuDNN, allocator)
    return (len(ends) - 1) / (ends[-1] - ends[0])


def steps_within(ts, start, end):
    return sum(sum(1 for e in t["ends"] if start <= e < end) for t in ts)


def fmt(vals):
    if not vals:
        return "-"
    return f"{statistics.median(vals):.2f}x [{min(vals):.2f}-{max(vals):.2f}]"


def pct(vals):
    if not vals:
        return "-"
    return f"{statistics.median(vals):.0%} [{min(vals):.0%}-{max(vals):.0%}]"


def main():
    root, alone_name, solo_name, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    alone = phases(os.path.join(root, alone_name))
    solo = trainers(os.path.join(root, solo_name))
    rate = solo_rate(solo[0]) if solo else 0.0
    solo_digest = solo[0]["loss_digest"] if solo else ""
    shape = f", {solo[0].get('size', 224)} px{', fp32' if solo[0].get('fp32') else ''}" if solo else ""
    print(f"solo trainer: {rate:.2f} steps/s (batch {solo[0]['batch'] if solo else '?'}{shape}, "
          f"{solo[0]['memory_reserved'] / 2**30 if solo else 0:.1f} GiB reserved)")
    keys = sorted({(m, l) for (m, l, _) in alone})
    for (m, l) in keys:
        reps = sorted(r for (mm, ll, r) in alone if (mm, ll) == (m, l))
        a = [alone[(m, l, r)] for r in reps]
        busy = [x["gpu_busy"] for x in a if "gpu_busy" in x]
        busy_s = f", GPU busy {statistics.median(busy):.0%} (idle share {1 - statistics.median(busy):.0%})" if busy else ""
        print(f"alone {m} load {l:.0%}: p50 {statistics.median(x['p50_ms'] for x in a):.2f} ms, "
              f"p99 {statistics.median(x['p99_ms'] for x in a):.2f} ms, {a[0]['requests']} requests a repetition"
              f"{busy_s}")
    print()
    w = max(len(c) for c in ["configuration"] + configs)  # one column, however long a name
    print(f"{'configuration':{w}} {'model':14} {'load':>5}  {'p99 vs alone':>22}  {'p50 vs alone':>22}  "
          f"{'trainer vs solo':>22}  {'of idle share':>22}  outputs  losses")
    for c in configs:
        d = os.path.join(root, c)
        ph, ts = phases(d), trainers(d)
        if not ph and ts and rate > 0:  # the trainer alone (gs-solo): its own rate against solo's
            r = solo_rate(ts[0])
            print(f"{c:{w}} {'(trainer alone)':20}  {'-':>22}  {'-':>22}  {r / rate:>22.0%}  {'-':>22}  {'-':7}  "
                  f"{'same' if ts[0]['loss_digest'] == solo_digest else 'DIFFER'}")
            continue
        same_losses = all(t["loss_digest"] == solo_digest for t in ts) if ts else None
        for (m, l) in keys:
            p99, p50, thr, idle, same = [], [], [], [], True
            for (mm, ll, r), x in sorted(ph.items()):
                if (mm, ll) != (m, l) or (m, l, r) not in alone:
                    continue
                base = alone[(m, l, r)]
                p99.append(x["p99_ms"] / base["p99_ms"])
                p50.append(x["p50_ms"] / base["p50_ms"])
                same = same and x["digest"] == base["digest"]
                if ts and rate > 0:
                    thr.append(steps_within(ts, x["start"], x["end"]) / ((x["end"] - x["start"]) * rate))
                    if base.get("gpu_busy") is not None and base["gpu_busy"] < 1:
                        idle.append(thr[-1] / (1 - base["gpu_busy"]))
            tput = pct(thr)
            print(f"{c:{w}} {m:14} {l:>5.0%}  {fmt(p99):>22}  {fmt(p50):>22}  {tput:>22}  {pct(idle):>22}  "
                  f"{'same' if same and p99 else 'DIFFER' if p99 else '-':7}  "
                  f"{'-' if same_losses is None else 'same' if same_losses else 'DIFFER'}")


if __name__ == "__main__":
    main()
