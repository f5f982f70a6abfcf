#!/usr/bin/env python3
"""Reads an MLflow file store written by lab (`--mlflow-uri file:///…/mlruns`) back with the
real MLflow client and checks it against the files on disk.

    python scripts/reference/mlflow_check.py MLRUNS EXPERIMENT [options]
    # e.g. after `lab run --mlflow-uri file:///tmp/mlruns`:
    python scripts/reference/mlflow_check.py /tmp/mlruns tiny-cpu \
        --expect-param train.seed=42 --expect-metric val_loss:3 --expect-artifact manifest.json
    # MLflow on a CPU machine: pip install mlflow (into the torch-cpu venv, say)

Options (repeatable where it makes sense):
    --run-id ID               only check this run (default: every run of the experiment)
    --expect-param K=V        param K must equal V (exact string)
    --expect-tag K=V          tag K must equal V
    --expect-metric NAME[:N]  metric NAME must exist (and have exactly N points)
    --expect-artifact PATH    artifact PATH (relative to the run's artifact root) must exist
    --status STATUS           expected run status (default FINISHED; "any" to skip)
    --min-runs N              the experiment must have at least N runs (default 1)

Always checked, for every run: the experiment is found by name and by id; get_run works; the
run name equals the mlflow.runName tag; start and end times are integer milliseconds; every
params/ and tags/ file on disk comes back from the client byte for byte; every metrics/ file
comes back point for point (timestamp, value, step) from get_metric_history; list_artifacts
(recursive) equals the artifact files on disk; search_runs (pandas and entity forms) agree.
Exits non-zero with a message on the first failure. mlflow >= 3 opens file stores only with
MLFLOW_ALLOW_FILE_STORE=true, which this script sets when unset.
"""

import argparse
import math
import os
import sys

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

import mlflow  # noqa: E402
from mlflow.entities import ViewType  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

EPOCH_MS_MIN, EPOCH_MS_MAX = 946_684_800_000, 4_102_444_800_000  # 2000-01-01 .. 2100-01-01


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def kv(s):
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected K=V, got {s!r}")
    k, v = s.split("=", 1)
    return k, v


def files_under(d):
    """Relative posix paths of all regular files under d."""
    out = {}
    if not os.path.isdir(d):
        return out
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d).replace(os.sep, "/")] = p
    return out


def read_exact(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def same_float(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def list_artifacts_recursive(client, run_id, path=None):
    out = []
    for fi in client.list_artifacts(run_id, path):
        if fi.is_dir:
            out += list_artifacts_recursive(client, run_id, fi.path)
        else:
            out.append((fi.path, fi.file_size))
    return out


def check_run(client, run_id, exp, args, run_dir):
    run = client.get_run(run_id)
    info, data = run.info, run.data
    check(info.run_id == run_id, f"run_id mismatch {info.run_id} != {run_id}")
    check(info.experiment_id == exp.experiment_id, f"{run_id}: experiment_id {info.experiment_id}")
    check(info.lifecycle_stage == "active", f"{run_id}: lifecycle_stage {info.lifecycle_stage}")
    if args.status != "any":
        check(info.status == args.status, f"{run_id}: status {info.status} != {args.status}")
    check(bool(info.run_name), f"{run_id}: empty run_name")
    check(
        data.tags.get("mlflow.runName") == info.run_name,
        f"{run_id}: tag mlflow.runName {data.tags.get('mlflow.runName')!r} != {info.run_name!r}",
    )
    check(isinstance(info.start_time, int), f"{run_id}: start_time not int: {info.start_time!r}")
    check(EPOCH_MS_MIN < info.start_time < EPOCH_MS_MAX, f"{run_id}: start_time not in ms")
    if info.status in ("FINISHED", "FAILED", "KILLED"):
        check(isinstance(info.end_time, int), f"{run_id}: end_time missing for {info.status}")
        check(info.start_time <= info.end_time, f"{run_id}: end_time < start_time")

    # params / tags: disk == client, byte for byte
    disk_params = {k: read_exact(p) for k, p in files_under(os.path.join(run_dir, "params")).items()}
    check(data.params == disk_params, f"{run_id}: params differ\n client={data.params}\n disk={disk_params}")
    disk_tags = {k: read_exact(p) for k, p in files_under(os.path.join(run_dir, "tags")).items()}
    check(data.tags == disk_tags, f"{run_id}: tags differ\n client={data.tags}\n disk={disk_tags}")
    for k, v in args.expect_param:
        check(data.params.get(k) == v, f"{run_id}: param {k}={data.params.get(k)!r}, want {v!r}")
    for k, v in args.expect_tag:
        check(data.tags.get(k) == v, f"{run_id}: tag {k}={data.tags.get(k)!r}, want {v!r}")

    # metrics: every line of every file, in order
    disk_metrics = files_under(os.path.join(run_dir, "metrics"))
    check(set(data.metrics) == set(disk_metrics), f"{run_id}: metric keys {set(data.metrics)} vs disk {set(disk_metrics)}")
    n_points = {}
    for key, path in sorted(disk_metrics.items()):
        lines = [l for l in read_exact(path).split("\n") if l.strip()]
        hist = client.get_metric_history(run_id, key)
        check(len(hist) == len(lines), f"{run_id}: {key}: {len(hist)} points vs {len(lines)} lines")
        for m, line in zip(hist, lines):
            ts, val, step = line.split(" ")[:3]
            check(m.timestamp == int(ts) and m.step == int(step) and same_float(m.value, float(val)),
                  f"{run_id}: {key}: {m} != line {line!r}")
            check(EPOCH_MS_MIN < m.timestamp < EPOCH_MS_MAX, f"{run_id}: {key}: timestamp {m.timestamp} not ms")
        latest = max(hist, key=lambda m: (m.step, m.timestamp, m.value))
        check(same_float(data.metrics[key], latest.value), f"{run_id}: {key}: latest {data.metrics[key]} != {latest.value}")
        n_points[key] = len(hist)
    for spec in args.expect_metric:
        name, _, n = spec.partition(":")
        check(name in n_points, f"{run_id}: metric {name!r} missing")
        if n:
            check(n_points[name] == int(n), f"{run_id}: metric {name}: {n_points[name]} points, want {n}")

    # artifacts
    arts = dict(list_artifacts_recursive(client, run_id))
    disk_arts = files_under(os.path.join(run_dir, "artifacts"))
    check(set(arts) == set(disk_arts), f"{run_id}: artifacts client={sorted(arts)} disk={sorted(disk_arts)}")
    for p, size in arts.items():
        check(size == os.path.getsize(disk_arts[p]), f"{run_id}: artifact {p} size {size}")
    for p in args.expect_artifact:
        check(p in arts, f"{run_id}: artifact {p!r} missing (have {sorted(arts)})")
    return run, n_points, sorted(arts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mlruns")
    ap.add_argument("experiment")
    ap.add_argument("--run-id")
    ap.add_argument("--expect-param", type=kv, action="append", default=[])
    ap.add_argument("--expect-tag", type=kv, action="append", default=[])
    ap.add_argument("--expect-metric", action="append", default=[])
    ap.add_argument("--expect-artifact", action="append", default=[])
    ap.add_argument("--status", default="FINISHED")
    ap.add_argument("--min-runs", type=int, default=1)
    args = ap.parse_args()

    root = os.path.abspath(args.mlruns)
    check(os.path.isdir(root), f"{root} is not a directory")
    mlflow.set_tracking_uri("file://" + root)
    client = MlflowClient()

    exp = mlflow.get_experiment_by_name(args.experiment)
    check(exp is not None, f"experiment {args.experiment!r} not found in {root}")
    check(exp.lifecycle_stage == "active", f"experiment lifecycle_stage {exp.lifecycle_stage}")
    exp2 = client.get_experiment(exp.experiment_id)
    check(exp2.name == args.experiment, f"get_experiment({exp.experiment_id}).name = {exp2.name!r}")
    exp_dir = os.path.join(root, exp.experiment_id)

    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=50000)
    run_ids = {r.info.run_id for r in runs}
    df = mlflow.search_runs(experiment_ids=[exp.experiment_id], run_view_type=ViewType.ALL)
    check(set(df["run_id"]) == run_ids if len(df) else not run_ids, "mlflow.search_runs != client.search_runs")
    disk_runs = {d for d in os.listdir(exp_dir)
                 if os.path.isfile(os.path.join(exp_dir, d, "meta.yaml"))}
    check(run_ids == disk_runs, f"search_runs {sorted(run_ids)} != run dirs on disk {sorted(disk_runs)}")
    check(len(run_ids) >= args.min_runs, f"{len(run_ids)} runs < --min-runs {args.min_runs}")
    if args.run_id:
        check(args.run_id in run_ids, f"run {args.run_id} not in experiment")
        to_check = [args.run_id]
    else:
        to_check = sorted(run_ids)

    print(f"mlflow {mlflow.__version__}  store {root}")
    print(f"experiment {exp.name!r} id={exp.experiment_id} tags={exp.tags} "
          f"artifact_location={exp.artifact_location}")
    print(f"runs: {len(run_ids)} (search_runs/pandas agree)")
    for rid in to_check:
        run, n_points, arts = check_run(client, rid, exp, args, os.path.join(exp_dir, rid))
        i = run.info
        user_tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
        print(f"  run {rid} name={i.run_name!r} status={i.status} user={i.user_id} "
              f"start={i.start_time} end={i.end_time}")
        print(f"    params({len(run.data.params)}): {dict(sorted(run.data.params.items()))}")
        print(f"    tags: {dict(sorted(user_tags.items()))} + "
              f"{sorted(k for k in run.data.tags if k.startswith('mlflow.'))}")
        print(f"    metrics: " + ", ".join(f"{k}[{n}]={run.data.metrics[k]:g}" for k, n in n_points.items()))
        print(f"    artifacts: {arts}")
    print("OK")


if __name__ == "__main__":
    main()
