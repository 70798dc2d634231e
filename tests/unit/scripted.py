"""`Scripted`: an in-process asker for the roles' tests. It answers each question with a given reply and
validates it exactly as the llm and Letta backends do (the reply model with the question's context); a
stand-in for a model's transport, not a model."""

from __future__ import annotations

from mas.agents.protocol import Question
from mas.agents.replies import NoValidReply


class Scripted:
    """Answers each question with the next scripted reply, validated as a backend validates it; a reply
    that fails validation is asked again with the next one, and the last failure ends in NoValidReply."""

    def __init__(self, *replies: object, tries: int = 2) -> None:
        self.replies, self.tries, self.asked = list(replies), tries, []

    def ask(self, question: Question):
        errors = []
        for _ in range(self.tries):
            self.asked.append(question)
            reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            try:
                return question.reply.model_validate(reply, context=question.context)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                errors.append(str(exc))
        raise NoValidReply(errors[-1])
