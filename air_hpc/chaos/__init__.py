"""Fault campaigns: a seeded schedule of faults, one injector per kind, and the verdict against a reference run."""
