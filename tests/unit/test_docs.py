"""Every `mas` command the README and the docs show names commands and options that exist.

A reader copies these lines into a terminal: a command or option renamed in the code must fail here, not
there. Commands are read from shell code blocks (`bash`, `sh`, `shell`, `console`: each line, `&&`, `;` and `|`
split apart, comments and `VAR=value` prefixes dropped) and from inline code that starts with `mas `; the
command tree is walked from `mas.cli:main`, each group resolving a word as it would when run, so a new command
needs no change here. A word in capitals where a command is expected
(`mas COMMAND --help`) is a placeholder, and brackets mark what is optional (`mas status [--follow]`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from mas.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^ *```(\w*)[^\n]*\n(.*?)^ *```", re.MULTILINE | re.DOTALL)
SHELL = {"bash", "sh", "shell", "console"}
INLINE = re.compile(r"`(mas [^`]+)`")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def commands_in(line: str) -> list[list[str]]:
    """The `mas` command lines of one shell line, each as its words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found, words = [], []
    for token in [*lexer, ";"]:
        if token not in SEPARATORS:
            words.append(token)
            continue
        while words and ASSIGNMENT.fullmatch(words[0]):
            words.pop(0)
        if words and words[0] == "mas":
            found.append(words)
        words = []
    return found


def shell_lines(markdown: str) -> list[str]:
    """The lines of every shell code block (continuations joined) and every inline `mas ...`."""
    lines = []
    for language, body in FENCE.findall(markdown):
        if language in SHELL:
            joined = re.sub(r"\\\n\s*", " ", body)
            lines += [line.strip().removeprefix("$ ") for line in joined.splitlines()]
    prose = FENCE.sub("", markdown)
    lines += [" ".join(span.split()) for span in INLINE.findall(prose)]
    return lines


def _options(command: click.Command) -> dict[str, bool]:
    """Each option of `command` by name, and whether it takes a value."""
    names = {"--help": False}
    for param in command.params:
        if isinstance(param, click.Option):
            takes_value = not param.is_flag and not param.count
            names.update(dict.fromkeys([*param.opts, *param.secondary_opts], takes_value))
    return names


def problem(words: list[str]) -> str | None:
    """What is wrong with a `mas` command line (its words), or None when its commands and options exist."""
    command: click.Command = main
    path = ["mas"]
    value_next = False
    for raw in words[1:]:
        word = raw.strip("[]")
        if value_next:
            value_next = False
        elif word.startswith("-"):
            name, _, value = word.partition("=")
            options = _options(command)
            if name not in options:
                return f"`{' '.join(path)}` has no option {name}"
            value_next = options[name] and not value
        elif isinstance(command, click.Group):
            if PLACEHOLDER.fullmatch(word):
                return None  # any command of the group
            try:  # as the group itself resolves it (`mas style FEEDBACK` is its `read` command)
                resolved, sub, _ = command.resolve_command(click.Context(command), [word])
            except click.UsageError:
                sub = None
            if sub is None:
                return f"`{' '.join(path)}` has no command {word!r}"
            command = sub
            path.append(resolved or word)
    return None


def test_the_checker_finds_wrong_commands_and_options():
    assert problem(["mas", "enqueue", "--wait", "--at", "02:00", "Create 3 videos"]) is None
    assert problem(["mas", "users", "set", "alice", "--share", "2", "--no-limit-videos-per-day"]) is None
    assert problem(["mas", "status", "[BATCH]", "[--follow]"]) is None
    assert problem(["mas", "COMMAND", "--help"]) is None
    assert problem(["mas", "enqeue", "x"]) == "`mas` has no command 'enqeue'"
    assert problem(["mas", "enqueue", "--waits", "x"]) == "`mas enqueue` has no option --waits"
    assert problem(["mas", "memory", "show", "--tag", "x"]) == "`mas memory show` has no option --tag"
    assert problem(["mas", "memory", "forget"]) == "`mas memory` has no command 'forget'"
    assert problem(["mas", "style", "no purple at all", "--user", "alice"]) is None  # the group's own rule
    assert problem(["mas", "style", "--like", "film grain", "--avoid", "handheld camera"]) is None


def test_commands_are_read_from_shell_blocks_and_inline_code():
    markdown = (
        "Run `mas status [BATCH]` or:\n\n```bash\n# a comment: mas nothing\n"
        'MAS_USER=alice mas enqueue --wait \\\n  "a fox" && mas videos | head\n```\n\n'
        "```ini\nExecStart=/opt/mas/bin/mas worker\n```\n"
    )
    found = [words for line in shell_lines(markdown) for words in commands_in(line)]
    assert found == [["mas", "enqueue", "--wait", "a fox"], ["mas", "videos"], ["mas", "status", "[BATCH]"]]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_mas_command_in_the_docs_exists(page):
    wrong = [
        f"{' '.join(words)}: {found}"
        for line in shell_lines(page.read_text())
        for words in commands_in(line)
        if (found := problem(words))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_docs_show_commands():
    """The check above reads something: the README's and the docs' commands, most of the command tree."""
    shown = {
        " ".join(words[:3]) for page in PAGES for line in shell_lines(page.read_text()) for words in commands_in(line)
    }
    assert {"mas run", "mas enqueue --wait", "mas users add"} <= shown
    assert len(shown) > 40
