"""The job's stop signals, shared by the in-job supervisor and the batch script it is rendered into.

Standard library only (nothing at all): ``render`` imports it to render the supervisor's start, and
the runtime owns it so that the supervisor never imports ``render``.
"""

#: Signals that stop the run besides ``resilience.signal`` (time limit, cancel): the supervisor handles
#: each (forwards it to ``srun``, restarts nothing) and is started with them ignored until it does.
STOP_SIGNALS = ("TERM", "INT", "HUP")
