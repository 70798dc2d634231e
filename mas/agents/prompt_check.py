"""A prompt the studio's checks cannot read (another language, another phrasing) or cannot tell, checked by
the model.

The studio's own checks read English (`mas.agents.style_check`). For any other prompt the model that wrote
it is asked one short structured question: which ruled-out items does it show, which liked ones does it
miss. An English prompt the checks pass but are not sure of (a ruled-out item the rules do not find but a
clause near it, from `style_check.ASK_SIMILARITY`, or a theme the prompt is about) gets the same question of those items only: the rest the
studio has read. The answer, naming only items of the lists it was given, is the check; without a valid
answer the prompt stays unchecked, and says so.
"""

from __future__ import annotations

from typing import Protocol

from mas.agents import style_check
from mas.agents.protocol import Question, Reply
from mas.agents.replies import NoValidReply, PromptStyleReply
from mas.agents.style import Style
from mas.agents.style_check import Meaning, StyleCheck

CHECK_TOKENS = 120
"""Most tokens of a `check_style` reply: a few items named back."""

CHECK_SHAPE = '{"shows_ruled_out": [str], "misses_liked": [str]}'
CHECK_RULES = (
    "shows_ruled_out: each ruled_out item the prompt shows, in any language or other words; misses_liked: each "
    "liked item the prompt does not carry; name items exactly as the lists give them; empty lists when none."
)


class Asker(Protocol):
    """One agent (`mas.agents.asking.Asker`): sends a question, returns its reply validated."""

    def ask(self, question: Question[Reply]) -> Reply: ...


def checked(
    asker: Asker, prompt: str, style: Style, meaning: Meaning | None = None, *, video_id: int | None = None
) -> StyleCheck:
    """The studio's check of `prompt`; where it cannot read the prompt or tell, the model's (`by="model"`),
    and where the model gives no valid answer, unchecked."""
    own = style_check.check(prompt, style, meaning, asking=True)
    if own.checked:
        return own
    if own.unsure:  # read and passed by the rules but for these items: only they are asked
        liked, ruled_out = [], own.unsure
    else:
        liked = [i.words for i in style.liked if i.aspect in style_check.REQUIRED_ASPECTS]
        ruled_out = [i.words for i in style.ruled_out]
    try:
        reply: PromptStyleReply = asker.ask(
            Question(
                task="check_style",
                payload={"prompt": prompt, "liked": liked, "ruled_out": ruled_out},
                shape=CHECK_SHAPE,
                reply=PromptStyleReply,
                rules=CHECK_RULES,
                context={"liked": {w.lower() for w in liked}, "ruled_out": {w.lower() for w in ruled_out}},
                video_id=video_id,
                max_tokens=CHECK_TOKENS,
                alone=True,
            )
        )
    except NoValidReply:
        return own
    return StyleCheck(
        by="model",
        unsure=own.unsure,
        missing=[w for w in liked if w.lower() in {t.strip().lower() for t in reply.misses_liked}],
        disliked=[w for w in ruled_out if w.lower() in {t.strip().lower() for t in reply.shows_ruled_out}],
    )
