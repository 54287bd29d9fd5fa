"""The prompts a probe sends: a JSONL file (one object a line: `prompt`, or `messages` for --chat, and an optional
`group`), or a small built-in set of varied prompts. α depends on the text as much as on the temperature: a probe
is only as good as its prompts are like the production traffic."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_GROUP = "all"
MAX_GROUP_LENGTH = 64
MAX_PROMPTS = 100_000
ROLES = ("system", "user", "assistant", "developer", "tool")


class PromptsError(ValueError):
    """A bad prompts file: one line naming the file and the line."""


@dataclass(frozen=True, slots=True)
class Prompt:
    group: str
    text: str | None  # a completion prompt
    messages: tuple[tuple[str, str], ...] | None  # (role, content) for chat

    def payload(self, chat: bool) -> dict[str, Any]:
        """The prompt part of a request body: `prompt` for /v1/completions, `messages` for chat."""
        if chat:
            messages = self.messages if self.messages is not None else (("user", self.text or ""),)
            return {"messages": [{"role": role, "content": content} for role, content in messages]}
        return {"prompt": self.text or ""}


# A few prompts per kind. Code and copy-heavy prompts repeat their context (drafts from prompt lookup, EAGLE and
# draft models accept well there); open chat accepts least; summaries sit between.
BUILTIN: dict[str, tuple[str, ...]] = {
    "code": (
        "Complete this Python function and add a docstring:\n\ndef parse_duration(text: str) -> float:\n"
        "    \"\"\"\n",
        "Write a Python class `LRUCache` with `get(key)` and `put(key, value)` methods in O(1) time, with type "
        "hints and a short test.",
        "Convert this JavaScript to TypeScript with types:\n\nfunction sum(items) {\n  let total = 0;\n"
        "  for (const item of items) {\n    total += item.price * item.quantity;\n  }\n  return total;\n}\n",
    ),
    "chat": (
        "I'm planning a three-day trip to Lisbon in spring. What should I see, and where should I eat?",
        "Explain to a twelve-year-old why the sky is blue, in a friendly tone.",
        "Write a short poem about a lighthouse keeper who talks to the sea.",
    ),
    "summarization": (
        "Summarize in three sentences: Speculative decoding speeds up text generation by letting a small draft "
        "model propose several tokens that the large target model then verifies in a single forward pass. When "
        "the draft's proposals are accepted often, the target produces several tokens per step and latency "
        "falls. When they are rejected, the verification work is wasted and latency rises. The acceptance rate "
        "depends on the task, the sampling temperature and how well the draft matches the target.",
        "Summarize the key points of this meeting note: The team agreed to move the release to Thursday. QA "
        "found two regressions in the checkout flow; both have fixes under review. Marketing needs the final "
        "screenshots by Tuesday noon. The on-call rotation changes next week: Dana takes over from Sam.",
        "Give a one-paragraph summary of the plot of Romeo and Juliet.",
    ),
    "copy-heavy": (
        "Repeat the following list exactly, then sort it alphabetically:\napple, banana, cherry, date, elderberry, "
        "fig, grape, honeydew, kiwi, lemon, mango, nectarine, orange, papaya, quince, raspberry",
        "Rewrite this JSON with the key \"status\" changed to \"state\" and nothing else changed:\n"
        "{\"id\": 17, \"status\": \"open\", \"owner\": \"dana\", \"labels\": [\"bug\", \"checkout\"], "
        "\"created\": \"2025-03-02T10:15:00Z\", \"comments\": 4, \"status_reason\": \"new\"}",
        "Fix the typos and return the corrected text in full:\nTeh quick brown fox jumpd over the lazy dog. Teh "
        "dog did not mvoe. Teh fox ran into the forrest and was never seen agian.",
    ),
}


def builtin_prompts() -> list[Prompt]:
    return [Prompt(group, text, None) for group, texts in BUILTIN.items() for text in texts]


def load_prompts(path: str | Path, chat: bool) -> list[Prompt]:
    """Read a JSONL prompts file; raises PromptsError naming the line."""
    where = f"--prompts {path}"
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptsError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PromptsError(f"{where}: not UTF-8 text") from None
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(prompts) >= MAX_PROMPTS:
            raise PromptsError(f"{where}: more than {MAX_PROMPTS} prompts")
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptsError(f"{where}: line {number}: not JSON ({exc.msg})") from None
        prompts.append(_prompt(item, chat, f"{where}: line {number}"))
    if not prompts:
        raise PromptsError(f"{where}: no prompts (expected one JSON object a line with \"prompt\" or \"messages\")")
    return prompts


def _prompt(item: Any, chat: bool, where: str) -> Prompt:
    if not isinstance(item, Mapping):
        raise PromptsError(f"{where}: expected a JSON object with \"prompt\" or \"messages\"")
    group = item.get("group", DEFAULT_GROUP)
    if not isinstance(group, str) or not group.strip() or len(group) > MAX_GROUP_LENGTH \
            or not group.isprintable():
        raise PromptsError(f"{where}: group: expected a printable string of 1-{MAX_GROUP_LENGTH} characters, "
                           f"got {group!r}")
    text = item.get("prompt")
    if text is not None and (not isinstance(text, str) or not text):
        raise PromptsError(f"{where}: prompt: expected a non-empty string")
    messages = _messages(item.get("messages"), where) if "messages" in item else None
    if text is None and messages is None:
        raise PromptsError(f"{where}: expected \"prompt\"" + (" or \"messages\"" if chat else ""))
    if not chat and text is None:
        raise PromptsError(f"{where}: has \"messages\" but no \"prompt\": pass --chat for /v1/chat/completions")
    return Prompt(group.strip(), text, messages)


def _messages(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise PromptsError(f"{where}: messages: expected a non-empty list of {{\"role\", \"content\"}} objects")
    out: list[tuple[str, str]] = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if role not in ROLES or not isinstance(content, str):
            raise PromptsError(f"{where}: messages[{i}]: expected {{\"role\": one of {', '.join(ROLES)}, "
                               "\"content\": a string}")
        out.append((str(role), content))
    return tuple(out)


def by_group(prompts: Sequence[Prompt]) -> dict[str, list[Prompt]]:
    """Prompts per group, groups in order of first appearance."""
    groups: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.group, []).append(prompt)
    return groups
