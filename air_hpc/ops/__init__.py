"""Operations on existing runs: finding them, their status and logs, cancelling, waiting, every run's state."""
