"""The Executor's three VLM subtasks (spec 000 prompts): detect, analyze, select tools.

Tool execution itself runs IQA tools, not the VLM, so it has no signature.
"""
from typing import Literal

import dspy

from signatures.models import DistortionAnalysisMap, DistortionSet, ToolAssignment


class DetectDistortionsSignature(dspy.Signature):
    """You are an expert in distortion detection. Based on the user's query, identify all possible
    distortions that need to be focused on to properly address the user's intent.

    Instructions:
    1. Focus your analysis on the query scope. Describe the distortions for each object in the scope
       individually, using the object names exactly as given ("Global" means the whole image).
    2. Only include distortion types from the following valid categories: ["Blurs", "Color distortions",
       "Compression", "Noise", "Brightness change", "Sharpness", "Contrast"].

    Return distortion_set as {"<object or Global>": ["<distortion_1>", "<distortion_2>", ...]}.
    """

    query: str = dspy.InputField(desc="the user's question about the image")
    image: dspy.Image = dspy.InputField(desc="the image to inspect")
    query_scope: list[str] = dspy.InputField(desc='objects or regions the query is about; ["Global"] = whole image')
    distortion_set: DistortionSet = dspy.OutputField(
        desc='{"<object or Global>": [distortion types from the valid categories]}'
    )


class AnalyzeDistortionsSignature(dspy.Signature):
    """You are a distortion analysis expert. Your task is to assess the severity and visual impact of
    various distortion types for different regions of an image or the entire image.

    Instructions:
    1. Base your analysis on the listed distortion types (distortion_set) and consider the user's question.
       Analyse exactly the objects and types listed there, no others.
    2. Severity is one of none, slight, moderate, severe, extreme. Use "none" if a distortion is barely
       or not visible.
    3. Keep explanations short and focused on visual quality. Focus solely on analysing visual
       distortion effects.

    Return distortion_analysis as {"<object or Global>": [{"type": "<distortion>", "severity":
    "<none/slight/moderate/severe/extreme>", "explanation": "<brief visual explanation>"}]}.
    """

    query: str = dspy.InputField(desc="the user's question about the image")
    image: dspy.Image = dspy.InputField(desc="the image to inspect")
    distortion_set: dict[str, list[str]] = dspy.InputField(
        desc="the distortion information: {object or Global: [distortion types]}"
    )
    distortion_analysis: DistortionAnalysisMap = dspy.OutputField(
        desc="{object or Global: [{type, severity, explanation}]}"
    )


class SelectToolsSignature(dspy.Signature):
    """You are a tool executor. Your task is to assign the most appropriate IQA tool to each visual
    distortion type, based on the descriptions of the tools.

    Instructions:
    For each distortion, choose the tool whose description suggests it performs best for that type of
    distortion. Use tool names exactly as written in the tool descriptions.
    When reference_mode is Full-Reference, prefer Full-Reference (FR) tools and choose a No-Reference
    (NR) tool only if no suitable FR tool exists. When it is No-Reference, choose only NR tools.

    Return selected_tools as {"<object or Global>": {"<distortion>": "<tool_name>"}}, covering every
    object and distortion of the distortion information.
    """

    distortion_set: dict[str, list[str]] = dspy.InputField(
        desc="the distortion information: {object or Global: [distortion types]}"
    )
    tool_description: str = dspy.InputField(desc="the available tools: name, FR/NR type and strengths")
    reference_mode: Literal["Full-Reference", "No-Reference"] = dspy.InputField(
        desc="Full-Reference when a reference image was supplied, else No-Reference"
    )
    selected_tools: ToolAssignment = dspy.OutputField(desc="{object or Global: {distortion: tool name}}")
