"""SageMaker: recorded DescribeTrainingJob/ListTrainingJobs answers through botocore's
Stubber (validated against the service model), CloudWatch metrics and logs on moto."""

from __future__ import annotations

import pytest

from tests.contract import ContractCase, case
from tests.sagemaker_replay import (
    NOW,
    Recordings,
    ReplayStubber,
    adapter_for,
    moto_server,
    put_metrics,
    sagemaker_client,
    seed_once,
    stop_moto,
)


def seed(url: str) -> None:
    t = [NOW - 2400 + 60 * i for i in range(40)]
    put_metrics(url, "llm-pretrain-a",
                {"loss": [(x, 3.0 - 0.02 * i) for i, x in enumerate(t)],
                 "step": [(x, 50.0 * (i + 1)) for i, x in enumerate(t)]},
                hosts={h: {"GPUUtilization": [(x, 760.0) for x in t]}
                       for h in ("algo-1", "algo-2")})


@case("sagemaker")
def make(request: pytest.FixtureRequest) -> ContractCase:
    url = moto_server()
    request.config.add_cleanup(stop_moto)
    seed_once(url, "contract", seed)
    replay = ReplayStubber(sagemaker_client(), Recordings())
    adapter = adapter_for(replay, url)
    return ContractCase(adapter=adapter, now=NOW, running={"llm-pretrain-a", "resnet-spot-b"},
                        with_metrics="llm-pretrain-a", metric="loss", unknown_state="odd-d",
                        unknown_raw="Hibernating", broken="broken-c", stops=replay.stopped)
