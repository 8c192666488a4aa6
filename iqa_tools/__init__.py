"""IQA tools: the paper's pyiqa metrics behind one registry (table, availability, scoring, cache, fallbacks).

Importing this package does not import torch or pyiqa; they load when a tool first runs.
"""
import logging as _logging

from iqa_tools.cache import ToolCache
from iqa_tools.errors import (
    DependencyMissingError,
    ImageError,
    ImageSizeMismatchError,
    ImageTooSmallError,
    ToolError,
    ToolModeError,
    ToolRunError,
    ToolTableError,
    UnknownToolError,
    WeightsMissingError,
)
from iqa_tools.examples import example_image
from iqa_tools.images import LoadedImage, load_image
from iqa_tools.records import ToolExecutionLog
from iqa_tools.registry import ToolRegistry, ToolScore, default_registry
from iqa_tools.table import STRENGTHS, ToolSpec

__all__ = [
    "DependencyMissingError",
    "ImageError",
    "ImageSizeMismatchError",
    "ImageTooSmallError",
    "LoadedImage",
    "STRENGTHS",
    "ToolCache",
    "ToolError",
    "ToolExecutionLog",
    "ToolModeError",
    "ToolRegistry",
    "ToolRunError",
    "ToolScore",
    "ToolSpec",
    "ToolTableError",
    "UnknownToolError",
    "WeightsMissingError",
    "default_registry",
    "example_image",
    "load_image",
]

# A library leaves logging configuration to the application (see agentic_iqa/__init__.py).
_logging.getLogger(__name__).addHandler(_logging.NullHandler())
