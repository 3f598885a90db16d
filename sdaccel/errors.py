"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class SdaccelError(Exception):
    """Base class of errors caused by the caller's input or environment, not by a bug in sdaccel."""


class UsageError(SdaccelError, ValueError):
    """A bad argument: unknown name, size not a multiple of 8, steps < 1, ..."""


class ModelLoadError(SdaccelError):
    """A model path or file that is missing, empty, corrupt, or of an unknown family."""


class EngineUnavailableError(SdaccelError):
    """The engine cannot run on this machine (no GPU, missing package, ...)."""


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its class name when it has none), at most 300 characters: what a
    one-line error message or a note quotes of a library's multi-line error."""
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:300]
