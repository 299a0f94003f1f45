"""The Kubernetes / OpenShift runtime: a CronJob running one tick per run
(``python -m trainguard.lambdas.k8s``), alarms to Alertmanager, metrics to a Pushgateway, state in
a ConfigMap."""
