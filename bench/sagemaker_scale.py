"""API calls per tick of the SageMaker adapter with many running jobs.

    python bench/sagemaker_scale.py --jobs 1000 --evented 300

SageMaker is a loopback server answering from the recorded DescribeTrainingJob of
``tests/recordings/sagemaker`` (renamed per job); CloudWatch metrics and Logs run on a
moto server. Calls are counted by operation with botocore ``before-call`` hooks.
Tick 1 has no events; before tick 2, ``--evented`` jobs' states arrive as EventBridge
events. Asserts the issue's bars and prints the counts:

* ListTrainingJobs pages = ceil(jobs / 100);
* DescribeTrainingJob = jobs, then jobs - evented (none for a job whose state came by event);
* GetMetricData <= ceil(jobs x metrics / 500).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.adapters.sagemaker import SageMakerAdapter  # noqa: E402
from trainguard.adapters.sagemaker.clients import Clients  # noqa: E402


def _replay() -> Any:
    """tests/sagemaker_replay.py, loaded by path (a site-packages ``tests`` may shadow ours)."""
    spec = importlib.util.spec_from_file_location("sagemaker_replay",
                                                  ROOT / "tests" / "sagemaker_replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sagemaker_replay"] = module
    spec.loader.exec_module(module)
    return module


replay = _replay()
NOW, REGION, Recordings = replay.NOW, replay.REGION, replay.Recordings
ARN = f"arn:aws:sagemaker:{REGION}:123456789012:training-job/"


class Fleet:
    """``n`` running jobs made from one recorded DescribeTrainingJob answer."""

    def __init__(self, rec: Any, n: int, hosts: int) -> None:
        template = rec.body("describe-llm-pretrain-a")
        template["ResourceConfig"]["InstanceCount"] = hosts
        self.names = [f"bench-{i:05d}" for i in range(n)]
        self.docs: dict[str, dict[str, Any]] = {}
        for name in self.names:
            doc = copy.deepcopy(template)
            doc.update(TrainingJobName=name, TrainingJobArn=ARN + name)
            self.docs[name] = doc
        self.event_template: dict[str, Any] = rec.event("event-llm-pretrain-a-training")

    def answer(self, op: str, request: dict[str, Any]) -> dict[str, Any] | None:
        if op == "ListTrainingJobs":
            size = int(request.get("MaxResults", 100))
            start = int(request.get("NextToken", "0"))
            page: dict[str, Any] = {"TrainingJobSummaries": [
                {k: self.docs[n][k] for k in ("TrainingJobName", "TrainingJobArn", "CreationTime",
                                             "LastModifiedTime", "TrainingJobStatus",
                                             "SecondaryStatus")}
                for n in self.names[start:start + size]]}
            if start + size < len(self.names):
                page["NextToken"] = str(start + size)
            return page
        if op == "DescribeTrainingJob":
            return self.docs.get(request["TrainingJobName"])
        if op == "ListTags":
            return {"Tags": [{"Key": "team", "Value": "bench"}]}
        return None

    def event(self, name: str) -> dict[str, Any]:
        event = copy.deepcopy(self.event_template)
        event["detail"].update(TrainingJobName=name, TrainingJobArn=ARN + name,
                               ResourceConfig=copy.deepcopy(self.docs[name]["ResourceConfig"]))
        event["resources"] = [ARN + name]
        return event


def count_calls(clients: Clients) -> Counter[str]:
    calls: Counter[str] = Counter()
    for client in (clients.sagemaker, clients.cloudwatch, clients.logs):
        client.meta.events.register(
            "before-call.*.*", lambda model, **_: calls.update([model.name]))
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--evented", type=int, default=300,
                    help="jobs whose state arrives by EventBridge event before tick 2")
    ap.add_argument("--hosts", type=int, default=1, help="instances per job")
    args = ap.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request lines
    rec = Recordings()
    fleet = Fleet(rec, args.jobs, args.hosts)
    url = replay.moto_server()
    # A little real data (moto scans every datapoint for every query and period).
    t = [NOW - 240 + 60 * i for i in range(4)]
    for name in fleet.names[:10]:
        replay.put_metrics(url, name, {"loss": [(x, 2.0 - 0.01 * i) for i, x in enumerate(t)]},
                    hosts={"algo-1": {"GPUUtilization": [(x, 640.0) for x in t]}})
    replay.put_logs(url, f"{fleet.names[0]}/algo-1-1750000000",
             [(NOW - 100, "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB")])

    with replay.SageMakerServer(fleet.answer) as server:
        clients = Clients(sagemaker=replay.sagemaker_client(server.url), region=REGION,
                          cloudwatch=replay.aws_client("cloudwatch", url),
                          logs=replay.aws_client("logs", url))
        adapter = SageMakerAdapter(clients, lookback_s=600)
        calls = count_calls(clients)
        queries_per_job = 3 + 3 * args.hosts  # loss, val_loss, step + 3 host metrics per host
        rows = []
        for tick in (1, 2):
            evented = 0 if tick == 1 else args.evented
            for name in fleet.names[:evented]:
                adapter.remember_event(fleet.event(name))
            calls.clear()
            started = time.perf_counter()
            jobs = adapter.list_jobs(NOW + 300 * (tick - 1))
            seconds = time.perf_counter() - started
            bar = math.ceil(args.jobs * queries_per_job / 500)
            rows.append((tick, evented, len(jobs), dict(calls), bar, seconds))
            assert len(jobs) == args.jobs and not adapter.errors, adapter.errors[:3]
            assert calls["ListTrainingJobs"] == math.ceil(args.jobs / 100)
            assert calls["DescribeTrainingJob"] == args.jobs - evented
            assert calls["GetMetricData"] <= bar, (dict(calls), bar)
            assert sum(1 for j in jobs if j.logs) == 1
    replay.stop_moto()

    ops = ["ListTrainingJobs", "DescribeTrainingJob", "ListTags", "GetMetricData",
           "FilterLogEvents", "StopTrainingJob"]
    print(f"{args.jobs} running jobs, {args.hosts} host(s) each, {queries_per_job} metric "
          f"queries per job ({args.jobs * queries_per_job} in all)")
    print("tick  evented  jobs  " + "  ".join(ops) + "  GetMetricData bar  seconds")
    for tick, evented, n, c, bar, seconds in rows:
        print(f"{tick:>4}  {evented:>7}  {n:>4}  "
              + "  ".join(f"{c.get(op, 0):>{len(op)}}" for op in ops)
              + f"  {bar:>17}  {seconds:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
