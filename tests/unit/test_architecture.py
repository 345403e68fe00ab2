"""The import graph keeps its shape (STYLE.md, principle 13): read from the source with ``ast``, nothing run.

- no import cycle among the project's modules (every import counts: module level, inside a function, or
  under ``TYPE_CHECKING``);
- the command line (``combee/cli/``) sits on top: no module outside it imports it, except a ``__main__``;
- no module imports another module's private (``_underscored``) name, nor reads one as an attribute of a
  module it imported (``local._locked``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("combee", "streams", "workers", "deploy")
CLI = "combee.cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _imports(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """``(module, names taken from it, line)`` for every import of a project module in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}:{node.lineno}: a relative import"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            yield node.module, [a.name for a in node.names], node.lineno


def _edges() -> dict[str, set[str]]:
    """``module -> the project modules it imports`` (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, names, _ in _imports(path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
            if len(targets) < len(names) or not names:
                targets.append(module)
            graph[name].update(t for t in targets if t in MODULES and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_modules_are_found() -> None:
    assert {"combee.cli.main", "combee.wiring", "workers.main", "streams.topics"} <= set(MODULES)


def test_no_import_cycle() -> None:
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_below_the_command_line_imports_it() -> None:
    offenders = [
        f"{name} imports {target}"
        for name, targets in _edges().items()
        if not (name == CLI or name.startswith(CLI + ".") or name.endswith(".__main__"))
        for target in targets
        if target == CLI or target.startswith(CLI + ".")
    ]
    assert offenders == []


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} takes {name} from {module}"
        for path in MODULES.values()
        for module, names, line in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """``local name -> project module`` for the imports in ``tree`` that bind a module (``import a.b as m``,
    ``from a import b`` where ``a.b`` is a module; a plain ``import a.b`` binds ``a``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES or alias.name.split(".")[0] in PACKAGES:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The project module that ``node`` (a name or a chain of attributes) stands for, if any."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        if base is not None and f"{base}.{node.attr}" in MODULES:
            return f"{base}.{node.attr}"
    return None


def test_no_private_name_is_read_from_another_module() -> None:
    offenders = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                module = _dotted(node.value, aliases)
                if module is not None:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {module}.{node.attr}")
    assert offenders == []


# The wire (streams/) sits below the method: it takes its settings sections from streams/settings.py and never
# loads the engine, the learner, the wiring or the whole settings object (issue 27).
WIRE = "streams"
ABOVE_THE_WIRE = ("combee.settings", "combee.wiring", "combee.engine", "combee.learner")


def _wire_offenders(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name == WIRE or name.startswith(WIRE + ".")
        for target in sorted(targets)
        if target in ABOVE_THE_WIRE
    ]


def test_the_wire_does_not_import_the_method_or_the_settings_object() -> None:
    assert _wire_offenders(_edges()) == []


def test_the_wire_rule_finds_an_offender() -> None:
    graph = {"streams.status": {"combee.settings", "streams.topics"}, "combee.cli.x": {"combee.settings"}}
    assert _wire_offenders(graph) == ["streams.status imports combee.settings"]


# The workers' delivery layer (workers/delivery/) answers what Faust and aiokafka do not do the way the stages
# need (issue 27). It sits at the bottom of workers/: only it reaches into aiokafka or Faust's transport, and it
# imports no other worker module (a stage, the context, the combiner).
DELIVERY = "workers.delivery"
LIBRARY_INTERNALS = ("aiokafka", "faust.transport")


def _library_imports(path: Path) -> Iterator[tuple[str, int]]:
    """``(module, line)`` for every import of aiokafka or of Faust's transport in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            if any(name == lib or name.startswith(lib + ".") for lib in LIBRARY_INTERNALS):
                yield name, node.lineno
                break


def _delivery_offenders(graph: dict[str, set[str]], library: dict[str, list[str]]) -> list[str]:
    """Workers modules outside the delivery layer that import the libraries' internals, and delivery modules
    that import a worker module above them."""
    inside = [name for name in graph if name == DELIVERY or name.startswith(DELIVERY + ".")]
    above = [
        f"{name} imports {target}"
        for name in inside
        for target in sorted(graph[name])
        if target.startswith("workers.") and not (target == DELIVERY or target.startswith(DELIVERY + "."))
    ]
    reaching = [
        f"{name} imports {lib}"
        for name, libs in sorted(library.items())
        if name.startswith("workers.") and name not in inside
        for lib in libs
    ]
    return above + reaching


def _library_imports_by_module() -> dict[str, list[str]]:
    return {name: [lib for lib, _ in _library_imports(path)] for name, path in MODULES.items()}


def test_only_the_delivery_layer_reaches_into_aiokafka_and_faust_transport() -> None:
    assert _delivery_offenders(_edges(), _library_imports_by_module()) == []


def test_the_delivery_layer_exists_and_holds_the_workarounds() -> None:
    library = _library_imports_by_module()
    assert library["workers.delivery.kafka_io"] and library["workers.delivery.driver"]  # the rule reads them


def test_the_delivery_rule_finds_offenders() -> None:
    graph = {
        "workers.delivery.acks": {"workers.context"},
        "workers.delivery.driver": set(),
        "workers.combine": {"workers.delivery.acks"},
    }
    library = {"workers.combine": ["aiokafka.structs"], "workers.delivery.driver": ["faust.transport.drivers"]}
    assert _delivery_offenders(graph, library) == [
        "workers.delivery.acks imports workers.context",
        "workers.combine imports aiokafka.structs",
    ]


# The combiner (workers/combiner/) sits under its stage (workers/combine.py): from the rest of workers/ it uses only
# what lies below every stage, so a partial's way through it goes down and never back up into a stage (issue 27).
# Not the stages' shared context either: the combiner reaches its worker through its own port
# (workers/combiner/port.py), which the stage's context meets.
COMBINER = "workers.combiner"
BELOW_THE_STAGES = ("workers.runtime", "workers.tenure", "workers.outcomes", DELIVERY)


def _combiner_offenders(graph: dict[str, set[str]]) -> list[str]:
    def within(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [
        f"{name} imports {target}"
        for name, targets in sorted(graph.items())
        if within(name, COMBINER)
        for target in sorted(targets)
        if target.startswith("workers.")
        and not within(target, COMBINER)
        and not any(within(target, low) for low in BELOW_THE_STAGES)
    ]


def test_the_combiner_uses_nothing_of_workers_above_the_stages_context() -> None:
    assert _combiner_offenders(_edges()) == []


def test_the_combiner_rule_finds_an_offender() -> None:
    graph = {
        "workers.combiner.scan": {"workers.context", "workers.combiner.apply", "workers.delivery.acks"},
        "workers.combiner.rollback": {"workers.promotion", "workers.tenure"},
    }
    assert _combiner_offenders(graph) == [
        "workers.combiner.rollback imports workers.promotion",
        "workers.combiner.scan imports workers.context",
    ]


def test_every_delivery_module_names_the_library_behaviour_it_answers() -> None:
    silent = [
        name
        for name, path in MODULES.items()
        if name.startswith(DELIVERY + ".")
        and "Library behaviour answered" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert silent == []
