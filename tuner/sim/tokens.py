"""The simulator's tokenizer: deterministic, no model files, text and ids kept consistent. Pure.

SGLang counts with the model's tokenizer; the simulator has none, so it plays one with three
guarantees (docs/simulator.md, "The simulator's tokenizer"):

* ids -> text -> ids is exact: `encode(decode(ids)) == ids` for every id. Generated tokens are
  common English words (` the`, ` of`, ...), one token each in real BPE tokenizers too, so the
  generated text retokenizes to the count the server reported, here and on a real tokenizer.
  Other ids decode to `w<id>` words, which encode back to the same id.
* Text the tuner writes for synthetic prompts (`w<id>` words, loadgen/workload.py) counts one token per
  word, the length the workload asked for.
* Other text is split as byte-level BPE pre-tokenizers split it (letter runs, digit groups of at
  most 3, each punctuation mark apart; a long letter run counts one token per 8 letters), so prose
  counts close to what a real tokenizer reports (not exactly: there is no vocabulary to merge
  with). Equal text gives equal ids, so prefix caching works on text prompts.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

#: ids below this are "special" in real tokenizers; hashed word ids stay clear of them
ID_OFFSET = 1000
ID_SPACE = 100_000
#: the id the simulated model emits as its end-of-sequence token (`matched` in a stop reason)
EOS_TOKEN_ID = 2
#: a letter run longer than this counts one token per this many letters (BPE splits rare words)
LONG_RUN = 8

#: the generated words: each one token (with its leading space) in GPT-2/Llama-3/Qwen vocabularies
_WORDS = """the of and to in is that for it as was with be by on not he this are or his from at which
    but have an had they you were their one all we can her has there been if more when will would
    who so no time out up other into its some than then only also new first may could these two any
    like over such our what most should well after where much made many between each through those
    work way before world even because people same year very make both under back good long state
    system still own life being here high part great used how while use take number day place small
    might found last old right large point water end house group light open line order power model
    data value form case home city name area book game team play music road river field story table
    paper plan test page note word idea week month hand side head face door room food tree fire rain
    wind stone sound color voice mind heart body child family friend school market money price cost
    rate level result change question answer problem reason method process energy space image short
    simple clear early late free full real true best better second third next few every often never
    always again around against without within during since until among along above below near far
    about just know get see look come think want give tell ask show try call keep let begin seem help
    talk turn start run move live believe hold bring happen write provide sit stand lose pay meet
    include continue set learn lead understand watch follow stop create speak read allow add spend
    grow offer remember love consider appear buy wait serve die send expect build stay fall cut reach
    kill remain suggest raise pass sell require report decide pull"""
VOCAB: tuple[str, ...] = tuple(_WORDS.split())
#: vocabulary ids: below ID_OFFSET, so they never collide with hashed words or the tuner's w<id>
VOCAB_BASE = 200
_VOCAB_ID = {w: VOCAB_BASE + i for i, w in enumerate(VOCAB)}
_PIECE = re.compile(r"(?<!\S)w(\d{1,9})(?!\S)|([^\W\d_]+)|(\d{1,3})|(\S)")


def word_id(word: str) -> int:
    """The id of one piece of text: vocabulary, `w<id>`, else a stable hash (crc32, not hash())."""
    vid = _VOCAB_ID.get(word)
    if vid is not None:
        return vid
    if word.startswith("w") and word[1:].isdigit() and len(word) <= 10:
        return int(word[1:])
    return zlib.crc32(word.encode("utf-8")) % ID_SPACE + ID_OFFSET


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    for m in _PIECE.finditer(text):
        literal, letters, digits, other = m.groups()
        if literal is not None:
            out.append(m.group(0))
        elif letters is not None and len(letters) > LONG_RUN and letters not in _VOCAB_ID:
            out.extend(letters[i : i + LONG_RUN] for i in range(0, len(letters), LONG_RUN))
        else:
            out.append(letters or digits or other)
    return out


def encode(text: str) -> list[int]:
    """Token ids of a text (module docstring)."""
    return [word_id(p) for p in _pieces(text)]


def count_tokens(text: str) -> int:
    """How many tokens `encode(text)` gives."""
    return len(_pieces(text))


def piece(token_id: int) -> str:
    """The text of one token, with its leading space as BPE tokens carry it."""
    i = token_id - VOCAB_BASE
    if 0 <= i < len(VOCAB):
        return " " + VOCAB[i]
    return f" w{token_id}"


def decode(ids: Sequence[int]) -> str:
    """Text of ids; `encode(decode(ids)) == ids` for every non-negative id."""
    return "".join(piece(i) for i in ids)


def output_token_id(rid_seed: int, index: int) -> int:
    """The id of the `index`-th generated token of a request: a vocabulary word (deterministic).

    The seed picks both where the walk through the vocabulary starts and its stride (the
    vocabulary's size is prime, so every stride visits every word), so requests differ.
    """
    size = len(VOCAB)
    return VOCAB_BASE + (rid_seed * 1_000_003 + index * (1 + rid_seed % (size - 1))) % size


def render(ids: Sequence[int]) -> str:
    """Text of generated ids (`decode`; kept for the callers that render answers)."""
    return decode(ids)


def first_stop(seed: int, max_new: int, stops: Sequence[str]) -> tuple[int, str, int] | None:
    """Where a request's generated text first contains one of `stops`, SGLang's stop strings.

    (tokens generated when it matched, the matched string, the text length to keep): SGLang ends
    the request with that token and trims the text before the stop string.
    """
    stops = [s for s in stops if s]
    if not stops:
        return None
    longest = max(len(s) for s in stops)
    text = ""
    # the generated words repeat with period len(VOCAB): what is not met within one period
    # (plus the tokens a stop string can span) is never met, however long the request
    for n in range(1, min(max_new, len(VOCAB) + longest + 1) + 1):
        start = max(0, len(text) - longest + 1)
        text += piece(output_token_id(seed, n - 1))
        hits = [(text.find(s, start), s) for s in stops]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if hits:
            pos, s = min(hits)
            return n, s, pos
    return None


def chat_prompt_ids(messages: Sequence[dict]) -> list[int]:
    """Token ids of an OpenAI chat message list: a role token, then the content's tokens.

    Roughly what a chat template adds (one role token per message), so a shared system prompt
    gives a shared token prefix.
    """
    ids: list[int] = []
    for msg in messages:
        ids.append(word_id(f"<|{msg.get('role', 'user')}|>"))
        content = msg.get("content") or ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        ids.extend(encode(str(content)))
    ids.append(word_id("<|assistant|>"))
    return ids
