"""Chat templates written in the shapes of four model families, two that re-render history and two that write tool
calls themselves (Qwen3-Coder's XML, Llama 3.1's JSON), for the tiny test tokenizer (`with_family_tokens` adds the special tokens they need to a copy of it)."""

import copy

LLAMA3 = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{%- set content = message.content %}"
    "{%- if loop.first and role == 'system' and tools %}"
    "{%- set content = content + '\\n\\nTools:' %}{%- for t in tools %}{%- set content = content + '\\n' + (t | tojson) %}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- '<s>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- '[SYSTEM_PROMPT]' + message.content + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- elif message.role == 'assistant' %}{{- message.content + '</s>' }}"
    "{%- else %}{{- raise_exception('Only system, user, assistant and tool roles are supported') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

GEMMA = (
    "{{- '<bos>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- '<start_of_turn>user\\n' + message.content + '\\n\\n' }}"
    "{%- elif message.role == 'user' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'system' %}{{- '<start_of_turn>user\\n' }}{%- endif %}"
    "{{- message.content + '<end_of_turn>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<start_of_turn>user\\n' + message.content + '<end_of_turn>\\n' }}"
    "{%- else %}{{- '<start_of_turn>model\\n' + message.content + '<end_of_turn>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

DEEPSEEK = (
    "{{- '<｜begin▁of▁sentence｜>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- message.content }}"
    "{%- elif message.role == 'user' %}{{- '<｜User｜>' + message.content }}"
    "{%- elif message.role == 'assistant' %}{{- '<｜Assistant｜>' + message.content + '<｜end▁of▁sentence｜>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message.content + '<｜tool▁output▁end｜><｜tool▁outputs▁end｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}"
)

FAMILIES = {
    "llama3": (LLAMA3, "<|eot_id|>"),
    "mistral": (MISTRAL, "</s>"),
    "gemma": (GEMMA, "<end_of_turn>"),
    "deepseek": (DEEPSEEK, "<｜end▁of▁sentence｜>"),
}

# Qwen3-like: an assistant turn that is not the last message loses its <think>...</think> (history re-rendered)
STRIPS_REASONING = (
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- set role = 'user' if message.role == 'tool' else message.role %}"
    "{{- '<|im_start|>' + role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ChatML that writes no newline between an assistant turn and a tool turn once the tool turn exists
DROPS_SEPARATOR = (
    "{%- for message in messages %}"
    "{%- set role = 'user' if message.role == 'tool' else message.role %}"
    "{{- '<|im_start|>' + role + '\\n' + message.content + '<|im_end|>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Templates that write tool calls themselves from `tool_calls` (chat.tool_format=template). Qwen3-Coder's shape: the
# content trimmed between newlines, each call as <tool_call>/<function=...>/<parameter=...> XML (mappings as JSON)
QWEN3_CODER = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content and message.content | trim | length > 0 %}{{- '\n' + message.content | trim + '\n' }}{%- endif %}"
    "{%- for tc in message.tool_calls %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{{- '\n<tool_call>\n<function=' + tc.name + '>\n' }}"
    "{%- for k, v in tc.arguments | items %}"
    "{{- '<parameter=' + k + '>\n' + (v | tojson if v is mapping or (v is sequence and v is not string) else v | string) + '\n</parameter>\n' }}"
    "{%- endfor %}{{- '</function>\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# Llama 3.1's shape: each call a JSON object {"name", "parameters"} after <|python_tag|>, tool results as ipython
LLAMA31 = LLAMA3.replace(
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + content | trim + '<|eot_id|>' }}",
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + content | trim }}"
    "{%- for tc in message.tool_calls or [] %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{{- '<|python_tag|>{\"name\": \"' + tc.name + '\", \"parameters\": ' + tc.arguments | tojson + '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}",
)
assert LLAMA31 != LLAMA3

TOKENS = [
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    "<bos>", "<start_of_turn>", "<end_of_turn>",
    "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>",
    "<|python_tag|>",
]  # fmt: skip


def with_family_tokens(tokenizer, template: str):
    """A copy of the tiny tokenizer with every family's special tokens and `template` as its chat template."""
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(TOKENS, special_tokens=True)
    tok.chat_template = template
    return tok
