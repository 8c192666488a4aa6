"""Exceptions of the tool layer. Every message names the thing at fault and says what to do."""
from __future__ import annotations


class ToolError(RuntimeError):
    """A tool could not produce a score (unknown, misused, not installed, failed, non-finite)."""

    def __init__(self, message: str, tool: str | None = None):
        super().__init__(message)
        self.tool = tool


class UnknownToolError(ToolError):
    """No tool by that name in the table (the message lists close matches)."""


class ToolModeError(ToolError):
    """FR tool without a reference, or a reference given to an NR tool."""


class DependencyMissingError(ToolError):
    """The tool imports a Python package that is not installed."""


class WeightsMissingError(ToolError):
    """A weight file the tool needs is not on this machine and cannot be downloaded now."""


class ToolRunError(ToolError):
    """The metric raised while being created or run, or returned NaN/Inf."""


class ToolTableError(ValueError):
    """The tool table (bundled or a user file) is invalid; the message names the entry and field."""


class ImageError(ValueError):
    """An input image cannot be used; the message names the input and says what to do."""


class ImageTooSmallError(ImageError):
    """The image is smaller than a tool's minimum side. Another tool may still accept it."""


class ImageSizeMismatchError(ImageError):
    """A full-reference pair whose image and reference differ in size."""
