"""Keeping a job healthy: heartbeats, the hang watchdog, pre-flight checks and the bad-node list."""
