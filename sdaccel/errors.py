"""User-facing errors. The CLI prints their message on one line and exits with a code that says whose fault it was:
2 for the caller's input or environment (SdaccelError), 3 for an output that failed its numerical check in strict mode
(OutputCheckError), 1 for anything unexpected (a bug: rerun with --debug for the traceback).
"""


class SdaccelError(Exception):
    """Base class of errors caused by the caller's input or environment, not by a bug in sdaccel."""


class UsageError(SdaccelError, ValueError):
    """A bad argument: unknown name, size not a multiple of 8, steps < 1, ..."""


class ModelLoadError(SdaccelError):
    """A model path or file that is missing, empty, corrupt, or of an unknown family."""


class EngineUnavailableError(SdaccelError):
    """The engine cannot run on this machine (no GPU, missing package, ...)."""


class OutputCheckError(Exception):
    """A generation's output failed the output guard (NaN/Inf, a black or flat image) and strict mode asked for an
    error instead of a repair: a numerical failure of the model or engine, not bad input."""


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its class name when it has none), at most 300 characters: what a
    one-line error message or a note quotes of a library's multi-line error."""
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:300]
