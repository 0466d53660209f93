"""Inside the job: the batch script's Python half, the step supervisor, the dead-node probe and each rank's entry.

Ranks start with ``python -m air_hpc.runtime RUN_DIR``. Nothing here imports submission, operations
or cluster inspection (``tests/unit/test_package_imports.py``).
"""
