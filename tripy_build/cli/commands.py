"""The subcommands of ``tripy-build``: which module runs each, and what it does (``--help`` prints this)."""

# command -> (module under tripy_build.cli, what it does): ``help.py`` prints the same table
COMMANDS = {
    "verify": ("verify", "PATH [--rebuild]: check digests, params, load and self-test; --rebuild also rebuilds "
                         "and compares"),
    "rebuild": ("rebuild", "PATH [--gpu host|h100] [--checkpoint DIR]: build it again from its recorded config with "
                           "this machine's jaxlib and GPU (what a loader refuses); prints the new path"),
    "inspect": ("show", "PATH [--cost] [--dump DIR]: an artifact as tables; --dump writes its StableHLO and HLO "
                        "per profile"),
    "show": ("show", "PATH: the same as inspect"),
    "list": ("listing", "[ARTIFACTS_DIR]: what was built there (default: artifacts): model, shapes, options, size, "
                        "date, key"),
    "generate": ("generate", "PATH --input-ids 464,2068,318 [--max-new-tokens 20] [--json]: new tokens from an "
                             "artifact built with task=generate"),
    "bench": ("bench", "PATH [--threads 1,2]: cold start, first calls, stalls and latency of an artifact where it "
                       "runs, both loaders"),
    "gc": ("cleanup", "[DIR] --max-bytes 2G --max-age-days 30: remove least recently used artifacts (never one "
                      "being loaded)"),
    "serve": ("serve", "PATH... [--host 127.0.0.1] [--port 8000] [--max-delay-ms 0]: serve artifacts over HTTP "
                       "(KServe v2, Triton's client works), batching requests along the rows dim"),
}
