"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class SdaccelError(Exception):
    """Base class of errors caused by the caller's input or environment, not by a bug in sdaccel."""


class UsageError(SdaccelError, ValueError):
    """A bad argument: unknown name, size not a multiple of 8, steps < 1, ..."""


class ModelLoadError(SdaccelError):
    """A model path or file that is missing, empty, corrupt, or of an unknown family."""


class EngineUnavailableError(SdaccelError):
    """The engine cannot run on this machine (no GPU, missing package, ...)."""
