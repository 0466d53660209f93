"""Everything air-hpc knows about Slurm.

``client`` is the only place that runs Slurm's commands (:class:`~air_hpc.slurm.client.SlurmClient`,
each call with its retry policy; ``fake`` stands in for it in unit tests); ``jobs``, ``nodes``,
``cluster`` and ``version`` parse what they print; ``survey`` asks a cluster what it offers;
``hostlist`` is the hostlist syntax; ``env`` reads a job's ``SLURM_*`` once; ``controller``
probes the controller's port. Importing this package imports none of them, so the pure parts stay light.
"""
