"""A run's records: the one owner of every file a run directory holds and of how it is written and read.

==================  ============================================================================
``names``           every file name (standard library only; the batch template gets them via the
                    render context, never as literals) and the JSON-lines schema key
``rundir``          :class:`RunDir`: where each file lives under ``<run.root>/<run.name>/``
``jsonl``           the shared JSON-lines schema (``time``, ``kind``), the appender, the tolerant reader
``events``          ``events.jsonl``: every :class:`EventKind` with its payload, :class:`EventLog` (fsynced),
                    ``read_events``
``metrics``         ``metrics.jsonl``'s one reader (``read_metrics``)
``files``           every write in a run directory: appends, new files and atomic replaces that never
                    follow a symbolic link
``submissions``     ``submissions.jsonl``: attempts, submissions, starts, rank exits, cancels
``phase_times``     ``phase_times.json``: the phase times seen so far, kept across starts (learned hang limits)
``generation``      one start's directory under ``heartbeat/``: its name, heartbeat paths, exit-code file
==================  ============================================================================
"""
