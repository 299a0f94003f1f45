"""The AWS runtime: the Lambda handler (``lambdas.aws.handler``), DynamoDB state and the
CloudWatch / SNS sinks. ``handler`` here is the function, so both ``lambdas.aws.handler``
and ``lambdas.aws.handler.handler`` work as the Lambda's handler setting."""

from trainguard.lambdas.aws.handler import handler

__all__ = ["handler"]
