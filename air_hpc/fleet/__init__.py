"""The fleet view: many tenants on one cluster, from Slurm's own accounting joined with our runs' records.

``jobs`` (sacct's rows as facts per job), ``runs`` (what our runs' records add),
``report`` (per tenant and QOS: usage, waits, preemptions, failures, goodput,
badput, cost), ``window`` and ``prices`` (the inputs), ``render`` and ``plot``
(for people), ``slo`` (targets and attainment), ``prometheus`` (gauges); ``simulate``
(a seeded mixed workload of the testbed's tenants) and ``truth`` (what it saw, to check a report against).
"""
