"""A run directory's one live owner: the owner record and its fence, recorded submit attempts, local jobs.

What submission (``launch``), the in-job runtime and operations (``ops``) all need to know about who
owns a run; it imports none of them (``tests/unit/test_package_imports.py``).
"""
