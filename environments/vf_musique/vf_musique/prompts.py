"""The system prompt: what the model is told about the task and the tools."""

from __future__ import annotations

from .dataset import UNANSWERABLE, DatasetConfig


def system_prompt(dataset_config: DatasetConfig, max_turns: int) -> str:
    """Instructions: search hop by hop, then one short answer with citations."""
    unanswerable = (
        " If, after searching for every hop on its own (a query for that hop alone, not the "
        "whole question), the documents do not contain what the question "
        f'needs, submit "{UNANSWERABLE}", citing the documents that support the hops you '
        "could answer."
        if dataset_config == "full"
        else ""
    )
    return (
        "Answer the multi-hop question using only the documents you can search with the tools. "
        "Call retrieve_documents with a short query for one fact (one hop) at a time, and use "
        "what you learn to write the next query. When you know the answer, call submit_answer "
        "once with a single short answer (a name, date, number or phrase; not a sentence or a "
        "list of candidates) and the IDs of the documents that support each hop."
        f"{unanswerable} You have at most {max_turns} turns."
    )
