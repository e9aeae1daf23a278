"""tripy_build: declarative, ahead-of-time builds of JAX models into self-describing artifacts."""

__version__ = "0.1.0"

from .compiler import compile  # noqa: E402
from .errors import TripyBuildError  # noqa: E402
from .executable import Executable, load  # noqa: E402
from .serialization import CompatibilityWarning  # noqa: E402
from .spec import DimSize, InputInfo, NamedDimension  # noqa: E402

__all__ = ["compile", "load", "Executable", "InputInfo", "NamedDimension", "DimSize", "TripyBuildError",
           "CompatibilityWarning", "__version__"]
