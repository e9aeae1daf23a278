"""``python -m tripy_build`` and the ``tripy-build`` script.

An unchanged command is answered from the memo before Hydra is even imported; anything else runs
the Hydra app in ``cli``. ``tripy-build verify PATH`` runs the verifier, ``tripy-build bench PATH``
the deployment benchmark, ``tripy-build inspect PATH`` describes an artifact.
"""

import sys


def console() -> None:
    if sys.argv[1:2] == ["verify"]:
        from .verify import main as verify_main

        sys.exit(verify_main(sys.argv[2:]))
    if sys.argv[1:2] == ["bench"]:
        from .bench import main as bench_main

        sys.exit(bench_main(sys.argv[2:]))
    if sys.argv[1:2] == ["inspect"]:
        from .inspect import main as inspect_main

        sys.exit(inspect_main(sys.argv[2:]))
    if sys.argv[1:2] == ["build"]:
        del sys.argv[1]
    from .memo import answer

    if not answer(sys.argv[1:]):
        from .cli import main

        main()


if __name__ == "__main__":
    console()
