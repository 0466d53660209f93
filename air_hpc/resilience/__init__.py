"""Surviving preemption: stop flags, atomic verified checkpoints, requeue decisions (the event log: ``records.events``).

Modules, each with one job:

- ``signals``: signal handlers that only set a flag, the all-rank agreement, the time-limit deadline.
- ``store``: the checkpoint directory layout: staging, manifest, atomic commit, verify, retention.
- ``state``: what goes into a checkpoint (Megatron ``dist_checkpointing`` + RNG + progress).
- ``checkpointer``: sync and async saves driven by the trainer.
- ``requeue``: whether an interrupted run should be requeued, and with which exit code.

Heavy imports (torch, Megatron) happen inside ``state`` and ``checkpointer`` only.
"""
