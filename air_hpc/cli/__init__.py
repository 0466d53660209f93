"""The ``air-hpc`` command line: thin click commands over the library."""
