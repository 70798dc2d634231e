"""The shape of the code: no import cycles (imports inside functions count), layers import downward only,
and every module small enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mas", "tasks", "gpu")
MAX_LINES = 500  # counted as ruff format lays the code out, with no exception


def _modules() -> dict[str, Path]:
    found = {"beat_schedule": ROOT / "beat_schedule.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_imports_inside_functions():
    graph = {"a": {"b"}, "b": {"a"}}
    assert _cycle(graph) == ["a", "b", "a"]
    assert "mas.runtime.app" in _graph()["mas"]  # imported inside `mas.__getattr__`


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_core_never_imports_tasks_or_gpu():
    wrong = {
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if name == "mas" or name.startswith("mas.")
        for target in targets
        if target.split(".")[0] in ("tasks", "gpu", "beat_schedule")
    }
    assert not wrong, sorted(wrong)


BASE = {f"mas.{name}" for name in ("config", "errors", "names", "locks", "singletons", "text", "redaction", "palette", "grades", "urls")}

LAYERS: tuple[tuple[str, set[str]], ...] = (
    ("base", BASE),
    ("domain", {"mas.domain", "mas.gpu_rules"}),
    (
        "infrastructure",
        {
            f"mas.{name}"
            for name in ("runtime", "db", "models", "migrations", "storage", "video")
        },
    ),
    ("data", {"mas.memory", "mas.outbox", "mas.accounts"}),
    ("engine", {"mas.pipeline"}),
    ("services", {f"mas.{name}" for name in ("agents", "learning", "reports", "api", "gallery", "cli")}),
    ("entry points", {"mas", "tasks", "gpu", "beat_schedule"}),
)
"""The rooms from the bottom up (ARCHITECTURE.md): a room imports rooms of its own layer or below, never above."""


def _room(module: str) -> str:
    """The room a module lives in: its folder under mas/ (mas.pipeline), a top module of mas/, or its package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "mas" else parts[0]


def _rooms() -> dict[str, set[str]]:
    graph = _graph()
    rooms: dict[str, set[str]] = {_room(name): set() for name in graph}
    for name, targets in graph.items():
        rooms[_room(name)] |= {_room(t) for t in targets} - {_room(name)}
    return rooms


def test_no_import_cycles_between_rooms():
    """No folder imports a folder that imports it back (agents <-> learning, pipeline <-> runtime)."""
    cycle = _cycle(_rooms())
    assert cycle is None, "import cycle between rooms: " + " -> ".join(cycle or [])


def test_every_room_has_a_layer_and_imports_downward():
    layer = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}
    rooms = _rooms()
    assert not set(rooms) - set(layer), f"rooms without a layer in LAYERS: {sorted(set(rooms) - set(layer))}"
    wrong = {
        f"{room} ({LAYERS[layer[room]][0]}) imports {target} ({LAYERS[layer[target]][0]})"
        for room, targets in rooms.items()
        for target in targets
        if layer[target] > layer[room]
    }
    assert not wrong, sorted(wrong)


def test_rooms_import_downward():
    """The base imports only the base; the domain's rooms (the studio's vocabulary, the GPU side's rules) only
    the base and themselves; nothing imports the CLI, and only
    the CLI imports the gallery (`mas serve`)."""
    graph = _graph()
    wrong = {
        f"{name} imports {target}"
        for name, targets in graph.items()
        if _room(name) in BASE
        for target in targets
        if _room(target) not in BASE
    }
    wrong |= {
        f"{name} imports {target}"
        for name, targets in graph.items()
        if _room(name) in ("mas.domain", "mas.gpu_rules")
        for target in targets
        if target not in BASE and _room(target) != _room(name)
    }
    wrong |= {
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in targets
        if _room(target) != _room(name)
        and (_room(target) == "mas.cli" or (_room(target) == "mas.gallery" and _room(name) != "mas.cli"))
    }
    assert not wrong, sorted(wrong)


def test_modules_stay_small():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_importing_the_app_and_its_tasks_reads_no_settings():
    """The Celery app is made from settings when a process asks for it, never at import: with a setting that
    does not validate, every task module still imports, and no app exists until one is made."""
    import subprocess
    import sys

    check = (
        "import celery._state as state, importlib\n"
        "for name in ('mas', 'mas.runtime.app', 'tasks.pipeline', 'tasks.maintenance', 'tasks.recovery',\n"
        "             'gpu.tasks', 'beat_schedule', 'mas.cli'):\n"
        "    importlib.import_module(name)\n"
        "assert not [a for a in state._get_active_apps() if type(a).__name__ == 'Studio'], 'an app was made'\n"
    )
    env = {**__import__("os").environ, "MAS_AGENT_BACKEND": "no-such-backend"}
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr.strip()[-600:]


def test_no_module_but_ending_moves_a_video_to_a_final_state():
    """states.fail and states.cancel are the moves to a final state; only the ending calls them."""
    callers = set()
    for package in ("mas", "tasks", "gpu"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("fail", "cancel")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "states"
                ):
                    callers.add(str(path.relative_to(ROOT)))
    assert callers == {"mas/pipeline/ending.py"}
