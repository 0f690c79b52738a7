"""Word + character tokenizer for the ELMo-style BiLM (SesameElmo).

It lives beside its model, as transformers' ``tokenization_<model>.py`` files do, and serves the classic baselines
(:mod:`modeling.baselines`) too. Self-contained on purpose (imports only the standard library, ``tokenizers`` and
``transformers``): ``save_pretrained`` copies this file next to the vocabulary (``tokenization_elmo.py``, named in
``tokenizer_config.json``'s ``auto_map``), so a user without sesame-lm can load it with
``AutoTokenizer.from_pretrained(path, trust_remote_code=True)``. Folders saved before the move carry the same code
as ``elmo_tokenization.py`` and still load, in-process or as remote code. The vocabulary *trainer* stays in
:mod:`tokenizer.elmo_training`.

What it returns (``tokenizer(text)`` / ``tokenizer(text_a, text_b)``):

* ``input_ids`` -- word ids (the BiLM targets). Each sentence is wrapped in ``<S>`` ... ``</S>``, as in
  bilm-tf. Out-of-vocabulary words get ``<UNK>``'s id but keep their own characters.
* ``char_ids`` -- ``(tokens, 50)`` per sequence (``(batch, tokens, 50)`` when batched): ELMo's character
  ids, exactly those of AllenNLP's ``ELMoCharacterMapper`` (bilm-tf's ``UnicodeCharsVocabulary`` + 1):

  ====================  ==========  ==================================================
  symbol                bilm-tf id  id here (= bilm-tf + 1; 0 is kept for masked tokens)
  ====================  ==========  ==================================================
  UTF-8 byte ``b``      ``b``       ``b + 1``  (1 ... 256)
  begin of sentence     256         257   (the only character of ``<S>``)
  end of sentence       257         258   (the only character of ``</S>``)
  begin of word         258         259
  end of word           259         260
  padding character     260         261
  masked (pad) token    --          0     (all 50 ids of a padding token)
  ====================  ==========  ==================================================

  A word is ``[bow, byte_1, ..., byte_n, eow, pad, ..., pad]``; its UTF-8 encoding is truncated to
  48 bytes so that both markers fit in 50. ``<S>`` is ``[bow, bos, eow, pad, ...]`` and ``</S>`` is
  ``[bow, eos, eow, pad, ...]``.
* ``attention_mask`` -- 1 for real tokens (``<S>``/``</S>`` included), 0 for padding.
* ``token_type_ids`` -- sentence pairs: ``<S> a ... </S> <S> b ... </S>`` with type 0 on the first
  sentence (and its markers) and 1 on the second. Each sentence keeps its own ``<S>``/``</S>`` so that
  the pair heads of :mod:`modeling.elmo` can split the pair and run the BiLM on each sentence alone
  (ELMo never saw two sentences in one sequence).

Pre-split input (``is_split_into_words=True``, e.g. for token classification): each given word is one token
(only normalised), so word ``i`` of the first sentence is token ``i + 1``.

Word splitting: the ``tokenizers`` library's ``BertPreTokenizer`` (whitespace, and punctuation as separate
tokens) after NFC normalisation and, if ``lowercase``, lower-casing. The vocabulary (``vocab.txt``, one
token per line, as bilm-tf's vocabulary file) is ordered by id: ``<pad>`` = 0, ``<S>`` = 1, ``</S>`` = 2,
``<UNK>`` = 3, then words by decreasing corpus frequency -- the order the log-uniform sampler of the
sampled softmax and the adaptive softmax's clusters rely on.
"""

from __future__ import annotations

import os
from typing import Any

from tokenizers import normalizers, pre_tokenizers
from transformers import BatchEncoding, PreTrainedTokenizer
from transformers.tokenization_utils_base import PaddingStrategy, TruncationStrategy

VOCAB_FILES_NAMES = {"vocab_file": "vocab.txt"}

#: Characters per token (ELMo's ``max_characters_per_token``).
MAX_CHARS_PER_TOKEN = 50
#: Character ids as in AllenNLP's ELMoCharacterMapper: bilm-tf ids + 1 (0 = masked token).
BOS_CHAR = 256 + 1
EOS_CHAR = 257 + 1
BOW_CHAR = 258 + 1
EOW_CHAR = 259 + 1
PAD_CHAR = 260 + 1
#: Size of the character vocabulary (ids 0 ... 261).
CHAR_VOCAB_SIZE = 262

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<S>", "</S>", "<UNK>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]


def _marker_chars(char: int) -> list[int]:
    ids = [PAD_CHAR] * MAX_CHARS_PER_TOKEN
    ids[0], ids[1], ids[2] = BOW_CHAR, char, EOW_CHAR
    return ids


_BOS_CHARS = _marker_chars(BOS_CHAR)
_EOS_CHARS = _marker_chars(EOS_CHAR)


def word_to_char_ids(word: str) -> list[int]:
    """ELMo character ids of one token: a list of :data:`MAX_CHARS_PER_TOKEN` ints in ``[1, 261]``.

    ``"<S>"`` and ``"</S>"`` map to the sentence-marker characters; any other string to its UTF-8 bytes
    (+1), truncated to 48 bytes, between begin- and end-of-word markers, padded with :data:`PAD_CHAR`.
    (Source: bilm-tf ``UnicodeCharsVocabulary``; AllenNLP ``ELMoCharacterMapper``.)
    """
    if word == BOS_TOKEN:
        return list(_BOS_CHARS)
    if word == EOS_TOKEN:
        return list(_EOS_CHARS)
    data = word.encode("utf-8", "ignore")[: MAX_CHARS_PER_TOKEN - 2]
    ids = [PAD_CHAR] * MAX_CHARS_PER_TOKEN
    ids[0] = BOW_CHAR
    for k, byte in enumerate(data, start=1):
        ids[k] = byte + 1
    ids[len(data) + 1] = EOW_CHAR
    return ids


def build_normalizer(lowercase: bool) -> normalizers.Normalizer:
    """The ``tokenizers`` normaliser used for training and encoding: NFC (+ Lowercase)."""
    return normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()] if lowercase else [normalizers.NFC()])


def build_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """The ``tokenizers`` pre-tokeniser: split on whitespace and punctuation (``BertPreTokenizer``)."""
    return pre_tokenizers.BertPreTokenizer()


def with_markers(words: list[str], offsets: list[tuple[int, int]], type_id: int, add_special_tokens: bool):
    """One sentence as the model reads it: ``(tokens, offsets, token type ids, special-tokens mask)``, with ``<S>`` /
    ``</S>`` around the words when ``add_special_tokens`` (their offsets ``(0, 0)``, mask 1), each a list of the
    sentence's length (+2 with markers)."""
    if add_special_tokens:
        return (
            [BOS_TOKEN, *words, EOS_TOKEN],
            [(0, 0), *offsets, (0, 0)],
            [type_id] * (len(words) + 2),
            [1] + [0] * len(words) + [1],
        )
    return list(words), list(offsets), [type_id] * len(words), [0] * len(words)


def is_batch(text: Any, is_split_into_words: bool) -> bool:
    """Whether ``text`` given to the tokenizer is a batch: a list of strings (or of word lists when
    ``is_split_into_words``), or an empty list of texts; a single word list is one example."""
    return isinstance(text, (list, tuple)) and bool(
        (not text and not is_split_into_words)
        or (text and is_split_into_words and isinstance(text[0], (list, tuple)))
        or (text and not is_split_into_words and isinstance(text[0], (str, list, tuple)))
    )


def truncated_lengths(
    len_a: int, len_b: int | None, strategy: TruncationStrategy, max_length: int, n_special: int
) -> tuple[int, int]:
    """Word counts of a text (``len_a``) and its optional pair (``len_b``, None: no pair) after truncation to
    ``max_length`` tokens, ``n_special`` of them ``<S>``/``</S>`` markers, as transformers' strategies do:
    ``only_first`` / ``only_second`` cut that text, ``longest_first`` removes one word at a time from the longer
    one (the first on ties). Returns ``(len_a, len_b)`` (``len_b`` 0 without a pair).

    Raises:
        ValueError: ``max_length`` below the number of markers.
    """
    budget = max_length - n_special
    if budget < 0:
        raise ValueError(f"max_length={max_length} leaves no room for the {n_special} <S>/</S> markers")
    len_b_ = len_b or 0
    if strategy == TruncationStrategy.ONLY_FIRST or len_b is None:
        return max(0, min(len_a, budget - len_b_)), len_b_
    if strategy == TruncationStrategy.ONLY_SECOND:
        return len_a, max(0, min(len_b_, budget - len_a))
    while len_a + len_b_ > budget:  # longest_first
        if len_a >= len_b_:
            len_a -= 1
        else:
            len_b_ -= 1
    return len_a, len_b_


class SesameElmoTokenizer(PreTrainedTokenizer):
    """Word-level tokenizer with ELMo character ids (see the module docstring for the exact format).

    Args:
        vocab_file: ``vocab.txt``, one token per line; line ``i`` is id ``i``. Must contain ``<pad>``,
            ``<S>``, ``</S>`` and ``<UNK>``.
        lowercase: lower-case text before splitting (must match how the vocabulary was trained).
        max_characters_per_token: characters per token (50 in ELMo).

    Raises:
        ValueError: the vocabulary file lacks one of the special tokens.
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "char_ids", "token_type_ids", "attention_mask"]
    padding_side = "right"
    #: The character ids it writes are 0 .. char_vocab_size - 1: a model's ``char_vocab_size`` must be at least this.
    char_vocab_size = CHAR_VOCAB_SIZE

    def __init__(
        self,
        vocab_file: str,
        lowercase: bool = False,
        max_characters_per_token: int = MAX_CHARS_PER_TOKEN,
        unk_token: str = UNK_TOKEN,
        bos_token: str = BOS_TOKEN,
        eos_token: str = EOS_TOKEN,
        pad_token: str = PAD_TOKEN,
        **kwargs: Any,
    ) -> None:
        if max_characters_per_token != MAX_CHARS_PER_TOKEN:
            raise ValueError(f"max_characters_per_token={max_characters_per_token}; only 50 (ELMo) is supported")
        with open(vocab_file, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
        self.vocab: dict[str, int] = {tok: i for i, tok in enumerate(tokens)}
        self.ids_to_tokens: list[str] = tokens
        pad_token, bos_token, eos_token, unk_token = (str(t) for t in (pad_token, bos_token, eos_token, unk_token))
        missing = [t for t in (pad_token, bos_token, eos_token, unk_token) if t not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_file}: the vocabulary lacks the special token(s) {missing}")
        self.lowercase = lowercase
        self.max_characters_per_token = max_characters_per_token
        self._normalizer = build_normalizer(lowercase)
        self._pre_tokenizer = build_pre_tokenizer()
        super().__init__(
            lowercase=lowercase,
            max_characters_per_token=max_characters_per_token,
            unk_token=unk_token,
            bos_token=bos_token,
            eos_token=eos_token,
            pad_token=pad_token,
            **kwargs,
        )

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self.ids_to_tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def _convert_token_to_id(self, token: str) -> int:
        return self.vocab.get(token, self.vocab[self.unk_token])

    def _convert_id_to_token(self, index: int) -> str:
        return self.ids_to_tokens[index] if 0 <= index < len(self.ids_to_tokens) else self.unk_token

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(tok + "\n" for tok in self.ids_to_tokens))
        return (path,)

    # ----------------------------------------------------------------- splitting
    def split_words(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        """Normalise and split ``text`` into ``(word, (start, end))`` pairs (offsets into the normalised text,
        equal to offsets into ``text`` unless NFC/lower-casing changed its length)."""
        return self._pre_tokenizer.pre_tokenize_str(self._normalizer.normalize_str(text))

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [w for w, _ in self.split_words(text)]

    def char_ids_for_tokens(self, tokens: list[str]) -> list[list[int]]:
        """Character ids ``(len(tokens), 50)`` of the given token strings (see :func:`word_to_char_ids`)."""
        return [word_to_char_ids(t) for t in tokens]

    # ----------------------------------------------------------------- special tokens
    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        out = [self.bos_token_id, *token_ids_0, self.eos_token_id]
        if token_ids_1 is not None:
            out += [self.bos_token_id, *token_ids_1, self.eos_token_id]
        return out

    def create_token_type_ids_from_sequences(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        out = [0] * (len(token_ids_0) + 2)
        if token_ids_1 is not None:
            out += [1] * (len(token_ids_1) + 2)
        return out

    def get_special_tokens_mask(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        if already_has_special_tokens:
            return [int(t in (self.bos_token_id, self.eos_token_id, self.pad_token_id)) for t in token_ids_0]
        out = [1] + [0] * len(token_ids_0) + [1]
        if token_ids_1 is not None:
            out += [1] + [0] * len(token_ids_1) + [1]
        return out

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 4 if pair else 2

    # ----------------------------------------------------------------- encoding
    def _words(self, text: Any, is_split_into_words: bool) -> tuple[list[str], list[tuple[int, int]]]:
        if isinstance(text, str) and not is_split_into_words:
            pairs = self.split_words(text)
            return [w for w, _ in pairs], [o for _, o in pairs]
        if isinstance(text, (list, tuple)) and all(isinstance(w, str) for w in text):
            # pre-split words stay one token each (normalised / lower-cased only), so that word-level labels
            # line up: word i of the first sentence is token i + 1 (after <S>)
            words = [self._normalizer.normalize_str(w) for w in text]
            return words, [(0, 0)] * len(words)
        raise ValueError(f"expected a string or a list of strings, got {type(text).__name__}")

    def _padded(self, encoded: dict, arguments: dict) -> dict:
        """``encoded`` (one example, or a batch of lists) padded by :meth:`pad` (``char_ids`` included) as the
        keyword arguments of :meth:`_encode_plus` in ``arguments`` ask (``padding_strategy``, ``max_length``,
        ``pad_to_multiple_of``, ``padding_side``, ``return_attention_mask``)."""
        padded = self.pad(
            encoded,
            padding=arguments["padding_strategy"].value,
            max_length=arguments["max_length"],
            pad_to_multiple_of=arguments["pad_to_multiple_of"],
            padding_side=arguments["padding_side"],
            return_attention_mask=arguments["return_attention_mask"],
        )
        return dict(padded)

    def _marked_tokens(
        self,
        text: Any,
        text_pair: Any,
        add_special_tokens: bool,
        truncation_strategy: TruncationStrategy,
        max_length: int | None,
        is_split_into_words: bool,
    ) -> tuple[list[str], list[tuple[int, int]], list[int], list[int]]:
        """The words of one text (or pair), truncated by ``truncation_strategy`` to ``max_length`` tokens with the
        markers counted (:func:`truncated_lengths`), then marked (:func:`with_markers`): ``(tokens, character
        offsets, token type ids, special-tokens mask)``, each of the sequence's length."""
        words_a, offs_a = self._words(text, is_split_into_words)
        words_b, offs_b = self._words(text_pair, is_split_into_words) if text_pair is not None else (None, None)

        n_special = (2 + (2 if words_b is not None else 0)) if add_special_tokens else 0
        if truncation_strategy != TruncationStrategy.DO_NOT_TRUNCATE and max_length is not None:
            len_a, len_b = truncated_lengths(
                len(words_a), None if words_b is None else len(words_b), truncation_strategy, max_length, n_special
            )
            words_a, offs_a = words_a[:len_a], offs_a[:len_a]
            if words_b is not None:
                words_b, offs_b = words_b[:len_b], offs_b[:len_b]

        tokens, offsets, types, specials = with_markers(words_a, offs_a, 0, add_special_tokens)
        if words_b is not None:
            t2, o2, y2, s2 = with_markers(words_b, offs_b, 1, add_special_tokens)
            tokens, offsets, types, specials = tokens + t2, offsets + o2, types + y2, specials + s2
        return tokens, offsets, types, specials

    def _encode_with_offsets_one_by_one(self, arguments: dict) -> BatchEncoding:
        """A batch with ``offset_mapping`` (which the base class refuses for slow tokenizers): each example encoded
        alone by :meth:`_encode_plus` (``arguments``: its keyword arguments for the batch), unpadded, then merged
        and padded together (:meth:`_padded`) as tensors of ``return_tensors``."""
        one = dict(arguments, padding_strategy=PaddingStrategy.DO_NOT_PAD, pad_to_multiple_of=None, padding_side=None)
        one.update(return_tensors=None, return_attention_mask=False, return_overflowing_tokens=False)
        text, text_pair = arguments["text"], arguments["text_pair"]
        pairs = text_pair if text_pair is not None else [None] * len(text)
        outs = [
            self._encode_plus(**dict(one, text=t, text_pair=p, return_offsets_mapping=True))
            for t, p in zip(text, pairs)
        ]
        merged = {k: [o[k] for o in outs] for k in outs[0].keys()}
        return BatchEncoding(self._padded(merged, arguments), tensor_type=arguments["return_tensors"])

    def _encode_plus(
        self,
        text: Any,
        text_pair: Any = None,
        add_special_tokens: bool = True,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        truncation_strategy: TruncationStrategy = TruncationStrategy.DO_NOT_TRUNCATE,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: Any = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        verbose: bool = True,
        **kwargs: Any,
    ) -> BatchEncoding:
        """Encode one text (or pair) -- or a batch, delegated to the base class, which calls back here per
        example and pads with :meth:`pad` (``char_ids`` included)."""
        # the keyword arguments of this call (locals() holds only them here), for the batch paths and for _padded
        arguments = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        if is_batch(text, is_split_into_words):
            if return_offsets_mapping:  # the base class refuses offsets for slow tokenizers: one example at a time
                return self._encode_with_offsets_one_by_one(arguments)
            return super()._encode_plus(**arguments, **kwargs)
        if return_overflowing_tokens:
            raise NotImplementedError("SesameElmoTokenizer does not return overflowing tokens (no doc_stride windows)")
        tokens, offsets, types, specials = self._marked_tokens(
            text, text_pair, add_special_tokens, truncation_strategy, max_length, is_split_into_words
        )
        encoded: dict[str, Any] = {
            "input_ids": [self._convert_token_to_id(t) for t in tokens],
            "char_ids": self.char_ids_for_tokens(tokens),
        }
        if return_token_type_ids is None:
            return_token_type_ids = "token_type_ids" in self.model_input_names
        if return_token_type_ids:
            encoded["token_type_ids"] = types
        if return_special_tokens_mask:
            encoded["special_tokens_mask"] = specials
        if return_offsets_mapping:
            encoded["offset_mapping"] = offsets
        if return_length:
            encoded["length"] = len(tokens)
        if padding_strategy != PaddingStrategy.DO_NOT_PAD or return_attention_mask is not False:
            encoded = self._padded(encoded, arguments)
        return BatchEncoding(encoded, tensor_type=return_tensors, prepend_batch_axis=return_tensors is not None)

    def _pad(
        self,
        encoded_inputs: dict,
        max_length: int | None = None,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """Pad one example as the base class does, plus ``char_ids`` (all-zero rows for padding tokens) and
        ``offset_mapping`` (``(0, 0)``)."""
        extra = {k: encoded_inputs.pop(k) for k in ("char_ids", "offset_mapping") if k in encoded_inputs}
        out = super()._pad(
            encoded_inputs, max_length, padding_strategy, pad_to_multiple_of, padding_side, return_attention_mask
        )
        side = padding_side or self.padding_side
        n = len(out[self.model_input_names[0]])
        fills = {"char_ids": [0] * self.max_characters_per_token, "offset_mapping": (0, 0)}
        for key, value in extra.items():
            value = list(value)
            gap = [list(fills[key]) if key == "char_ids" else fills[key] for _ in range(n - len(value))]
            out[key] = value + gap if side == "right" else gap + value
        return out


SesameElmoTokenizer.register_for_auto_class("AutoTokenizer")
