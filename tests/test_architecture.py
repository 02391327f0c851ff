"""The package layering: no import cycles between modules, and no import that points up a floor.

Floors (a module may import its own package and lower floors only); planner/__init__.py and cli.py
sit on top. A new package must be added here, which is the point: the layering is a decision.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {
    "core": 0,
    "model": 1, "hardware": 1, "layout": 1, "stack": 1,
    "cost": 2, "pipeline": 2, "partitioning": 2, "profiling": 2,
    "predict": 3,
    "launchers": 4,
    "search": 5, "engine": 5,
    "fidelity": 6,
    "report": 7,
    "sweeping": 8,  # many solves (plan sweep): renders its own frames; the API passes solve in
    "api": 98,  # the Python API (planner/api/): above every package the planner is built of
    "cli": 99,  # the command line: top, beside planner/__init__.py; it calls the API
}
TOP = 99


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    paths = sorted((ROOT / "planner").rglob("*.py")) + [ROOT / "cli.py"]
    return {_module_name(p): p for p in paths}


def _imports(path: Path, known: set[str]) -> set[str]:
    """planner modules a file imports, at any depth (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def _floor(module: str) -> int:
    parts = module.split(".")
    if module == "cli" or module == "planner":
        return TOP
    return FLOORS[parts[1]]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}


def test_every_package_has_a_floor():
    packages = {p.name for p in (ROOT / "planner").iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(FLOORS), f"add {sorted(packages - set(FLOORS))} to FLOORS"


def test_no_import_points_up():
    upward = []
    for mod, deps in _graph().items():
        for dep in deps:
            same_package = dep.split(".")[:2] == mod.split(".")[:2]
            if _floor(dep) > _floor(mod) or (_floor(dep) == _floor(mod) < TOP and not same_package):
                upward.append(f"{mod} -> {dep}")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep.endswith("__init__") or dep not in graph:
                continue
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_install_ships_every_package():
    """pyproject.toml lists the packages one by one (profiles/ installs as planner.profiles):
    a new sub-package must be added there, or a plain `pip install .` would leave it out."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    present = {"planner"} | {f"planner.{p.name}" for p in (ROOT / "planner").iterdir()
                             if (p / "__init__.py").exists()}
    assert listed == present | {"planner.profiles"}


# the modules that may spell a schedule's name: the registry, and DualPipe's own module
SCHEDULE_NAME_OWNERS = {"planner.core.schedules", "planner.pipeline.dualpipe"}


def test_schedule_names_are_spelled_only_by_the_registry():
    """Consumers ask a schedule's traits (core/schedules.py), never compare its name: a string
    equal to a schedule's name anywhere else in planner/ fails here (use the registry's constant,
    e.g. ONE_F_ONE_B.name, or a trait)."""
    from planner.core.schedules import SCHEDULES

    found = []
    for mod, path in _modules().items():
        if mod in SCHEDULE_NAME_OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in SCHEDULES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "schedule names outside the registry:\n" + "\n".join(found)


MAX_LINES = 450  # issue #28: small modules, each one concept; the last seven were split by it


def test_no_module_over_450_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in (ROOT / "planner").rglob("*.py")}
    over = sorted(f"{p}: {n} lines" for p, n in sizes.items() if n > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines (split by concept):\n" + "\n".join(over)


def _private_imports(path: Path) -> list[str]:
    """`from planner.x import _y` and `x._y` where x is an imported planner module."""
    tree = ast.parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names
                        if a.name.startswith("planner")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


# private names still imported across modules: cli/common.py's flag helpers (the types helper
# owns cli/common.py); remove a line when its name is made public
PRIVATE_IMPORT_ALLOWED = {"_flag", "_three", "_fail"}


def test_no_private_name_imported_across_modules():
    """A `_name` is its module's own: another module that needs it needs a public name."""
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "planner").rglob("*.py"))
             for line in _private_imports(p)
             if line.rsplit(" ", 1)[-1].rsplit(".", 1)[-1] not in PRIVATE_IMPORT_ALLOWED]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


# the CLI's one front door (#28 item 4): what planner/cli/ may import besides its own modules
CLI_MAY_IMPORT = ("planner.api", "planner.report", "planner.core", "planner.cli")
# commands still to move onto planner.api: remove a name when its module is done
CLI_FRONT_DOOR_TODO: set[str] = set()


def _planner_targets(path: Path) -> list[tuple[int, str]]:
    """Each planner module a file imports, as the dotted name it names (``from planner import
    api`` names planner.api), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"planner.{a.name}" for a in node.names] if node.module == "planner" else [
                node.module]
            found += [(node.lineno, n) for n in names]
    return [(line, n) for line, n in found if n == "planner" or n.startswith("planner.")]


def test_the_cli_imports_only_the_api_report_and_core():
    """The CLI parses flags, calls planner.api and renders with planner.report: no command module
    reaches past them into the planner's packages."""
    found = [f"{p.relative_to(ROOT)}:{line}: {name}"
             for p in sorted((ROOT / "planner" / "cli").glob("*.py"))
             if p.name not in CLI_FRONT_DOOR_TODO for line, name in _planner_targets(p)
             if not any(name == m or name.startswith(m + ".") for m in CLI_MAY_IMPORT)]
    assert not found, "the CLI past its front door:\n" + "\n".join(found)
