"""``hydra/launcher=tripy_local``: a sweep's jobs on a pool of worker processes, as many as the cores."""
