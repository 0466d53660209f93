"""Surviving preemption: stop flags, atomic verified checkpoints, the restart budget (events: ``records.events``).

Modules, each with one job:

- ``signals``: signal handlers that only set a flag, the all-rank agreement, the time-limit deadline.
- ``store``: the checkpoint directory layout: staging, manifest, atomic commit, verify, retention.
- ``state``: what goes into a checkpoint, and the one adapter of Megatron's ``dist_checkpointing``.
- ``safe_load``: refuses checkpoints whose pickles would run code.
- ``training_state``: the one typed bundle a checkpoint saves and a resume loads (model, optimizer, schedule).
- ``checkpointer``: the save/resume policy the trainer drives (collectives and format injected).
- ``writer``: the forked writer process of an async save, which dies with its rank.
- ``failures``: one line for a failed save, naming the path and errno.
- ``interval``: ``checkpoint.interval_steps: auto`` from the save cost and the failure rate.
- ``progress``: the restart budget for crash loops.

Whether an interrupted job is requeued is decided by the batch script from the ranks' exit
code (:mod:`air_hpc.exitcodes`). Heavy imports (torch, Megatron) happen in ``state`` and
``checkpointer`` only.
"""
