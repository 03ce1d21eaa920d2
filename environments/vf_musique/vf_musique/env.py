"""The tool-use loop: a StatefulToolEnv whose tools reach the question's paragraphs through the
rollout state, answer every kind of bad call with an explanation, and stop on a submission."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import verifiers as vf
from verifiers.types import ToolMessage
from verifiers.utils.async_utils import maybe_await

from .messages import ParsedToolCall, tool_calls
from .retrieval import IndexCache, QuestionIndex, Retriever, index_from_info, index_key
from .sampling import DefaultSampling
from .tools import ERROR_PREFIX, ToolUseError, make_retrieve_documents, submit_answer

INJECTED_ARGS = ["state"]


def tool_error(message: str) -> str:
    """Every error reply starts with the same prefix, which the rubric uses to tell errors from
    results (and count them)."""
    return f"{ERROR_PREFIX}{message}"


class MuSiQueEnv(DefaultSampling, vf.StatefulToolEnv):
    """Multi-hop QA: search the question's own paragraphs, then submit one answer with citations."""

    def __init__(
        self,
        retriever: Retriever,
        top_n: int,
        max_tool_calls_per_turn: int,
        index_cache: IndexCache | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(tools=[], **kwargs)
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.index_cache = index_cache or IndexCache()
        for tool in (make_retrieve_documents(self.index_for, retriever, top_n), submit_answer):
            self.add_tool(tool, INJECTED_ARGS)
            self._require_only_arguments_without_defaults(tool)

    def _require_only_arguments_without_defaults(self, tool: Callable[..., Any]) -> None:
        """The schema generator marks every argument required (strict mode); un-require those
        with a default (top_n), so the model may leave them out."""
        schema = next(t.parameters for t in self.tool_defs if t.name == tool.__name__)
        params = inspect.signature(tool).parameters.values()
        defaults = {p.name for p in params if p.default is not inspect.Parameter.empty}
        schema["required"] = [name for name in schema.get("required", []) if name not in defaults]

    def index_for(self, info: dict[str, Any]) -> QuestionIndex:
        """The question's index, built on its first search and reused afterwards."""
        return self.index_cache.get(index_key(info), lambda: index_from_info(info))

    @vf.stop
    async def max_turns_reached(self, state: vf.State) -> bool:
        """The turn limit, but only once the last turn's tool calls have run: the prompt says
        "at most N turns", so a submission in turn N must count (verifiers would stop before
        running it). `env_response` then ends the episode after answering those calls."""
        if not await super().max_turns_reached(state):
            return False
        last_turn = state["trajectory"][-1]["completion"]
        answered = state.get("final_env_response") is not None
        return answered or not any(tool_calls(message) for message in last_turn)

    async def setup_state(self, state: vf.State) -> None:
        state["seen_doc_ids"] = []
        state["submission"] = None

    def update_tool_args(
        self,
        tool_name: str,
        tool_args: dict,
        messages: vf.Messages,
        state: vf.State,
        **kwargs: Any,
    ) -> dict:
        """Hand the tools the rollout state (replacing anything the model sent under that name)."""
        return {**tool_args, "state": state}

    def _argument_problem(self, name: str, args: dict[str, Any]) -> str | None:
        """Unknown or missing argument names, checked against the schema the model was shown."""
        schema = next(t.parameters for t in self.tool_defs if t.name == name)
        allowed = set(schema.get("properties", {}))
        unknown = sorted(set(args) - allowed)
        missing = sorted(set(schema.get("required", [])) - set(args))
        if unknown:
            return f"{name} got unknown argument(s) {unknown}; its arguments are {sorted(allowed)}"
        if missing:
            return f"{name} is missing required argument(s) {missing}"
        return None

    async def _reply(
        self, call: ParsedToolCall, position: int, messages: vf.Messages, state: vf.State
    ) -> str:
        """The tool message content for one call: the tool's result or an explained error."""
        if state.get("submission") is not None:
            return tool_error("the answer was already submitted; this call was ignored")
        if position >= self.max_tool_calls_per_turn:
            return tool_error(
                f"too many tool calls in one turn (at most {self.max_tool_calls_per_turn}); "
                "this call was ignored"
            )
        if call.name not in self.tool_map:
            return tool_error(
                f"unknown tool {call.name!r}; available tools: {sorted(self.tool_map)}"
            )
        try:
            args = json.loads(call.arguments or "{}")
        except (ValueError, RecursionError) as err:  # also 5,000-digit numbers, deep nesting
            return tool_error(
                f"arguments of {call.name} are not valid JSON ({type(err).__name__}: "
                f"{str(err)[:200]}); send a flat JSON object"
            )
        if not isinstance(args, dict):
            return tool_error(
                f"arguments of {call.name} must be a JSON object, got {type(args).__name__}"
            )
        problem = self._argument_problem(call.name, args)
        if problem:
            return tool_error(problem)
        tool_args = self.update_tool_args(call.name, args, messages, state)
        try:
            return str(await maybe_await(self.tool_map[call.name], **tool_args))
        except ToolUseError as err:
            return tool_error(str(err))
        except Exception as err:  # a tool bug must not end the rollout; say what happened
            self.logger.exception("tool %s failed", call.name)
            return tool_error(f"{call.name} failed: {type(err).__name__}: {err}")

    async def env_response(
        self, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> vf.Messages:
        """One tool message per call, in order; a valid submission, or the last turn's calls,
        end the episode."""
        calls = tool_calls(messages[-1])
        replies: vf.Messages = [
            ToolMessage(
                role="tool",
                content=await self._reply(call, position, messages, state),
                tool_call_id=call.id,
            )
            for position, call in enumerate(calls)
        ]
        last_turn = await super().max_turns_reached(state)
        if state.get("submission") is not None or last_turn:
            state["final_env_response"] = replies
        return replies
