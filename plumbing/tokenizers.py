"""The tokenizers a dataset's meta.json and a checkpoint's meta name: what its token ids mean."""

from collections import Counter

import tiktoken

from plumbing.errors import UserError

TOKENIZERS = ("char", "gpt2")


class CharTokenizer:
    """One id per character: id i is the i-th of the vocabulary's characters (nanoGPT's shakespeare_char)."""

    name, eot_id = "char", None  # eot_id: the id that ends a document, for tokenizers that have one

    def __init__(self, chars):
        self.chars = list(chars)
        self.vocab_size, self.stoi = len(self.chars), {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> list:
        if unknown := set(text).difference(self.stoi):
            shown = ", ".join(repr(c) for c in sorted(unknown, key=text.index))  # in order of appearance
            raise UserError(
                f"characters not in the vocabulary: {shown} "
                f"(this dataset's {self.vocab_size} characters are in its meta.json)"
            )
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # tensors and arrays as well as lists
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:  # a negative id would index from the end
            raise ValueError(f"ids outside the vocabulary [0, {self.vocab_size}): {bad[:10]}")
        return "".join(self.chars[i] for i in ids)

    def to_meta(self) -> dict:  # the meta fields get_tokenizer rebuilds it from
        return {"tokenizer": self.name, "vocab_size": self.vocab_size, "chars": self.chars}


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken: 50257 ids, the last of which, 50256, is <|endoftext|>."""

    name = "gpt2"

    def __init__(self):
        try:
            self.enc = tiktoken.get_encoding("gpt2")  # tiktoken keeps it: loaded once per process
        except Exception as e:  # downloaded on first use: offline that fails in several ways
            raise UserError(
                f"could not load tiktoken's GPT-2 BPE ({type(e).__name__}); it is downloaded on first use, "
                "so connect to the internet once or set TIKTOKEN_CACHE_DIR to a folder of its cached files"
            ) from e
        self.vocab_size = self.enc.n_vocab  # 50257; a model may pad its embedding table past this
        self.eot_id = self.enc.eot_token

    def encode(self, text: str) -> list:
        # encode_ordinary: "<|endoftext|>" written in a text is text; only eot_id ends a document
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.enc.decode(ids.tolist() if hasattr(ids, "tolist") else list(ids))

    def to_meta(self) -> dict:
        return {"tokenizer": self.name, "vocab_size": self.vocab_size}


def vocabulary_of(meta: dict):
    """What meta's token ids mean, (tokenizer, vocab_size, chars or None), checked: the one rule for a
    dataset's meta.json and a checkpoint's meta, and what two of them are compared by. A ValueError unless it
    has a tokenizer of TOKENIZERS, vocab_size >= 1 and, for char, chars: vocab_size characters, each once (a
    repeated one would have several ids: which one a text gets would be a guess)."""
    tokenizer, vocab_size, chars = (meta.get(key) for key in ("tokenizer", "vocab_size", "chars"))
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {tokenizer!r}")
    if type(vocab_size) is not int or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
    if tokenizer == "char" and (wrong := chars_error(chars, vocab_size)):
        need = f"a char tokenizer needs chars, the {vocab_size} characters its token ids stand for, each once"
        raise ValueError(f"{need}; {wrong}")
    return tokenizer, vocab_size, list(chars) if tokenizer == "char" else None


def chars_error(chars, vocab_size):
    """What is wrong with a char vocabulary's chars for vocab_size ids (vocabulary_of's), or None."""
    if chars is None:
        return "chars is missing"
    if not isinstance(chars, (list, str)):
        return f"chars is a {type(chars).__name__}, not a list"
    if not_one := [c for c in chars if not (isinstance(c, str) and len(c) == 1)]:
        return f"chars holds {not_one[0]!r}, not one character"
    if len(chars) != vocab_size:
        return f"chars has {len(chars)}, too {'few' if len(chars) < vocab_size else 'many'}"
    if repeated := sorted(c for c, n in Counter(chars).items() if n > 1):
        return f"chars repeats {', '.join(map(repr, repeated[:5]))}: a character would have several ids"
    return None


def get_tokenizer(meta: dict):
    """The tokenizer a dataset was prepared with, from its meta (checked by vocabulary_of)."""
    return CharTokenizer(meta["chars"]) if meta["tokenizer"] == "char" else GPT2Tokenizer()
