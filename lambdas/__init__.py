"""The runtimes: one shared ``tick`` and thin entry points around it (AWS Lambda, Azure
Functions, a Kubernetes CronJob, the local loop), plus alarm senders and state stores."""
