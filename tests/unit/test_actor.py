"""Who acts is said once: the acting user is a value (`mas.domain.identity.Actor`) that every service acting for
someone takes as a required parameter, the settings are the same for every user, and what a caller may see is
one rule (`mas.accounts.visibility.visible`). Read from the source, so nothing is imported or started."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mas.config import Settings
from mas.domain.identity import Identity

ROOT = Path(__file__).resolve().parents[2]

SERVICES = {
    "mas/pipeline/production.py": ("submit", "schedule", "check_notify_url"),
    "mas/pipeline/quotas.py": ("check", "quotas_of"),
    "mas/learning/style_book.py": ("entries", "unread", "learn", "give", "flip", "forget"),
    "mas/learning/preferences.py": ("read_feedback", "learn_style", "pick"),
    "mas/learning/promotion.py": ("load_picks", "served", "tune_taste", "expect", "ranker"),
    "mas/learning/ab_design.py": ("offer",),
    "mas/memory/blocks.py": ("row_label", "read", "read_all", "versioned", "update", "set_field", "history"),
    "mas/api/idempotency.py": ("once",),
    "mas/agents/__init__.py": ("backend",),
    "mas/agents/llm/__init__.py": ("llm_agents",),
    "mas/agents/letta/roles.py": ("letta_agents",),
    "mas/agents/letta/provisioning.py": ("find", "provision", "crew"),
    "mas/agents/letta/status.py": ("status",),
    "mas/runtime/remote.py": ("tune",),
    "gpu/preference_model.py": ("promoted_adapter",),
    "gpu/tuner.py": ("load_pairs", "tune"),
}
"""The services that act for a user (submitting, quotas, taste and style, picks, A/B, the per-user blocks, a
webhook's secret, a tune), by module."""


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _required_actor(function: ast.FunctionDef) -> bool:
    """Whether `function` has a parameter `actor: Actor` with no default."""
    positional = [*function.args.posonlyargs, *function.args.args]
    defaulted = {a.arg for a in positional[len(positional) - len(function.args.defaults) :]}
    defaulted |= {a.arg for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True) if d}
    return any(
        a.arg == "actor" and a.arg not in defaulted and ast.unparse(a.annotation or ast.Constant("")) == "Actor"
        for a in [*positional, *function.args.kwonlyargs]
    )


def test_every_service_that_acts_for_a_user_requires_an_actor():
    missing = []
    for module, names in SERVICES.items():
        found = _functions(ROOT / module)
        missing += [f"{module}: {name}" for name in names if name not in found or not _required_actor(found[name])]
    assert not missing, f"these act for a user without a required `actor: Actor`: {missing}"


def test_the_rule_of_the_test_itself_tells_a_missing_actor():
    with_one, optional, without = _functions_of(
        "def a(settings, actor: Actor, x): ...\ndef b(settings, actor: Actor = STUDIO): ...\ndef c(settings, user): ..."
    )
    assert _required_actor(with_one) and not _required_actor(optional) and not _required_actor(without)


def _functions_of(source: str) -> list[ast.FunctionDef]:
    return [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]


def test_settings_are_configuration_only():
    """The same settings for every user: no user in them, no copy per user."""
    assert "user" not in Settings.model_fields and not hasattr(Settings, "for_user")
    stale = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in ("mas", "tasks", "gpu")
        for path in (ROOT / package).rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"for_user|settings\.user\b", line)
    ]
    assert not stale, stale


def test_what_a_caller_sees_is_one_rule():
    """No route or page writes its own: no `sees()` after a fetch, no filter on `is_admin` in a query."""
    assert not hasattr(Identity, "sees")
    member, admin = Identity(name="ana", role="member"), Identity(name="root", role="admin")
    assert (member.scope(), admin.scope(), admin.scope("ana")) == ("ana", None, "ana")
    written_again = [
        str(path.relative_to(ROOT))
        for folder in ("mas/api", "mas/gallery")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"\.sees\(|is_admin\s+else|if not \w+\.is_admin:\s*\n\s*stmt", path.read_text())
        or re.search(r"Batch\.user_name == |ABTest\.user_name == |Series\.user_name == ", path.read_text())
    ]
    assert not written_again, written_again
