"""What air-hpc adds to torch.distributed and megatron-core, below both training and checkpointing.

- ``collectives``: the few collectives beside Megatron's (stop agreement, checkpoint verdicts, straggler
  windows), on the device the backend needs.
- ``megatron_compat``: every patch applied to megatron-core, each with the source text that makes it necessary.

``train`` and ``resilience`` both use these; keeping them here lets ``train`` import ``resilience``
(the checkpointer, the stop protocol) without ``resilience`` importing ``train`` back.
"""
