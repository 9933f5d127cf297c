"""Tokenizer (Hugging Face folders and GGUF metadata) and chat templates.

May import: nothing of batchgen's but this package.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = ["ChatTemplateError", "Tokenizer", "render_chat_template", "validate_messages"]

__getattr__ = lazy_getattr(
    __name__,
    {
        "Tokenizer": "tokenizer",
        "ChatTemplateError": "chat_template",
        "render_chat_template": "chat_template",
        "validate_messages": "chat_template",
    },
)
