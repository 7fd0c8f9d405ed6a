"""Where untrusted code runs: the fork-server worker and its confinement, the worker pool,
the verdict (values compared outside the candidate's process) and the one scorer."""
