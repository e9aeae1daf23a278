"""Imported once by the fork server that ``tripy_local``'s workers are forked from: everything a job
imports, then ``gc.freeze()``, so that the collector of every worker skips the ~10^5 objects the
imports made (it scanned them in every full collection: ~0.1 s per build here) and the pages that hold
them stay shared with the server instead of being copied into each worker."""

import gc

import tripy_build.cli  # noqa: F401 - imported for its side effect: the modules every job needs

gc.freeze()
