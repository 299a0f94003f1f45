"""Kubeflow jobs on Kubernetes or OpenShift: Training Operator v1 PyTorchJob and
Trainer v2 TrainJob, through the ``kubernetes`` client."""

from trainguard.adapters.kubeflow.adapter import KubeflowAdapter, MetricsHook
from trainguard.adapters.kubeflow.options import from_options

__all__ = ["KubeflowAdapter", "MetricsHook", "from_options"]
