"""A multi-turn chat kept in one Session: the cache is never reset between turns.

Each turn appends only what it adds to the rendered conversation (the model's chat template):
the text that closes the previous reply (e.g. "<|im_end|>\n", minus the end-of-turn token the
model itself produced) and the new user turn up to the assistant's header. The history is never
re-rendered or re-read, so a chat of any length costs what its new tokens cost, and a
compressing cache keeps it in constant memory.
"""
from __future__ import annotations

from typing import Callable, Optional

from core.errors import UserError
from engine.runtime.generation import Generation, Session


class Chat:
    def __init__(self, session: Session, tokenizer, system: Optional[str] = None):
        self.session, self.tokenizer, self.system = session, tokenizer, system
        self.reset()

    def reset(self) -> None:
        """Forget the conversation and empty the session."""
        self.session.reset()
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.rendered = ""  # the rendered conversation, as far as the session has read it
        self.carry = ""  # rendered text the session has not read yet (the end of the last turn)

    def _render(self, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(self.messages,
                                                  add_generation_prompt=add_generation_prompt)

    def turn(self, text: str, max_new_tokens: int, temperature: float = 0.0,
             top_k: Optional[int] = None, callback: Optional[Callable[[int], None]] = None
             ) -> tuple[str, Generation]:
        """Append the user's `text` and generate the reply; returns (reply text, generation).

        Raises:
            UserError: an empty turn, or a chat template that rewrites earlier turns.
        """
        if not text.strip():
            raise UserError("the turn is empty; type a message")
        self.messages.append({"role": "user", "content": text})
        target = self._render(add_generation_prompt=True)
        if not target.startswith(self.rendered):
            self.messages.pop()
            raise UserError("this chat template rewrites earlier turns when one is added, so a "
                            "turn cannot be appended to the session; start over with /reset")
        ids = self.tokenizer.encode(self.carry + target[len(self.rendered):], bos=False)
        try:
            self.session.append(ids)
        except UserError:  # nothing was read (e.g. the context is full): the turn never happened
            self.messages.pop()
            raise
        eos = set(self.tokenizer.eos_ids)
        g = self.session.generate(max_new_tokens, temperature, top_k, eos_ids=eos,
                                  callback=callback)
        new = g.new_ids[0]
        reply = self.tokenizer.decode([t for t in new if t not in eos])
        self.messages.append({"role": "assistant", "content": reply})
        before = target + reply
        self.rendered = self._render(add_generation_prompt=False)
        # What the template writes after the reply; the model's own end-of-turn token is in the
        # session already (pending), the rest is read with the next turn.
        tail = self.rendered[len(before):] if self.rendered.startswith(before) else ""
        end = self.tokenizer.eos_token or ""
        if new and new[-1] in eos and end and tail.startswith(end):
            tail = tail[len(end):]
        self.carry = tail
        return reply, g
