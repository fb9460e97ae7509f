"""The tree's structure as rules: no import cycles, and infra/ and the trainer meet only through trainer.contract."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from trainer.data.stdlib_chat import parse_python

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
    for node in ast.walk(parse_python(path.read_text())):
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


# The trainer's floors, bottom to top (docs/architecture.md, "Floors"): a package or top-level module imports only
# those on floors below its own, lazy imports inside functions included, so no two packages reach each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("contract", "arguments", "lock_file", "device"),
    ("aws", "monitoring"),
    ("config",),
    ("cost", "distributed"),
    ("data", "model", "faults"),
    ("plan", "checkpoint"),
    ("engines",),
    ("interop",),
    ("evaluation",),
    ("models",),
    ("metrics", "health", "preflight", "serving", "tracking"),
    ("launch", "sweep", "deploy"),
    ("jobs",),
    ("loop",),
    ("train",),
    ("bench", "__main__"),
)


def _floor_of(module: str) -> str | None:
    """The trainer package or top-level module a module belongs to (None: the `trainer` package itself, whose
    __init__ every import runs)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "trainer" and len(parts) > 1 else None


def _floor_violations(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    level = {name: i for i, floor in enumerate(floors) for name in floor}
    found = []
    for module, targets in sorted(graph.items()):
        source = _floor_of(module)
        if source is None or not module.startswith("trainer"):
            continue
        for target in sorted(targets):
            below = _floor_of(target)
            if below is None or below == source or not target.startswith("trainer"):
                continue
            if source not in level or below not in level:
                found.append(
                    f"{module} -> {target}: {source if source not in level else below} is on no floor"
                )
            elif level[below] >= level[source]:
                found.append(
                    f"{module} -> {target}: {source} (floor {level[source] + 1}) imports {below} "
                    f"(floor {level[below] + 1}), which is not below it"
                )
    return found


def test_each_trainer_package_imports_only_the_floors_below_it():
    assert _floor_violations(_graph(), FLOORS) == []


def test_every_trainer_package_and_module_has_one_floor():
    names = [name for floor in FLOORS for name in floor]
    present = {p.stem if p.is_file() else p.name for p in (ROOT / "trainer").iterdir()}
    packages = {p.parent.name for p in (ROOT / "trainer").glob("*/__init__.py")}
    modules = {p.stem for p in (ROOT / "trainer").glob("*.py")} - {"__init__"}
    assert len(names) == len(set(names))
    assert set(names) == packages | modules, "add the new package to FLOORS and docs/architecture.md"
    assert set(names) <= present


def test_the_floor_rule_names_an_import_that_points_up():
    graph = {"trainer.model.llama": {"trainer.plan.memory"}, "trainer.plan.memory": {"trainer.model.flops"}}
    floors = (("model",), ("plan",))
    assert _floor_violations(graph, floors) == [
        "trainer.model.llama -> trainer.plan.memory: model (floor 1) imports plan (floor 2), which is not below it"
    ]
    assert _floor_violations(graph, (("model", "plan"),)) == [
        "trainer.model.llama -> trainer.plan.memory: model (floor 1) imports plan (floor 1), which is not below it",
        "trainer.plan.memory -> trainer.model.flops: plan (floor 1) imports model (floor 1), which is not below it",
    ]


def test_the_trainer_packages_form_no_import_cycle():
    packages: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        source = _floor_of(module)
        if source is not None and module.startswith("trainer"):
            packages.setdefault(source, set()).update(
                floor for target in targets if (floor := _floor_of(target)) not in (None, source)
            )
    names = set(packages).union(*packages.values())
    assert _cycles({name: packages.get(name, set()) for name in names}) == []


def test_docs_architecture_shows_the_floors_bottom_to_top():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Floors", 1)[1].split("\n## ", 1)[0]
    shown = tuple(
        tuple(re.findall(r"`([\w]+)`", line.split(":", 1)[0]))
        for line in section.splitlines()
        if re.match(r"\d+\. ", line)
    )
    assert shown == FLOORS


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
        for node in ast.walk(parse_python(path.read_text())):
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


def _package_dirs() -> list[Path]:
    return sorted(
        path.parent
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
        if ".venv" not in path.parts
    )


def test_every_package_docstring_names_each_of_its_modules():
    unnamed = []
    for package in _package_dirs():
        doc = ast.get_docstring(parse_python((package / "__init__.py").read_text())) or ""
        members = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
        members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
        words = set(re.findall(r"[\w]+", doc))
        unnamed += [f"{package.relative_to(ROOT)}: {member}" for member in members if member not in words]
    assert unnamed == []


# A path to a file or folder of this repository, as comments, docstrings and docs name them.
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:trainer|infra|policy|image|tests|docs|requirements|\.ci)/[\w./-]*\w)"
)
# Paths that a command creates (a temporary name written, then renamed).
_WRITTEN_AT_RUN_TIME = (".tmp",)


def _sources() -> list[Path]:
    """The repository's text files where paths are named, outside virtualenvs, run outputs and git."""
    skipped = {
        ".venv",
        ".venv-checkov",
        ".git",
        "runs",
        "data",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
    }
    found = [ROOT / "Makefile", ROOT / "image" / "Dockerfile"]
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [name for name in subdirectories if name not in skipped]
        found += [
            Path(directory) / name
            for name in files
            if name.endswith((".py", ".md", ".yaml", ".toml", ".sh", ".env"))
        ]
    return found


def _named_paths() -> dict[str, set[str]]:
    named: dict[str, set[str]] = {}
    for source in _sources():
        text = source.read_text(errors="replace")
        for match in _REPO_PATH.finditer(text):
            path = match.group(1).rstrip(".").split("#")[0]
            if re.match(r"[\w./-]*\*", text[match.end() :]) or any(mark in path for mark in "*<>{}$"):
                continue  # a pattern, not a path
            if not path.endswith(_WRITTEN_AT_RUN_TIME):
                named.setdefault(path, set()).add(str(source.relative_to(ROOT)))
    return named


def test_every_repository_path_named_in_code_and_docs_exists():
    missing = {path: sorted(where) for path, where in _named_paths().items() if not (ROOT / path).exists()}
    assert missing == {}


def test_the_path_finder_finds_a_path_that_is_gone():
    gone = "trainer/" + "config.py"  # split, so that this file names no missing path itself
    assert _REPO_PATH.findall(f"see {gone}, or `docs/trainer.md`.") == [gone, "docs/trainer.md"]
    assert not (ROOT / gone).exists()


def test_the_tests_mirror_the_packages():
    # tests/<name>/ for infra/, policy/, image/ and each trainer package; tests/trainer/ for the trainer's own
    # modules (train.py, loop.py, device.py, metrics.py, faults.py); support/ and fixtures/ are shared.
    packages = {p.parent.name for p in (ROOT / "trainer").glob("*/__init__.py")}
    expected = {"infra", "policy", "image", "trainer", "support", "fixtures", *packages}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert folders - expected == set()
