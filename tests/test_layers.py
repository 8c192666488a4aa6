"""Imports go one way: cli / api → graph → agents → signatures / iqa_tools, with the optimizers beside
the CLI, never below the agents. Read from the source (every import, lazy ones inside functions too),
so a new upward import fails here before it makes a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_iqa", "signatures", "optimizers", "iqa_tools")

#: Layer of each module prefix (the longest matching prefix counts); a module may import its own layer
#: or lower ones only.
LAYERS = {
    "iqa_tools": 0, "signatures": 0,
    "agentic_iqa.config": 1, "agentic_iqa.state": 1, "agentic_iqa.fusion": 1, "agentic_iqa.lm": 1,
    "agentic_iqa.programs": 1, "agentic_iqa.redact": 1,
    "agentic_iqa.agents": 2, "agentic_iqa.offline": 2,
    "agentic_iqa.graph": 3,
    "agentic_iqa": 4,  # api, batch, bench, the package itself
    "agentic_iqa.cli": 5, "agentic_iqa.__main__": 5, "optimizers": 5,
}
#: What the lowest layer may never import, whatever the layer table says.
FORBIDDEN = {"iqa_tools": ("agentic_iqa", "signatures", "optimizers", "dspy"), "signatures": ("agentic_iqa", "optimizers")}


def layer(module: str):
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def imports():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module]
                else:
                    continue
                for target in targets:
                    yield module, target, f"{path.relative_to(ROOT)}:{node.lineno}"


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{where}: {module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, target, where in imports()
        if layer(target) is not None and layer(module) is not None and layer(target) > layer(module)
    ]
    assert upward == [], "\n".join(upward)


def test_the_lowest_layer_stays_independent():
    bad = [
        f"{where}: {module} imports {target}"
        for module, target, where in imports()
        for base, banned in FORBIDDEN.items()
        if module.split(".")[0] == base and target.split(".")[0] in banned
    ]
    assert bad == [], "\n".join(bad)


def test_the_check_sees_an_upward_import():
    """The table is not vacuous: each layer's examples land where they should."""
    assert layer("agentic_iqa.agents.vlm") < layer("agentic_iqa.graph") < layer("agentic_iqa.api") < layer("agentic_iqa.cli.assess")
    assert layer("optimizers.tasks") > layer("agentic_iqa.agents.modules")
    assert layer("iqa_tools.registry") == layer("signatures.models") == 0
    assert any(target == "agentic_iqa.agents.modules" for module, target, _ in imports() if module == "optimizers.tasks")


def test_torch_and_pyiqa_are_imported_only_through_the_backend():
    """Two threads importing torch at once see it half-initialized; iqa_tools.backend imports it under a lock."""
    direct = [
        f"{where}: {module} imports {target}"
        for module, target, where in imports()
        if target.split(".")[0] in ("torch", "torchvision", "pyiqa") and module != "iqa_tools.backend"
    ]
    assert direct == [], "\n".join(direct)
