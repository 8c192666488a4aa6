"""The offline analyst's measurement half: image statistics (``stats``) and their mapping to
per-category severities, detections and a quality-level distribution (``severity``), with thresholds
fitted on real photos from several sources (``thresholds.json``, refitted by ``benchmarks/fit_corpus.py``).

Depends only on numpy, scipy, OpenCV and Pillow, so the agents can use it without a language model.
"""
from .severity import (SEVERITIES, CategoryAnalysis, Detection, analyze, analyze_stats, detect,
                       expected_level, explain, level_distribution, overall_badness)
from .stats import as_float_rgb, measure, measure_fr

__all__ = ["SEVERITIES", "CategoryAnalysis", "Detection", "analyze", "analyze_stats", "detect",
           "expected_level", "explain", "level_distribution", "overall_badness", "as_float_rgb", "measure",
           "measure_fr"]
