"""``python -m tripy_build``: see ``tripy_build.cli.main``."""

from .cli.main import console

if __name__ == "__main__":
    console()
