"""A Messages request's tools as OpenAI function tools, with the tool changes its system
messages make. Pure: no I/O.

- `tools` -> function tools (`input_schema` -> `parameters`); a server tool (a `type`
  other than "custom", e.g. `web_search_20250305`, `bash_20250124`) is refused: the
  backend cannot run it. `strict` and `defer_loading` have no place in a chat tool and
  are dropped (a deferred tool is declared like any other).
- Tool changes, as vLLM 0.33 applies them (`vllm/entrypoints/anthropic/protocol.py`,
  `AnthropicContentBlock` / `AnthropicToolChange*`; `vllm/entrypoints/anthropic/serving.py`,
  `_resolve_tools`): a `tool_addition` or `tool_removal` block is allowed only in a message
  of role `system`, and carries `tool`: a
  `tool_reference` (`{"type": "tool_reference", "name"}`) or, for an addition only, a
  `tool_definition` (`{"type": "tool_definition", "definition": <a tool>}`). A chat
  template sees one tool list, so the changes are applied in the order they come, to
  `tools`, and the list in effect at the end of the conversation is sent: a definition
  adds the tool (or replaces the one of that name, in its place), a reference must name a
  declared tool (else 400, vLLM's wording), a removal drops it and a later addition brings
  it back. Tools keep their declared order; added ones follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from app.anthropic.checks import invalid, required_str, unsupported
from app.errors import InvalidRequest

Json = dict[str, Any]

TOOL_CHANGES: Final = ("tool_addition", "tool_removal")
_CUSTOM_TOOL_TYPES: Final = (None, "custom")


@dataclass(frozen=True, slots=True)
class ToolChange:
    kind: Literal["tool_addition", "tool_removal"]
    name: str
    definition: Json | None  # the function tool a `tool_definition` declares
    param: str


def openai_tools(value: object) -> list[Json]:
    """The request's `tools` as function tools; raises `InvalidRequest` (400)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest.wrong_type("tools", "an array", value)
    return [_function_tool(tool, f"tools[{i}]") for i, tool in enumerate(value)]


def tool_change(block: Json, param: str) -> ToolChange:
    """A `tool_addition` / `tool_removal` block of a system message, validated."""
    kind = block["type"]
    tool = block.get("tool")
    if tool is None:
        raise InvalidRequest(
            f"Missing required parameter: '{param}.tool' (tool is required for {kind} blocks).",
            param=f"{param}.tool",
        )
    if not isinstance(tool, dict):
        raise InvalidRequest.wrong_type(f"{param}.tool", "an object", tool)
    tool_type = tool.get("type")
    if tool_type == "tool_reference":
        name = required_str(tool, "name", f"{param}.tool")
        return ToolChange(kind, name, None, param)
    if tool_type == "tool_definition" and kind == "tool_addition":
        definition = _function_tool(tool.get("definition"), f"{param}.tool.definition")
        return ToolChange(kind, definition["function"]["name"], definition, param)
    if tool_type == "tool_definition":
        raise invalid(f"{param}.tool.type", "tool_removal only accepts a tool_reference")
    raise invalid(
        f"{param}.tool.type",
        f"Invalid '{param}.tool.type': expected 'tool_reference' or 'tool_definition', "
        f"got {tool_type!r}.",
    )


def with_tool_changes(tools: list[Json], changes: list[ToolChange]) -> list[Json]:
    """`tools` (function tools) as `changes` leave them (module docstring)."""
    if not changes:
        return tools
    by_name = {tool["function"]["name"]: tool for tool in tools}
    removed: set[str] = set()
    for change in changes:
        if change.definition is not None:
            by_name[change.name] = change.definition
        elif change.name not in by_name:
            raise invalid(
                f"{change.param}.tool.name",
                f"{change.kind} references tool {change.name!r}, which is not declared in tools",
            )
        if change.kind == "tool_removal":
            removed.add(change.name)
        else:
            removed.discard(change.name)
    return [tool for name, tool in by_name.items() if name not in removed]


def _function_tool(tool: object, param: str) -> Json:
    if not isinstance(tool, dict):
        raise InvalidRequest.wrong_type(param, "an object", tool)
    if tool.get("type") not in _CUSTOM_TOOL_TYPES:
        raise unsupported(
            "tools",
            f"Server tools are not supported here: '{param}' has type {tool.get('type')!r}.",
        )
    function: Json = {"name": required_str(tool, "name", param)}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidRequest.wrong_type(f"{param}.description", "a string", description)
        function["description"] = description
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise InvalidRequest.wrong_type(f"{param}.input_schema", "an object", schema)
    function["parameters"] = schema
    return {"type": "function", "function": function}
