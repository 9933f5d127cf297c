"""Tokenizer (Hugging Face folders and GGUF metadata) and chat templates.

May import: nothing of batchgen's but this package.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = [
    "ChatOptions",
    "ChatTemplateError",
    "Tokenizer",
    "render_chat",
    "render_chat_template",
    "validate_messages",
]

__getattr__ = lazy_getattr(
    __name__,
    {
        "Tokenizer": "tokenizer",
        "ChatOptions": "chat_options",
        "render_chat": "chat_options",
        "ChatTemplateError": "chat_template",
        "render_chat_template": "chat_template",
        "validate_messages": "chat_template",
    },
)
