"""The one exception the converter raises for input it refuses to convert."""
from __future__ import annotations

from ..errors import DSparkError


class ConversionError(DSparkError):
    """The checkpoint cannot be converted as given.

    The message says what is wrong and, where a command-line flag settles it, names that flag.
    """
