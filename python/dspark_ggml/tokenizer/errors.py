"""The one exception type the tokenizer raises."""
from __future__ import annotations

from ..errors import DSparkError


class TokenizerError(DSparkError, ValueError):
    """A GGUF's tokenizer metadata can't be used, or a call got input it can't handle.

    The message names the problem: the missing or unsupported key, the unknown model or
    pre-tokenizer name (with the supported ones), the out-of-range token id.
    """


class ChatTemplateError(TokenizerError):
    """The chat template is missing, fails to compile, or raised an error while rendering."""
