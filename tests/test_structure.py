"""The tree's structure as rules: no import cycles, and infra/ and the trainer meet only through trainer.contract."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT

PACKAGES = ("infra", "policy", "trainer")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules a file imports, at its top or inside functions (a lazy import is an edge too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_back_through_others():
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_infra_and_policy_reach_the_trainer_only_through_its_contract():
    crossings = {
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.startswith(("infra", "policy"))
        for target in targets
        if target.startswith("trainer") and not target.startswith("trainer.contract")
    }
    assert crossings == set()


def test_the_trainer_imports_nothing_from_infra_or_policy():
    crossings = {
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.startswith("trainer")
        for target in targets
        if target.startswith(("infra", "policy"))
    }
    assert crossings == set()


def test_the_contract_imports_no_torch_megatron_or_pulumi():
    heavy = ("torch", "megatron", "pulumi", "deepspeed")
    for path in (ROOT / "trainer" / "contract").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(name.split(".")[0] in heavy for name in names), f"{path.name} imports {names}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer."):
                assert node.module.startswith("trainer.contract"), f"{path.name} imports {node.module}"


def test_the_checkpoint_store_imports_no_megatron():
    modules = _modules()
    assert not any(
        target.startswith("trainer.model") or target.startswith("trainer.distributed")
        for target in _imports(modules["trainer.checkpoint.store"], modules)
    )
    assert "megatron" not in (ROOT / "trainer/checkpoint/store.py").read_text().replace("megatron's", "")
