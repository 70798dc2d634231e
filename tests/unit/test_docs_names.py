"""Every module, file and setting that the project's documents name exists, so they cannot go stale silently: a
module renamed or removed, a file moved, a MAS_ variable dropped fails here, naming the document and the name.

What is read, in each document: the names written as code (`mas.pipeline.ending.LISTENERS`, `gpu/factory.py`),
the tree of files in a code block (each file or folder named under its folder, with the files its line names),
and every MAS_ variable anywhere in its text. Pure code: no server, nothing imported.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from mas.config import GROUPS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("ARCHITECTURE.md", "README.md")
PACKAGES = ("mas", "tasks", "gpu", "tests", "bench", "beat_schedule")
EXTENSIONS = ("py", "md", "json", "yml", "yaml", "toml", "mako", "txt", "ini", "cfg", "sh", "html", "css")

CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)*$")
FILE = re.compile(rf"(?<![\w/.:~-])((?:[\w-]+/)*[\w.-]+\.(?:{'|'.join(EXTENSIONS)}))(?![\w/])")
FOLDER = re.compile(r"(?<![\w/.:~-])((?:[\w-]+/)+)(?=[\s,;:)]|$)")
VARIABLE = re.compile(r"\bMAS_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")
TREE_ENTRY = re.compile(r"^( *)([\w.-]+/?)(?:,|\s{2,}|$)")


def _documents() -> list[str]:
    return [name for name in DOCUMENTS if (ROOT / name).is_file()]


@cache
def _defined(path: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (what `module.name` may refer to)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        if isinstance(node, ast.Assign) and "__all__" in names and isinstance(node.value, (ast.List, ast.Tuple)):
            names |= {item.value for item in node.value.elts if isinstance(item, ast.Constant)}  # `__getattr__`'s
    return frozenset(names)


def _module_exists(dotted: str) -> bool:
    """A module (or package) by its dotted name, or a name its module defines (`mas.pipeline.ending.LISTENERS`;
    a member of a class, `Class.member`, is checked as far as the class)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file() or (base.is_dir() and cut < len(parts) and (base / f"{parts[cut]}").is_dir()):
            rest = parts[cut:]
            return not rest or (module.is_file() and (rest[0] in _defined(module) or (base / rest[0]).exists()))
    return False


def _path_exists(path: str, folders: tuple[Path, ...]) -> bool:
    """A file or folder named in a document: under the root, or under a folder of the tree it stands in (or one
    above it); a bare file name anywhere in the project."""
    path = path.rstrip("/")
    if any((folder / path).exists() for folder in (*folders, ROOT)):
        return True
    return "/" not in path and any(True for _ in ROOT.glob(f"[!.]*/**/{path}"))


def _code_names(text: str) -> tuple[set[str], set[str]]:
    """(modules, paths) written as code in `text`."""
    modules, paths = set(), set()
    for code in CODE.findall(text):
        code = code.strip().rstrip(".,;:")
        if DOTTED.match(code) and "." in code and not FILE.fullmatch(code):
            modules.add(code)
        elif " " not in code and "://" not in code and not code.startswith(("/", "~", ".", "$")):
            paths |= {m for m in FILE.findall(code) if m == code} | {m for m in FOLDER.findall(code) if m == code}
    return modules, paths


def _tree_paths(text: str) -> set[tuple[str, tuple[Path, ...]]]:
    """Each file or folder the trees of `text`'s code blocks name, with the folders it may lie in: an entry's
    own path under its parent folder, and the files its line (and the lines that go on with it) names, under the
    entry's folder or one above it."""
    found: set[tuple[str, tuple[Path, ...]]] = set()
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL):
        lines = block.splitlines()
        if not lines or not TREE_ENTRY.match(lines[0]) or not lines[0].split()[0].endswith("/"):
            continue  # commands, not a tree of files
        stack: list[tuple[int, Path]] = []  # (indentation, folder) of the entries above
        here: tuple[Path, ...] = (ROOT,)
        for line in lines:
            entry = TREE_ENTRY.match(line)
            if entry and len(entry[1]) % 2 == 0 and len(entry[1]) <= (stack[-1][0] + 2 if stack else 0):
                indent = len(entry[1])
                stack = [(i, f) for i, f in stack if i < indent]
                parent = stack[-1][1] if stack else ROOT
                for name in re.findall(r"[\w.-]+/?", line[indent:].split("  ")[0]):
                    found.add((name, (parent,)))
                    if name.endswith("/"):
                        stack.append((indent, parent / name.rstrip("/")))
                folder = stack[-1][1] if stack and stack[-1][0] == indent else parent
                here = (folder, *(above for above in folder.parents if above.is_relative_to(ROOT)))
            found |= {(path, here) for path in FILE.findall(line)} | {(path, here) for path in FOLDER.findall(line)}
    return found


def _known_variables() -> set[str]:
    """Every setting's variable, and every MAS_ variable the project's code reads by name (the tests' own), a
    name it makes (`f"MAS_TEST_REQUIRE_{part}"`) by its start."""
    known = {"MAS_DATA_DIR", "MAS_USER"} | {
        str(field.validation_alias) for group in GROUPS.values() for field in group.model_fields.values()
    }
    for package in ("mas", "tasks", "gpu", "tests", "bench"):
        for path in set((ROOT / package).rglob("*.py")) - {Path(__file__).resolve()}:  # not the names made up here
            text = path.read_text()
            known |= set(re.findall(r"[\"'](MAS_[A-Z0-9_]+)[\"']", text))
            known |= {f"{start}*" for start in re.findall(r"[\"'](MAS_[A-Z0-9_]+)\{", text)}
    return known


def _is_known(variable: str, known: set[str]) -> bool:
    return variable in known or any(variable.startswith(start[:-1]) for start in known if start.endswith("*"))


@pytest.mark.parametrize("document", _documents())
def test_every_module_a_document_names_exists(document):
    modules, _ = _code_names((ROOT / document).read_text())
    missing = sorted(name for name in modules if not _module_exists(name))
    assert not missing, f"{document} names modules that do not exist: {missing}"


@pytest.mark.parametrize("document", _documents())
def test_every_file_a_document_names_exists(document):
    text = (ROOT / document).read_text()
    _, paths = _code_names(text)
    missing = {path for path in paths if not _path_exists(path, ())}
    missing |= {path for path, folders in _tree_paths(text) if not _path_exists(path, folders)}
    assert not missing, f"{document} names files or folders that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("document", _documents())
def test_every_setting_a_document_names_exists(document):
    named = set(VARIABLE.findall((ROOT / document).read_text()))
    known = _known_variables()
    unknown = sorted(name for name in named if not _is_known(name, known))
    assert not unknown, f"{document} names MAS_ variables that no setting (nor the code) reads: {unknown}"


def test_the_checks_find_what_is_gone():
    """The checks themselves: a name that is gone is found missing, one that exists is found."""
    assert _module_exists("mas.pipeline.ending.LISTENERS") and _module_exists("mas.config.Settings.changed")
    assert _module_exists("mas.agents.letta") and _module_exists("gpu.tasks")
    assert not _module_exists("mas.grading") and not _module_exists("mas.pipeline.ending.NO_SUCH_NAME")
    assert _path_exists("mas/gpu_rules/vram_models.json", ()) and not _path_exists("mas/config.py", ())
    tree = "```\nmas/   the core\n  runtime/   what runs: app.py (the app), gone.py\n  db.py, models.py\n```\n"
    assert {path for path, folders in _tree_paths(tree) if not _path_exists(path, folders)} == {"gone.py"}
    assert _code_names("see `mas.grading` and `gpu/factory.py`, run `mas up`") == ({"mas.grading"}, {"gpu/factory.py"})
    known = _known_variables()
    assert not _is_known("MAS_NO_SUCH_SETTING", known) and _is_known("MAS_WRITE_AHEAD", known)
    assert _is_known("MAS_TEST_REQUIRE_LLM", known)  # made by the tests' parts from its start
