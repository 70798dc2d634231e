"""The Letta agent backend: Director, Writer and Cameraman as stateful agents on a Letta server.

Chosen with MAS_AGENT_BACKEND=letta; MAS_LETTA_URL and MAS_LETTA_TOKEN say where the server is (the
token is sent as a bearer token and never printed). It implements the same role interfaces as the offline
backend (`mas.agents.roles`), so tasks do not know which backend plays.

What lives on the server, found by name and the tag `mas` (never by a stored id), created when missing:

- six core blocks, one per label of `mas.memory.blocks.SCHEMAS`, each holding its value as JSON
  (Appendix B defaults), shared: the same block ids are attached to every agent;
- three agents, `director`, `writer` and `cameraman`, with sleeptime enabled: Letta gives each a
  sleeptime companion (`<name>-sleeptime`) in a group that runs it every MAS_SLEEPTIME_FREQUENCY turns;
  the companions get `message_buffer_autoclear` (the seed system's finding: accumulated history made
  them ignore their instructions), and instructions to keep the JSON blocks valid.

`provision` is idempotent and serialized across processes by a PostgreSQL advisory lock in the studio's
own database; a second run creates nothing and only repairs what drifted (a detached block, sleeptime
off, autoclear off, another frequency).

A role call sends one message and reads one JSON object back, from an assistant message or from a
`send_message` tool call (what a sleeptime-enabled agent answers with). A reply with no JSON object of
the expected shape raises `LettaReplyError`; a server that cannot be reached, times out or answers 5xx
raises `LettaUnavailable`: both are `LettaRetryableError`, the exception Celery tasks retry on. Calls to
one agent are serialized (advisory lock): Letta loses in-context messages when one agent gets two
messages at once.

Buffer maintenance against Letta (the seed's cron, v3 policy) lives in `mas.agents.letta_maintenance`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from mas.agents.roles import (
    Agents,
    Consolidation,
    Draft,
    Plan,
    PlannedVideo,
    StylePreferences,
    Verdict,
    WriterBrief,
)
from mas.config import Settings, redact_url
from mas.memory.blocks import SCHEMAS, BlockError, apply_change, defaults
from mas.requests import ProductionRequest

log = logging.getLogger(__name__)

TAG = "mas"
"""Tag on every agent and block this backend owns; with the name it is how they are found again."""

ROLES = ("director", "writer", "cameraman")
"""The Letta agents, by name. Each gets a sleeptime companion named `<name>-sleeptime`."""

MESSAGE_TIMEOUT_S = 300.0
"""Longest a role call may take: an LLM turn, tool steps included."""

ADMIN_TIMEOUT_S = 60.0
"""Longest a lookup, create or update may take."""

AGENT_LOCK_TIMEOUT_S = 600
"""Longest a role call waits for another call to the same agent to finish before giving up (retryable)."""

REPLY_EXCERPT_CHARS = 300
"""How much of an unparseable reply an error message quotes."""

SEND_MESSAGE = "send_message"
FAILED_COMPACTIONS_KEY = "mas_failed_compactions"
"""Agent metadata key where maintenance counts failed compactions (state kept on the server)."""


# --- errors ------------------------------------------------------------------------------------------


class LettaError(RuntimeError):
    """Something about the Letta server or its agents went wrong; the message says what to do."""


class LettaRetryableError(LettaError):
    """A transient failure: the same call may succeed later. Celery tasks retry on this type."""


class LettaUnavailable(LettaRetryableError):
    """The server could not be reached, timed out, was busy or answered with a server error."""


class LettaReplyError(LettaRetryableError):
    """An agent's reply held no JSON object of the shape its task asked for."""

    def __init__(self, *, agent: str, task: str, problem: str, excerpt: str = "") -> None:
        self.agent, self.task, self.problem, self.excerpt = agent, task, problem, excerpt
        detail = f": {excerpt!r}" if excerpt else ""
        super().__init__(f"{agent} answered task {task!r} with {problem}{detail}")

    def __reduce__(self):  # picklable with its keyword-only constructor (Celery ships exceptions)
        return (_reply_error, (self.agent, self.task, self.problem, self.excerpt))

    def __repr__(self) -> str:
        return f"LettaReplyError(agent={self.agent!r}, task={self.task!r}, problem={self.problem!r})"


def _reply_error(agent: str, task: str, problem: str, excerpt: str) -> LettaReplyError:
    return LettaReplyError(agent=agent, task=task, problem=problem, excerpt=excerpt)


RETRYABLE = (LettaRetryableError,)
"""For `autoretry_for=` on Celery tasks that call agents."""


def _api():
    try:
        import letta_client
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LettaError("the letta backend needs letta-client: pip install 'mas[letta]'") from exc
    return letta_client


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn letta-client exceptions into ours; never mention the token."""
    api = _api()
    try:
        yield
    except (api.APIConnectionError, api.APITimeoutError) as exc:  # APITimeoutError is a connection error
        raise LettaUnavailable(f"{what}: Letta server unreachable or too slow ({type(exc).__name__})") from exc
    except api.APIStatusError as exc:
        code = exc.status_code
        detail = _status_detail(exc)
        if code in (401, 403):
            raise LettaError(f"{what}: the Letta server refused the token (HTTP {code}); check MAS_LETTA_TOKEN") from exc
        if code in (408, 409, 429) or code >= 500:
            raise LettaUnavailable(f"{what}: Letta answered HTTP {code}: {detail}") from exc
        raise LettaError(f"{what}: Letta answered HTTP {code}: {detail}") from exc


def _status_detail(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])[:300]
    return str(exc)[:300]


# --- client ------------------------------------------------------------------------------------------


_clients: dict[tuple[str, str], Any] = {}
_clients_lock = threading.Lock()


def client(settings: Settings):
    """A letta-client `Letta` for MAS_LETTA_URL, shared within the process."""
    token = settings.letta_token.get_secret_value() if settings.letta_token else ""
    key = (settings.letta_url, hashlib.sha256(token.encode()).hexdigest())
    with _clients_lock:
        if key not in _clients:
            _clients[key] = _api().Letta(
                base_url=settings.letta_url, api_key=token or None, timeout=ADMIN_TIMEOUT_S, max_retries=2
            )
        return _clients[key]


# --- provisioning ------------------------------------------------------------------------------------


PERSONAS = {
    "director": (
        "You are the Director of an autonomous AI video studio. You plan production batches, content "
        "series and A/B tests, read what users say about the style they like, and consolidate recent "
        "production activity into a short summary and reusable learnings."
    ),
    "writer": (
        "You are the Writer of an autonomous AI video studio. You write prompts for a text-to-video model "
        "(LTX-2): one vivid sentence or short paragraph naming subject, action, camera, lighting, colour "
        "palette and atmosphere. You apply the user's learned style, the series' rules and winning "
        "patterns, you prevent known failure patterns, and you never include anything the user dislikes."
    ),
    "cameraman": (
        "You are the Cameraman of an autonomous AI video studio. You judge each rendered attempt from its "
        "grade and quality scores: accept it when the grade meets the minimum; otherwise name what failed "
        "and either ask for a refinement with a concrete strategy, or give up when attempts are used up."
    ),
}

PROTOCOL = (
    "\n\nYour core memory holds the studio's shared memory blocks, each a JSON object: session_state, "
    "user_style, quality_standards, production_queue, current_series and ab_testing. Read them; the "
    "studio writes them.\n"
    "Every message you receive is a task in three lines: `TASK <name>`, `INPUT <json>` and "
    "`REPLY <json shape>`, sometimes followed by `RULES`. Answer with exactly one JSON object of the "
    "REPLY shape and nothing else (no prose, no code fence), sent with send_message when you have that "
    "tool, otherwise as your reply."
)

SLEEPTIME_PERSONA = (
    "I am the sleeptime memory agent of an AI video studio. After the primary agent works, I review the "
    "transcript and keep the shared memory blocks current: I must set session_state.LAST_ACTIVITY to the "
    "ISO timestamp of the latest activity. Every block holds one JSON object: I edit a block only with "
    "memory_rethink, writing the whole block back as valid JSON with exactly the same field names, and I "
    "keep each block under its size limit. Then I call memory_finish_edits."
)

SLEEPTIME_PERSONA_LABEL = "memory_persona"


@dataclass(frozen=True, kw_only=True)
class AgentIds:
    """One provisioned role agent and its sleeptime companions."""

    role: str
    id: str
    group_id: str | None
    sleeptime_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Provisioned:
    """What is on the server now, and what this call created or repaired."""

    blocks: dict[str, str]  # label -> block id
    agents: dict[str, AgentIds]  # role -> ids
    created: list[str] = field(default_factory=list)  # "block user_style", "agent director"
    changed: list[str] = field(default_factory=list)  # "director: attached block ab_testing", ...


def _lock_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_xact_lock."""
    return int.from_bytes(hashlib.sha256(f"mas.letta:{name}".encode()).digest()[:8], "big", signed=True)


@contextmanager
def _advisory_lock(settings: Settings, name: str, *, timeout_s: int | None = None) -> Iterator[None]:
    """Hold a transaction-level advisory lock in the studio's database for the duration of the block."""
    import sqlalchemy as sa

    from mas import db

    with db.ready_engine(settings).connect() as conn, conn.begin():
        if timeout_s is not None:
            conn.execute(sa.text(f"set local lock_timeout = '{int(timeout_s)}s'"))
        try:
            conn.execute(sa.text("select pg_advisory_xact_lock(:k)"), {"k": _lock_key(name)})
        except sa.exc.OperationalError as exc:
            raise LettaUnavailable(f"waited over {timeout_s} s for {name}: another call holds it") from exc
        yield


def _blocks_by_label(api, labels=tuple(SCHEMAS)) -> dict[str, list]:
    found: dict[str, list] = {}
    for label in labels:
        with _translated(f"listing block {label}"):
            matches = [b for b in api.blocks.list(label=label, tags=[TAG]) if b.label == label]
        found[label] = sorted(matches, key=lambda b: b.id)
    return found


def _find_agent(api, role: str):
    """The agent named `role` tagged `mas` (the oldest, if a race ever made two), with relations."""
    with _translated(f"looking up agent {role}"):
        matches = [
            a for a in api.agents.list(
                name=role, tags=[TAG], include=["agent.tags", "agent.managed_group", "agent.blocks"]
            )
            if a.name == role
        ]
    if len(matches) > 1:
        log.warning("%d Letta agents named %r carry tag %r; using the oldest", len(matches), role, TAG)
    return min(matches, key=lambda a: (str(a.created_at or ""), a.id)) if matches else None


def _group(agent):
    return agent.managed_group or agent.multi_agent_group


def _ids(role: str, agent) -> AgentIds:
    group = _group(agent)
    return AgentIds(
        role=role, id=agent.id, group_id=group.id if group else None,
        sleeptime_ids=tuple(group.agent_ids) if group else (),
    )


def find(settings: Settings, *, api=None) -> Provisioned | None:
    """What is provisioned, found by name and tag; None if any block or agent is missing."""
    api = api or client(settings)
    blocks = _blocks_by_label(api)
    if any(not found for found in blocks.values()):
        return None
    agents = {}
    for role in ROLES:
        agent = _find_agent(api, role)
        if agent is None or not _group(agent):
            return None
        agents[role] = _ids(role, agent)
    return Provisioned(blocks={label: found[0].id for label, found in blocks.items()}, agents=agents)


def provision(settings: Settings, *, api=None, lock: bool = True) -> Provisioned:
    """Create what is missing and repair what drifted; the same result, and nothing new, when run again.

    `lock` serializes concurrent provisioning (say two workers starting at once) on an advisory lock in
    the studio's PostgreSQL; pass False where no studio database is reachable.
    """
    api = api or client(settings)
    if lock:
        with _advisory_lock(settings, "provision"):
            return _provision(settings, api)
    return _provision(settings, api)


def _provision(settings: Settings, api) -> Provisioned:
    created: list[str] = []
    changed: list[str] = []
    blocks: dict[str, str] = {}
    for label, found in _blocks_by_label(api).items():
        if found:
            if len(found) > 1:
                log.warning("%d Letta blocks labelled %r carry tag %r; using %s", len(found), label, TAG, found[0].id)
            blocks[label] = found[0].id
            continue
        with _translated(f"creating block {label}"):
            block = api.blocks.create(
                label=label, value=_dump(defaults(label, settings)), limit=settings.core_block_max_chars,
                tags=[TAG], description=f"{label}: one JSON object (Appendix B schema); keep it valid JSON.",
            )
        blocks[label] = block.id
        created.append(f"block {label}")
        log.info("created Letta block %s (%s)", label, block.id)

    agents: dict[str, AgentIds] = {}
    for role in ROLES:
        agent = _find_agent(api, role)
        fresh = agent is None
        if fresh:
            with _translated(f"creating agent {role}"):
                agent = api.agents.create(
                    name=role, model=settings.letta_model, embedding=settings.letta_embedding,
                    system=PERSONAS[role] + PROTOCOL, block_ids=list(blocks.values()),
                    tags=[TAG, f"{TAG}:{role}"], enable_sleeptime=True, description=f"mas {role}",
                )
            created.append(f"agent {role}")
            log.info("created Letta agent %s (%s)", role, agent.id)
            agent = _find_agent(api, role) or agent
        # a new agent's companion is set up here too; that is part of creating it, not a repair
        agents[role] = _repair(settings, api, role, agent, blocks, [] if fresh else changed)
    return Provisioned(blocks=blocks, agents=agents, created=created, changed=changed)


def _repair(settings: Settings, api, role: str, agent, blocks: dict[str, str], changed: list[str]) -> AgentIds:
    """Bring one found agent to the wanted state; note each change."""
    attached = {b.id for b in (agent.blocks or [])}
    for label, block_id in blocks.items():
        if block_id not in attached:
            with _translated(f"attaching block {label} to {role}"):
                api.agents.blocks.attach(block_id, agent_id=agent.id)
            changed.append(f"{role}: attached block {label}")
    if not _group(agent):
        with _translated(f"enabling sleeptime on {role}"):
            api.agents.update(agent.id, enable_sleeptime=True)
        changed.append(f"{role}: enabled sleeptime")
        agent = _find_agent(api, role)
        if agent is None or not _group(agent):
            raise LettaError(f"enabling sleeptime on {role} made no sleeptime group")
    group = _group(agent)
    if group.sleeptime_agent_frequency != settings.sleeptime_frequency:
        set_sleeptime_frequency(api, group.id, settings.sleeptime_frequency)
        changed.append(f"{role}: sleeptime frequency {group.sleeptime_agent_frequency} -> {settings.sleeptime_frequency}")
    for sleeptime_id in group.agent_ids:
        with _translated(f"reading sleeptime agent of {role}"):
            companion = api.agents.retrieve(sleeptime_id, include=["agent.blocks"])
        if not companion.message_buffer_autoclear:
            with _translated(f"enabling autoclear on {companion.name}"):
                api.agents.update(sleeptime_id, message_buffer_autoclear=True)
            changed.append(f"{companion.name}: message_buffer_autoclear on")
        companion_blocks = {b.label: b for b in (companion.blocks or [])}
        for label, block_id in blocks.items():
            if label not in companion_blocks:
                with _translated(f"attaching block {label} to {companion.name}"):
                    api.agents.blocks.attach(block_id, agent_id=sleeptime_id)
                changed.append(f"{companion.name}: attached block {label}")
        persona = companion_blocks.get(SLEEPTIME_PERSONA_LABEL)
        if persona is not None and persona.value != SLEEPTIME_PERSONA:
            with _translated(f"instructing {companion.name}"):
                api.agents.blocks.update(SLEEPTIME_PERSONA_LABEL, agent_id=sleeptime_id, value=SLEEPTIME_PERSONA)
            changed.append(f"{companion.name}: instructions set")
    return _ids(role, agent)


def set_sleeptime_frequency(api, group_id: str, frequency: int) -> None:
    """Run the sleeptime companion every `frequency` turns (letta-client has no groups resource)."""
    import httpx

    body = {"manager_config": {"manager_type": "sleeptime", "sleeptime_agent_frequency": int(frequency)}}
    with _translated(f"setting the sleeptime frequency of group {group_id}"):
        response = api.patch(f"/v1/groups/{group_id}", body=body, cast_to=httpx.Response)
    if response.status_code >= 400:
        raise LettaError(f"setting the sleeptime frequency of group {group_id}: HTTP {response.status_code}")


def sleeptime_frequency(api, group_id: str) -> int | None:
    import httpx

    with _translated(f"reading group {group_id}"):
        response = api.get(f"/v1/groups/{group_id}", cast_to=httpx.Response)
    return response.json().get("sleeptime_agent_frequency") if response.status_code < 400 else None


# --- the crew a process talks to -----------------------------------------------------------------------


_crews: dict[str, Provisioned] = {}
_crews_lock = threading.Lock()


def _crew(settings: Settings, *, refresh: bool = False) -> Provisioned:
    """The provisioned ids for this server, looked up once per process (provisioned if missing)."""
    key = settings.letta_url
    with _crews_lock:
        if refresh:
            _crews.pop(key, None)
        if key not in _crews:
            api = client(settings)
            _crews[key] = find(settings, api=api) or provision(settings, api=api)
        return _crews[key]


def forget(settings: Settings | None = None) -> None:
    """Drop cached agent ids (of one server, or all), so the next call looks them up again."""
    with _crews_lock:
        if settings is None:
            _crews.clear()
        else:
            _crews.pop(settings.letta_url, None)


# --- asking an agent ---------------------------------------------------------------------------------


def task_message(task: str, payload: dict[str, Any], reply: str, rules: str = "") -> str:
    """The text of one role call: TASK, INPUT (JSON), REPLY (the JSON shape wanted), RULES."""
    lines = [f"TASK {task}", f"INPUT {json.dumps(payload, ensure_ascii=False, default=str)}", f"REPLY {reply}"]
    if rules:
        lines.append(f"RULES {rules}")
    return "\n".join(lines)


def reply_candidates(response) -> list[str]:
    """The texts an agent's answer may be in, in order: assistant messages and send_message arguments."""
    found: list[str] = []
    for message in getattr(response, "messages", None) or []:
        kind = getattr(message, "message_type", "")
        if kind == "assistant_message":
            content = message.content
            if isinstance(content, str):
                found.append(content)
            else:
                found.append("".join(getattr(part, "text", "") or "" for part in content or []))
        elif kind == "tool_call_message":
            calls = list(getattr(message, "tool_calls", None) or []) or [message.tool_call]
            for call in calls:
                if call is None or getattr(call, "name", None) != SEND_MESSAGE:
                    continue
                try:
                    arguments = json.loads(call.arguments or "{}")
                except json.JSONDecodeError:
                    found.append(call.arguments or "")
                    continue
                text = arguments.get("message", "") if isinstance(arguments, dict) else arguments
                found.append(text if isinstance(text, str) else json.dumps(text))
    return found


_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in `text`: the whole text, a fenced block, or the first object embedded in prose."""
    text = text.strip()
    candidates = [text, _FENCE.sub("", text).strip()]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
        if isinstance(value, str):  # a JSON string holding the object (double-encoded)
            inner = parse_json_object(value) if value.strip().startswith("{") else None
            if inner is not None:
                return inner
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


class _Agent:
    """One Letta agent a role talks to: sends a task, returns the JSON object of its reply."""

    def __init__(self, settings: Settings, role: str, *, serialize: bool = True) -> None:
        self.settings, self.role, self.serialize = settings, role, serialize

    def ask(self, task: str, payload: dict[str, Any], reply: str, rules: str = "") -> dict[str, Any]:
        text = task_message(task, payload, reply, rules)
        response = self._send(text, task)
        candidates = reply_candidates(response)
        for candidate in reversed(candidates):
            value = parse_json_object(candidate)
            if value is not None:
                return value
        stop = getattr(getattr(response, "stop_reason", None), "stop_reason", None)
        raw = " | ".join(c for c in candidates if c.strip())
        problem = "no JSON object" if raw else f"no reply (stop reason: {stop or 'unknown'})"
        raise LettaReplyError(agent=self.role, task=task, problem=problem, excerpt=raw[:REPLY_EXCERPT_CHARS])

    def _send(self, text: str, task: str):
        api = client(self.settings).with_options(timeout=MESSAGE_TIMEOUT_S, max_retries=0)
        for attempt in (1, 2):
            agent_id = _crew(self.settings, refresh=attempt == 2).agents[self.role].id
            try:
                with self._exclusive(), _translated(f"{self.role} {task}"):
                    return api.agents.messages.create(agent_id, messages=[{"role": "user", "content": text}])
            except LettaError as exc:
                if attempt == 1 and isinstance(exc.__cause__, _api().NotFoundError):
                    log.warning("Letta agent %s (%s) vanished; looking it up again", self.role, agent_id)
                    continue
                raise
        raise AssertionError("unreachable")

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self.serialize:
            yield
            return
        with _advisory_lock(self.settings, f"agent:{self.role}", timeout_s=AGENT_LOCK_TIMEOUT_S):
            yield


# field coercion: a model may send a list where a string is wanted, or one string for a list


def _text(value: Any, *, agent: str, task: str, name: str, required: bool = False) -> str:
    if value is None:
        value = ""
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        value = ", ".join(str(v) for v in value)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise LettaReplyError(agent=agent, task=task, problem=f"{name!r} is not text", excerpt=json.dumps(value)[:200])
    value = str(value).strip()
    if required and not value:
        raise LettaReplyError(agent=agent, task=task, problem=f"an empty {name!r}")
    return value


def _texts(value: Any, *, agent: str, task: str, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise LettaReplyError(agent=agent, task=task, problem=f"{name!r} is not a list of text", excerpt=json.dumps(value)[:200])
    return [str(v).strip() for v in value if str(v).strip()]


# --- the roles ---------------------------------------------------------------------------------------


class LettaDirector:
    """Plans batches, series and A/B tests, and reads style feedback, through the `director` agent."""

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = _Agent(settings, "director", serialize=serialize)

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0) -> Plan:
        payload = {"request": asdict(request), "episodes_done": episodes_done}
        rules = (
            f"exactly {request.count} videos, each a distinct concept on the theme. "
            + {
                "ab": "kind ab: variations of one concept, labels A, B, C... in order, each with a distinct "
                "camera/visual approach.",
                "series": f"kind series: episodes {episodes_done + 1} to {episodes_done + request.count} of "
                "one story; give the series style, consistency rules and recurring elements.",
            }.get(request.kind, "label null and approach empty.")
        )
        value = self._agent.ask(
            "plan", payload,
            '{"videos": [{"concept": str, "label": str|null, "approach": str}], "series_style": str, '
            '"consistency_rules": [str], "series_elements": [str]}',
            rules,
        )
        a, t = "director", "plan"
        videos = value.get("videos")
        if not isinstance(videos, list) or not all(isinstance(v, dict) for v in videos):
            raise LettaReplyError(agent=a, task=t, problem="no list of videos", excerpt=json.dumps(value)[:200])
        if len(videos) != request.count:
            raise LettaReplyError(agent=a, task=t, problem=f"{len(videos)} videos where {request.count} were asked")
        planned = []
        for i, video in enumerate(videos):
            concept = _text(video.get("concept"), agent=a, task=t, name="concept", required=True)
            approach = _text(video.get("approach"), agent=a, task=t, name="approach")
            label = chr(ord("A") + i) if request.kind == "ab" else None  # the studio's labels, in order
            planned.append(PlannedVideo(concept=concept, label=label, approach=approach))
        return Plan(
            videos=planned,
            series_style=_text(value.get("series_style"), agent=a, task=t, name="series_style"),
            consistency_rules=_texts(value.get("consistency_rules"), agent=a, task=t, name="consistency_rules"),
            series_elements=_texts(value.get("series_elements"), agent=a, task=t, name="series_elements"),
        )

    def read_style(self, feedback: str) -> StylePreferences:
        value = self._agent.ask(
            "read_style", {"feedback": feedback},
            '{"colors": str, "moods": str, "themes": str, "pacing": str, "disliked": [str]}',
            "comma-separated words for colors, moods, themes and pacing, empty when not mentioned; disliked: "
            "the opposite aesthetics the feedback rules out.",
        )
        a, t = "director", "read_style"
        return StylePreferences(
            colors=_text(value.get("colors"), agent=a, task=t, name="colors"),
            moods=_text(value.get("moods"), agent=a, task=t, name="moods"),
            themes=_text(value.get("themes"), agent=a, task=t, name="themes"),
            pacing=_text(value.get("pacing"), agent=a, task=t, name="pacing"),
            disliked=_texts(value.get("disliked"), agent=a, task=t, name="disliked"),
        )


class LettaWriter:
    """Writes each attempt's prompt through the `writer` agent; the seed is the studio's, not the model's."""

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = _Agent(settings, "writer", serialize=serialize)

    def write(self, brief: WriterBrief) -> Draft:
        value = self._agent.ask(
            "write", {"brief": asdict(brief)},
            '{"prompt": str, "negative_prompt": str}',
            "apply user_style and the series rules; prevent failure_patterns; on a retry fix "
            "previous_failures; never name anything in user_style.DISLIKED_ELEMENTS in the prompt; "
            "negative_prompt lists what to avoid.",
        )
        a, t = "writer", "write"
        return Draft(
            prompt=_text(value.get("prompt"), agent=a, task=t, name="prompt", required=True),
            negative_prompt=_text(value.get("negative_prompt"), agent=a, task=t, name="negative_prompt"),
            seed=draft_seed(brief),
        )


def draft_seed(brief: WriterBrief) -> int:
    """The render seed of an attempt: reproducible from concept and attempt, as in the offline backend."""
    return int(hashlib.sha256(f"{brief.concept}|{brief.attempt}".encode()).hexdigest()[:8], 16) % 2**31


class LettaCameraman:
    """Judges attempts through the `cameraman` agent; never lets a refinement exceed the retry limit."""

    ACTIONS = ("accept", "refine", "fail")

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = _Agent(settings, "cameraman", serialize=serialize)

    def review(self, *, grade: str, scores: dict[str, float], min_grade: str, attempt: int, max_retries: int) -> Verdict:
        payload = {"grade": grade, "scores": scores, "min_grade": min_grade, "attempt": attempt, "max_retries": max_retries}
        value = self._agent.ask(
            "review", payload,
            '{"action": "accept"|"refine"|"fail", "failure_reasons": [str], "strategy": str}',
            "grades run A (best) to F; accept when grade is min_grade or better; otherwise name the weak "
            "axes as failure_reasons and refine with a strategy while attempt < max_retries, else fail.",
        )
        a, t = "cameraman", "review"
        action = _text(value.get("action"), agent=a, task=t, name="action", required=True).lower()
        if action not in self.ACTIONS:
            raise LettaReplyError(agent=a, task=t, problem=f"action {action!r}, not one of {', '.join(self.ACTIONS)}")
        if action == "refine" and attempt >= max_retries:
            log.info("cameraman asked to refine attempt %d of %d; failing instead", attempt, max_retries)
            action = "fail"
        return Verdict(
            action=action,
            failure_reasons=_texts(value.get("failure_reasons"), agent=a, task=t, name="failure_reasons"),
            strategy=_text(value.get("strategy"), agent=a, task=t, name="strategy") if action == "refine" else "",
        )


class LettaConsolidator:
    """Summarizes recent activity into learnings through the `director` agent.

    The director's sleeptime companion consolidates core memory on its own schedule; it answers with
    memory edits, never with a reply, so the synchronous consolidation the pipeline asks for goes to the
    director itself.
    """

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = _Agent(settings, "director", serialize=serialize)

    def consolidate(self, *, activity: list[str]) -> Consolidation:
        value = self._agent.ask(
            "consolidate", {"activity": activity},
            '{"summary": str, "learnings": [str]}',
            "summary: what was produced since the last consolidation, in one or two sentences; learnings: "
            "at most three reusable lessons about what made prompts succeed or fail (may be empty).",
        )
        a, t = "director", "consolidate"
        return Consolidation(
            summary=_text(value.get("summary"), agent=a, task=t, name="summary", required=True),
            learnings=_texts(value.get("learnings"), agent=a, task=t, name="learnings"),
        )


def letta_agents(settings: Settings, *, serialize: bool = True) -> Agents:
    """The four roles played by agents on the Letta server (provisioned on first use)."""
    return Agents(
        director=LettaDirector(settings, serialize=serialize),
        writer=LettaWriter(settings, serialize=serialize),
        cameraman=LettaCameraman(settings, serialize=serialize),
        consolidator=LettaConsolidator(settings, serialize=serialize),
    )


# --- core memory blocks on the server ------------------------------------------------------------------


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value)  # the same serialization whose length `blocks.update` caps


class LettaBlockStore:
    """The six core blocks as Letta keeps them: each block's value is its JSON object.

    `read` parses and validates against the block's schema; `update` is a read-modify-write under an
    advisory lock per label (Letta has no compare-and-set), validates the whole new value, refuses it
    over MAS_CORE_BLOCK_MAX_CHARS (never truncates), and writes it back. A block a model edited into
    invalid JSON is reported as a BlockError naming the block, not silently reset.
    """

    def __init__(self, settings: Settings, *, lock: bool = True) -> None:
        self.settings, self.lock = settings, lock

    def _on_block(self, label: str, action: Callable[[str], Any]) -> Any:
        """Run `action(block_id)`; a block deleted on the server is looked up (or provisioned) again once."""
        if label not in SCHEMAS:
            raise BlockError(f"unknown memory block {label!r}; blocks are: {', '.join(SCHEMAS)}")
        for attempt in (1, 2):
            block_id = _crew(self.settings, refresh=attempt == 2).blocks[label]
            try:
                return action(block_id)
            except LettaError as exc:
                if attempt == 1 and isinstance(exc.__cause__, _api().NotFoundError):
                    log.warning("Letta block %s (%s) vanished; looking it up again", label, block_id)
                    continue
                raise
        raise AssertionError("unreachable")

    def _retrieve(self, label: str, block_id: str) -> dict[str, Any]:
        with _translated(f"reading block {label}"):
            return self._parse(label, client(self.settings).blocks.retrieve(block_id).value)

    def read(self, label: str) -> dict[str, Any]:
        return self._on_block(label, lambda block_id: self._retrieve(label, block_id))

    def read_all(self) -> dict[str, dict[str, Any]]:
        return {label: self.read(label) for label in SCHEMAS}

    def update(self, label: str, change: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Set fields (a dict, or a function of the current value returning the fields) and return the new value."""
        if self.lock and label in SCHEMAS:
            with _advisory_lock(self.settings, f"block:{label}", timeout_s=AGENT_LOCK_TIMEOUT_S):
                return self._on_block(label, lambda block_id: self._update(label, block_id, change))
        return self._on_block(label, lambda block_id: self._update(label, block_id, change))

    def _update(self, label: str, block_id: str, change) -> dict[str, Any]:
        api = client(self.settings)
        current = self._retrieve(label, block_id)
        new = apply_change(self.settings, label, current, change)
        text = _dump(new)
        if new != current:
            with _translated(f"writing block {label}"):
                api.blocks.update(block_id, value=text)
        return new

    @staticmethod
    def _parse(label: str, text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BlockError(f"Letta block {label} holds no valid JSON ({exc.msg} at {exc.pos}): {text[:120]!r}") from None
        if not isinstance(value, dict):
            raise BlockError(f"Letta block {label} holds JSON that is not an object")
        try:
            return SCHEMAS[label].model_validate(value).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            raise BlockError(f"Letta block {label}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


# --- status ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CompanionStatus:
    name: str
    id: str
    in_context: int
    autoclear: bool


@dataclass(frozen=True, kw_only=True)
class AgentStatus:
    role: str
    id: str | None
    model: str | None = None
    in_context: int | None = None
    sleeptime_frequency: int | None = None
    group_id: str | None = None
    companions: list[CompanionStatus] = field(default_factory=list)
    block_ids: dict[str, str] = field(default_factory=dict)  # attached mas blocks, label -> id
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LettaStatus:
    """What `mas letta status` shows: server, shared blocks, and each agent."""

    url: str
    healthy: bool
    version: str | None
    blocks: dict[str, str | None]  # label -> block id (None: missing)
    agents: list[AgentStatus]
    error: str | None = None

    @property
    def provisioned(self) -> bool:
        return self.healthy and all(self.blocks.values()) and all(a.id and not a.problems for a in self.agents)


def status(settings: Settings, *, api=None) -> LettaStatus:
    """Server health, shared block ids, and per agent: id, in-context messages, sleeptime frequency and
    companions (with their autoclear flag). Looks only; provisions nothing."""
    from mas.agents.letta_maintenance import health

    api = api or client(settings)
    state = health(settings, api=api)
    if not state.ok:
        return LettaStatus(url=redact_url(settings.letta_url), healthy=False, version=state.version, blocks={}, agents=[], error=state.detail)
    blocks = {label: (found[0].id if found else None) for label, found in _blocks_by_label(api).items()}
    agents = []
    for role in ROLES:
        agent = _find_agent(api, role)
        if agent is None:
            agents.append(AgentStatus(role=role, id=None, problems=["missing: run `mas letta provision`"]))
            continue
        problems = []
        with _translated(f"reading agent {role}"):
            in_context = len(api.agents.retrieve(agent.id).message_ids or [])
        attached = {b.label: b.id for b in (agent.blocks or []) if b.label in SCHEMAS}
        for label, block_id in blocks.items():
            if block_id and attached.get(label) != block_id:
                problems.append(f"block {label} not attached")
        group = _group(agent)
        companions = []
        frequency = None
        if group is None:
            problems.append("sleeptime disabled")
        else:
            frequency = sleeptime_frequency(api, group.id)
            if frequency != settings.sleeptime_frequency:
                problems.append(f"sleeptime frequency {frequency}, settings say {settings.sleeptime_frequency}")
            for sleeptime_id in group.agent_ids:
                with _translated(f"reading sleeptime agent of {role}"):
                    companion = api.agents.retrieve(sleeptime_id)
                companions.append(CompanionStatus(
                    name=companion.name, id=companion.id, in_context=len(companion.message_ids or []),
                    autoclear=bool(companion.message_buffer_autoclear),
                ))
                if not companion.message_buffer_autoclear:
                    problems.append(f"{companion.name}: autoclear off")
        agents.append(AgentStatus(
            role=role, id=agent.id, model=getattr(agent.llm_config, "handle", None) or getattr(agent, "model", None),
            in_context=in_context, sleeptime_frequency=frequency, group_id=group.id if group else None,
            companions=companions, block_ids=attached, problems=problems,
        ))
    return LettaStatus(url=redact_url(settings.letta_url), healthy=True, version=state.version, blocks=blocks, agents=agents)
