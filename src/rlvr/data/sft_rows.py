"""SFT data: rows of .jsonl/.json/.parquet files -> conversations -> token samples whose loss
mask covers exactly what the model says. `read_conversations` checks every row first (naming
file and 1-based row), so bad data fails before a model loads; `tokenize` renders with the chat
template and masks. Templates that rewrite earlier turns are reported, not guessed around.
Design: docs/training.md#the-sft-loss-mask.
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.batch import Sample
from rlvr.config import SFTDataConfig

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """Unusable SFT data; the message names the file and the 1-based row."""


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    where: str
    """`row N of FILE`, for error messages."""
    tools: list[dict[str, Any]] | None = None
    """Tool definitions offered in this conversation (OpenAI function form), rendered by the
    chat template as at inference."""


@dataclass
class Example:
    sample: Sample
    truncated: bool


@dataclass
class DataStats:
    """What tokenization did to a split; logged, so no example disappears silently."""

    rows: int = 0
    examples: int = 0
    truncated: int = 0
    """Longer than max_seq_len, cut to it (still trained on)."""
    dropped: int = 0
    """Longer than max_seq_len with truncation=drop, or no assistant token within it."""
    tokens: int = 0
    loss_tokens: int = 0
    dropped_rows: list[str] = field(default_factory=list)

    def metrics(self, split: str) -> dict[str, float]:
        return {
            f"data/{split}_rows": self.rows,
            f"data/{split}_examples": self.examples,
            f"data/{split}_truncated": self.truncated,
            f"data/{split}_dropped": self.dropped,
            f"data/{split}_loss_tokens": self.loss_tokens,
        }

    def summary(self, split: str, max_seq_len: int) -> str:
        text = (
            f"{split}: {self.examples} examples from {self.rows} rows, {self.tokens} tokens "
            f"({self.loss_tokens} with loss); {self.truncated} truncated to {max_seq_len} "
            f"tokens, {self.dropped} dropped as too long"
        )
        if self.dropped_rows:
            text += f" (first: {', '.join(self.dropped_rows[:3])})"
        return text


# ---- reading rows ------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of one data file, read with `datasets`."""
    import datasets

    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    builder = FORMATS.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"data file {path}: use .jsonl, .json or .parquet, not {path.suffix!r}")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train").to_list()
    except Exception as e:  # datasets wraps parse errors in several types
        raise DataError(f"data file {path} could not be read: {e}") from e


def read_conversations(files: list[str], cfg: SFTDataConfig) -> list[Conversation]:
    """Every row of `files` as a checked conversation, in file order."""
    out = []
    columns = _columns(cfg)
    for file in files:
        rows = read_rows(file)
        if rows:
            missing = [c for c in columns if c not in rows[0]]
            if missing:
                raise DataError(
                    f"row 1 of {file} has no column {missing[0]!r} (its columns: "
                    f"{', '.join(rows[0])}); set data.format and data.*_column"
                )
        for number, row in enumerate(rows, start=1):
            where = f"row {number} of {file}"
            tools = to_tools(row.get(cfg.tools_column), where)
            out.append(Conversation(to_messages(row, cfg, where), where, tools))
    return out


def _columns(cfg: SFTDataConfig) -> list[str]:
    if cfg.format == "messages":
        return [cfg.messages_column]
    return [cfg.prompt_column, cfg.completion_column]


def to_messages(row: dict[str, Any], cfg: SFTDataConfig, where: str) -> list[dict[str, Any]]:
    """The row's conversation in chat-message form, checked."""
    if cfg.format == "messages":
        messages = _message_list(_column(row, cfg.messages_column, where), where, "user")
    else:
        prompt = _message_list(_column(row, cfg.prompt_column, where), where, "user")
        completion = _message_list(_column(row, cfg.completion_column, where), where, "assistant")
        messages = prompt + completion
    if cfg.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    return messages


def to_tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    """The row's tool definitions in OpenAI's `{"type": "function", ...}` form, what a chat
    template sees at inference, from that form, verifiers' saved `{name, description,
    parameters}` or either as JSON strings."""
    if value is None or (isinstance(value, list) and not value):
        return None
    if not isinstance(value, list):
        raise DataError(f"{where}: tools must be a list of tool definitions, got {value!r:.200}")
    tools = []
    for i, tool in enumerate(value, start=1):
        try:
            tool = json.loads(tool) if isinstance(tool, str) else tool
        except json.JSONDecodeError as e:
            raise DataError(f"{where}, tool {i}: not valid JSON ({e})") from None
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(f"{where}, tool {i}: expected a function definition with a name")
        clean = {k: v for k, v in function.items() if v is not None}
        tools.append({"type": "function", "function": clean})
    return tools


def _column(row: dict[str, Any], name: str, where: str) -> Any:
    value = row.get(name)
    if value is None:
        raise DataError(f"{where} has no value in column {name!r}")
    return value


def _message_list(value: Any, where: str, text_role: str) -> list[dict[str, Any]]:
    """A string becomes one `text_role` message; a list must hold chat messages."""
    if isinstance(value, str):
        return [{"role": text_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: expected a string or a non-empty list of messages")
    return [_message(m, f"{where}, message {i}") for i, m in enumerate(value, start=1)]


def _message(message: Any, where: str) -> dict[str, Any]:
    """A clean copy: without the None fields that Arrow adds to unify message schemas, and
    with tool calls saved as JSON strings (as verifiers writes them) parsed back."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise DataError(f"{where}: expected a {{role, content}} mapping, got {message!r:.200}")
    clean = {k: v for k, v in message.items() if v is not None}
    calls = clean.get("tool_calls")
    if calls:
        try:
            clean["tool_calls"] = [json.loads(c) if isinstance(c, str) else c for c in calls]
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: a tool call is not valid JSON ({e})") from None
    if "content" not in clean and not calls:
        raise DataError(f"{where}: the {clean['role']} message has no content")
    return clean


# ---- tokenizing and masking -----------------------------------------------------------------


def assistant_mask(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    where: str,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of the whole conversation (docs/training.md#the-sft-loss-mask)."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("SFT needs a fast tokenizer (token offsets locate assistant turns)")
    full = _render(tokenizer, messages, False, where, tools)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, where, tools)
        through = _render(tokenizer, messages[: i + 1], False, where, tools)
        if not (through.startswith(before) and full.startswith(through)):
            raise DataError(
                f"{where}: the chat template does not render this conversation incrementally "
                f"(turn {i + 1} changes earlier text), so assistant tokens cannot be located"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    starts = [start for start, _ in encoded["offset_mapping"]]
    mask = [0] * len(ids)
    for begin, end in spans:
        inside = range(bisect.bisect_left(starts, begin), bisect.bisect_left(starts, end))
        stops = [t for t in inside if ids[t] == tokenizer.eos_token_id]
        for t in inside[: inside.index(stops[-1]) + 1] if stops else inside:
            mask[t] = 1
    return ids, mask


def _render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    prompt: bool,
    where: str,
    tools: list[dict[str, Any]] | None,
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=prompt
        )
    except Exception as e:  # jinja raises its own errors for conversations it rejects
        raise DataError(f"{where}: the chat template rejects this conversation: {e}") from e


def tokenize(
    conversations: list[Conversation], tokenizer: Any, cfg: SFTDataConfig
) -> tuple[list[Example], DataStats]:
    """Render, mask and fit every conversation to max_seq_len (or drop it), counting both."""
    stats = DataStats(rows=len(conversations))
    examples = []
    for conversation in conversations:
        ids, mask = assistant_mask(
            tokenizer, conversation.messages, conversation.where, conversation.tools
        )
        truncated = len(ids) > cfg.max_seq_len
        if truncated and cfg.truncation == "truncate":
            ids, mask = ids[: cfg.max_seq_len], mask[: cfg.max_seq_len]
        if (truncated and cfg.truncation == "drop") or not any(mask):
            stats.dropped += 1
            stats.dropped_rows.append(conversation.where)
            continue
        stats.examples += 1
        stats.truncated += truncated
        stats.tokens += len(ids)
        stats.loss_tokens += sum(mask)
        examples.append(Example(Sample(ids, mask, [0.0] * len(ids)), truncated))
    return examples, stats


# ---- order -------------------------------------------------------------------------------


class EpochOrder:
    """The training stream: epoch after epoch of the rows, each in its own seeded order.

    Position k of the stream is row `order(k // n)[k % n]`, so a step is fully described by
    the stream position it starts at, and a resumed run continues with the same rows."""

    def __init__(self, num_rows: int, seed: int):
        self.n = num_rows
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            rows = list(range(self.n))
            random.Random(f"{self.seed}:{epoch}").shuffle(rows)
            self._orders = {epoch: rows}  # one epoch is read at a time
        return self._orders[epoch]

    def take(self, position: int, count: int) -> list[int]:
        return [self.order(k // self.n)[k % self.n] for k in range(position, position + count)]
