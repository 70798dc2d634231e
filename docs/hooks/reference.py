"""Build hook: the references that follow from the code are generated from it when the site is built.

- The JSON API: the OpenAPI document is made from the FastAPI app that `mas serve` mounts (nothing is
  fetched), rendered by essentials-openapi into the page holding `API`, and published beside it as
  `reference/openapi.json`.
- The settings: one table per group of `mas.config`, each variable with its default and description, into
  the page holding `SETTINGS`.
- The walk-through of a new step: the code `tests/system/test_add_a_step.py` adds to a copy of the studio, where a
  page names one of its constants (`WALKTHROUGH`).

So none can drift from the routes, the settings or what the test proves.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

API = "<!-- the OpenAPI document, rendered at build time -->"
SETTINGS = "<!-- the settings, rendered at build time -->"
WALKTHROUGH = re.compile(r"<!-- tests/system/test_add_a_step\.py: (\w+) -->")
DOCUMENT = "reference/openapi.json"


@cache
def _document() -> dict[str, Any]:
    """The OpenAPI document of the API that `mas serve` mounts at /api/v1."""
    from mas.api import create_api
    from mas.config import Settings

    return create_api(Settings()).openapi()


def _api() -> str:
    rendered = OpenAPIV3DocumentationHandler(_document(), style="MKDOCS").write()
    # the document's own title and description are the page's: keep what follows them
    return rendered.split("<hr />", 1)[1] if "<hr />" in rendered else rendered


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None or value == ():
        return ""
    if isinstance(value, Path) and value.is_relative_to(Path.home()):
        value = Path("~") / value.relative_to(Path.home())  # the reader's home, not the builder's
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    if isinstance(value, dict):
        value = json.dumps(value)
    return f"`{_cell(value)}`"


def _settings() -> str:
    from mas.config import GROUPS, Settings

    general = {name: field for name, field in Settings.model_fields.items() if name not in GROUPS}
    sections = [("general", general)]
    sections += [(name, group.model_fields) for name, group in GROUPS.items()]
    out = []
    for name, fields in sections:
        out += [f"## {name}", "", "| variable | default | what it does |", "|---|---|---|"]
        for field in fields.values():
            out.append(f"| `{field.validation_alias}` | {_default(field)} | {_cell(field.description or '')} |")
        out.append("")
    return "\n".join(out)


def _walkthrough(root: Path, name: str) -> str:
    """The string constant `name` of tests/system/test_add_a_step.py, as a Python code block."""
    tree = ast.parse((root / "tests" / "system" / "test_add_a_step.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return "```python\n" + textwrap.dedent(ast.literal_eval(node.value)).strip() + "\n```"
    raise PluginError(f"tests/system/test_add_a_step.py has no constant {name}")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, DOCUMENT, content=json.dumps(_document(), indent=2)))
    return files


def on_page_markdown(markdown: str, *, config: MkDocsConfig, **_: Any) -> str:
    if API in markdown:
        markdown = markdown.replace(API, _api())
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, _settings())
    root = Path(config.config_file_path).parent
    return WALKTHROUGH.sub(lambda match: _walkthrough(root, match.group(1)), markdown)
