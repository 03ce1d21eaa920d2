"""The ChatML chat template with hermes-style tool calls used by the embedded and tiny models.

vLLM's `hermes` tool parser reads `<tool_call>{json}</tool_call>` from generated text, so the
template must both advertise tools in that format and render past tool calls and tool results the
same way, or multi-turn prompts would teach the model a format the parser cannot read.
"""

TOOL_CHAT_TEMPLATE = (
    # Written with explicit '\n' strings: HF renders templates with trim_blocks/lstrip_blocks,
    # which would otherwise eat the newlines that follow block tags.
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable -%}"
    "{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set has_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{{- text(messages[0].content) if has_system else 'You are a helpful assistant.' -}}"
    "{{- '\\n\\n# Tools\\n\\nYou can call functions to help with the request. '"
    "'Their signatures are inside <tools></tools>:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool.function if tool.function is defined else tool) | tojson -}}{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- '</tools>\\n\\nTo call a function, answer with one JSON object per call inside '"
    "'<tool_call></tool_call> tags:\\n<tool_call>\\n'"
    '\'{"name": "<function-name>", "arguments": {<arguments>}}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and has_system -%}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{- '<|im_start|>user\\n' -}}"
    "{%- endif -%}"
    "{{- '<tool_response>\\n' + text(message.content) + '\\n</tool_response>\\n' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.content -%}{{- text(message.content) -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{{- fn.arguments if fn.arguments is string else fn.arguments | tojson -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
