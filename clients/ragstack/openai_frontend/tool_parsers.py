"""Tool calls read from an llm's text as it arrives: one reader per choice, fed each new piece of
text (`feed`) and told when it ends (`finish`); each returns a Delta, the content to send and the
`tool_calls` delta entries of OpenAI's stream (`{"index", "id", "type": "function", "function":
{"name", "arguments": ""}}` first for a call, then `{"index", "function": {"arguments": fragment}}`).
A whole answer is the same reader fed the whole text (`collect`), so streamed and whole answers agree.

Readers:
- `Named`: the output is the arguments of one named function (tool_choice {"function": ...}); streamed
  as it comes.
- `Required`: the output is a JSON array of {"name", "parameters"} (tool_choice "required"); each
  call's name goes out once read, its arguments fragment by fragment.
- `tool_choice` "auto", in the format of the model family's chat template:
  `hermes` (Qwen2.5, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, text
  around them is content; `llama3_json` (Llama 3.1+): `{"name": ..., "parameters": {...}}` (several
  separated by `;`), possibly after `<|python_tag|>`, text around them content; `mistral`: `[TOOL_CALLS]` then a
  JSON list of {"name", "arguments"} (text after it is content), or v11's `name[ARGS]{...}` (`[CALL_ID]id`
  after the name dropped), also a bare list at the start when the special token was not kept. Content
  streams as it comes; a call is held until it is whole (hermes: its block; llama3_json and mistral: the
  end of the answer), then sent in one delta. A call names one of the request's tools and has its
  `arguments` (or `parameters`) key; text that does not parse as one stays content (a JSON answer with a
  "name" is not a call).
- `Plain`: no tools read (tool_choice "none").

Whitespace between content and calls is not content, but content on both sides of a call stays apart (one
whitespace run, else a space); `parallel` False keeps the first call only.
"""
from __future__ import annotations

import abc
import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

PARSERS = ("hermes", "llama3_json", "mistral")
ID_CHARACTERS = string.ascii_letters + string.digits
WHITESPACE = " \t\r\n"   # JSON's, and the structural tags' (tool_grammar._WS): what may precede a call
WHITESPACE_RUN = re.compile(r"[ \t\r\n]*")
MAX_GAP = 64   # whitespace a call's `{` or tag may be followed by (the bound keeps a waiting reader's rescans short)


@dataclass
class Delta:
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def add(self, other: Delta) -> Delta:
        self.content += other.content
        self.tool_calls += other.tool_calls
        return self


def call_id(short: bool = False) -> str:
    """OpenAI's form, or `short`: Mistral's, 9 letters and digits (its chat templates refuse any other id in
    the conversation sent back; vLLM writes them so for Mistral models too)."""
    if short:
        return "".join(secrets.choice(ID_CHARACTERS) for _ in range(9))
    return f"call_{uuid.uuid4().hex[:24]}"


class _Calls:
    """Numbers the calls of one choice and writes their delta entries."""

    def __init__(self, parallel: bool, short_ids: bool = False):
        self.parallel, self.count, self.short_ids = parallel, 0, short_ids

    def allowed(self) -> bool:
        return self.parallel or self.count == 0

    def start(self, name: str) -> dict:
        self.count += 1
        return {"index": self.count - 1, "id": call_id(self.short_ids), "type": "function",
                "function": {"name": name, "arguments": ""}}

    def arguments(self, text: str) -> dict:
        return {"index": self.count - 1, "function": {"arguments": text}}

    def whole(self, name: str, arguments: str) -> list[dict]:
        if not self.allowed():
            return []
        return [self.start(name), self.arguments(arguments)]


class _Content:
    """Content with its trailing whitespace held back: dropped if a call follows, else sent later.
    Whitespace around a call is not content, except that content resuming after a call is set apart
    from content sent before it: by the whitespace after the call, else that before it, else a space
    ("Sure.<call>Done." reads "Sure. Done.", not "Sure.Done.")."""

    def __init__(self):
        self._held: list[str] = []   # whitespace only (a list: a long run held piece by piece stays linear)
        self.after_call = False
        self.sent = False
        self.before_call = ""   # the whitespace held back when the first call of a run began

    def emit(self, text: str) -> str:
        if not text or text.isspace():
            self._held.append(text)
            return ""
        text = self._take_held() + text
        if self.after_call:
            body = text.lstrip()
            gap = text[:len(text) - len(body)] or self.before_call or " "
            text, self.after_call = (gap if self.sent else "") + body, False
        kept = text.rstrip()
        self._held = [text[len(kept):]]
        self.sent = True
        return kept

    def called(self) -> None:
        held = self._take_held()
        if not self.after_call:
            self.before_call = held
        self.after_call = True

    def flush(self, called: bool) -> str:
        text = self._take_held()
        return "" if called else text

    def _take_held(self) -> str:
        text, self._held = "".join(self._held), []
        return text


class Reader(abc.ABC):
    """The interface: feed text, then finish; `calls` counts the tool calls sent. `names`: the request's
    tools (auto's readers take a call of another name for content, as OpenAI never calls an unknown tool);
    `short_ids`: Mistral's call ids; `strict`: the answer follows strict tools' structural tag, which constrains
    calls where hermes and mistral read them (Llama3Json reads fewer then)."""

    def __init__(self, parallel: bool = True, *, names: frozenset[str] | None = None, short_ids: bool = False,
                 strict: bool = False):
        self._calls = _Calls(parallel, short_ids)
        self._names = names

    @property
    def calls(self) -> int:
        return self._calls.count

    @abc.abstractmethod
    def feed(self, text: str) -> Delta:
        """The delta the text adds: content, and tool calls complete or in part."""

    def finish(self) -> Delta:
        return Delta()


class Plain(Reader):
    def feed(self, text: str) -> Delta:
        return Delta(content=text)


class Named(Reader):
    """The whole output is the named function's arguments."""

    def __init__(self, name: str, *, short_ids: bool = False):
        super().__init__(parallel=False, short_ids=short_ids)
        self.name = name

    def feed(self, text: str) -> Delta:
        out = Delta()
        if not self.calls:
            out.tool_calls.append(self._calls.start(self.name))
        if text:
            out.tool_calls.append(self._calls.arguments(text))
        return out

    def finish(self) -> Delta:
        return self.feed("") if not self.calls else Delta()


class Required(Reader):
    """A JSON array of {"name", "parameters"} (or "arguments") objects, read character by character:
    a call's header goes out once its name is read, its arguments as they come."""

    ARGUMENT_KEYS = ("parameters", "arguments")

    def __init__(self, parallel: bool = True, *, short_ids: bool = False):
        super().__init__(parallel, short_ids=short_ids)
        self._stack: list[str] = []
        self._in_string = self._escaped = False
        self._string: str | None = None      # an item-level string being read (a key or the name)
        self._string_role = ""
        self._key: str | None = None
        self._expect_value = False
        self._capture: str | None = None     # "container", "string" or "scalar" while reading arguments
        self._arguments = ""                  # this item's arguments not yet sent
        self._name: str | None = None
        self._started = False                 # this item's header sent
        self._had_arguments = False

    def feed(self, text: str) -> Delta:
        out = Delta()
        for char in text:
            self._char(char, out)
        self._send_arguments(out)
        return out

    def finish(self) -> Delta:
        out = Delta()
        self._send_arguments(out)
        return out

    def _char(self, c: str, out: Delta) -> None:
        if self._in_string:
            if self._capture:
                self._arguments += c
            elif self._string is not None:
                self._string += c
            if self._escaped:
                self._escaped = False
            elif c == "\\":
                self._escaped = True
            elif c == '"':
                self._in_string = False
                if self._capture == "string" and len(self._stack) == 2:
                    self._end_arguments()
                elif self._string is not None:
                    self._item_string(self._string[:-1], out)
            return
        depth = len(self._stack)
        if self._capture:
            if self._capture == "scalar" and depth == 2 and c in ",}":
                self._end_arguments()          # and c is read below, at the item's level
            else:
                self._arguments += c
                if c == '"':
                    self._in_string = True
                elif c in "{[":
                    self._stack.append(c)
                elif c in "}]":
                    self._stack.pop()
                    if len(self._stack) == 2:
                        self._end_arguments()
                return
        if c.isspace():
            return
        if depth == 2 and self._expect_value and self._key in self.ARGUMENT_KEYS:
            self._expect_value = False
            self._had_arguments = True
            self._capture = "container" if c in "{[" else "string" if c == '"' else "scalar"
            self._arguments += c
            if c in "{[":
                self._stack.append(c)
            elif c == '"':
                self._in_string = True
            return
        if c == '"':
            self._in_string = True
            if depth == 2:
                self._string = ""
                self._string_role = "value" if self._expect_value else "key"
            return
        if c in "{[":
            self._stack.append(c)
            if depth == 1 and c == "{":   # a new call
                self._name, self._started, self._had_arguments, self._key = None, False, False, None
            return
        if c in "}]":
            if self._stack:
                self._stack.pop()
            if depth == 2 and c == "}":
                if self._started and not self._had_arguments:
                    self._arguments = "{}"
                self._send_arguments(out)
            return
        if depth == 2 and c == ":":
            self._expect_value = True
        elif depth == 2 and c == ",":
            self._expect_value = False

    def _item_string(self, raw: str, out: Delta) -> None:
        self._string = None
        try:
            value = json.loads(f'"{raw}"')
        except ValueError:
            value = raw
        if self._string_role == "key":
            self._key = value
            return
        self._expect_value = False
        if self._key == "name" and not self._started and self._calls.allowed():
            out.tool_calls.append(self._calls.start(value))
            self._started = True
            self._send_arguments(out)

    def _end_arguments(self) -> None:
        self._capture = None

    def _send_arguments(self, out: Delta) -> None:
        if self._started and self._arguments:
            out.tool_calls.append(self._calls.arguments(self._arguments))
            self._arguments = ""


def _call(value: Any, names: frozenset[str] | None) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a {"name", "arguments"/"parameters"} object naming one of `names`
    (any, if None), else None: JSON of other keys is an answer, not a call (vLLM's parsers need the key too)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"] \
            or (names is not None and value["name"] not in names):
        return None
    if "arguments" not in value and "parameters" not in value:
        return None
    arguments = value["arguments"] if "arguments" in value else value["parameters"]
    if isinstance(arguments, str):   # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    text = json.dumps(arguments, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:   # a lone surrogate (an escape such as \ud800): no UTF-8 answer could carry it
        return None
    return value["name"], text


def _json_values(text: str, separators: str = "") -> list[Any] | None:
    """The JSON values `text` holds one after another (whitespace and `separators` between), or None."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at == len(text):
            return values or None
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        values.append(value)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (held back: the marker may follow)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class Hermes(Reader):
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, parallel: bool = True, **kwargs):
        super().__init__(parallel, **kwargs)
        self._buffer, self._in_call, self._content = "", False, _Content()

    def feed(self, text: str) -> Delta:
        out, self._buffer = Delta(), self._buffer + text
        while True:
            if not self._in_call:
                at = self._buffer.find(self.START)
                if at < 0:
                    keep = _partial_suffix(self._buffer, self.START)
                    out.content += self._content.emit(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return out
                out.content += self._content.emit(self._buffer[:at])
                self._buffer, self._in_call = self._buffer[at + len(self.START):], True
            else:
                at = self._buffer.find(self.END)
                if at < 0:
                    return out
                self._block(self._buffer[:at], True, out)
                self._buffer, self._in_call = self._buffer[at + len(self.END):], False

    def finish(self) -> Delta:
        out = Delta()
        if self._in_call:   # no closing tag (the answer ended after the JSON, or was cut)
            self._block(self._buffer, False, out)
        else:
            out.content += self._content.emit(self._buffer)
        self._buffer = ""
        out.content += self._content.flush(self.calls > 0)
        return out

    def _block(self, block: str, closed: bool, out: Delta) -> None:
        values = _json_values(block)
        call = _call(values[0], self._names) if values and len(values) == 1 else None
        if call is None:
            out.content += self._content.emit(self.START + block + (self.END if closed else ""))
        else:
            out.tool_calls += self._calls.whole(*call)
            self._content.called()


class Llama3Json(Reader):
    """Calls are `{"name": ..., "parameters": ...}` objects (or a JSON list of them), several separated by `;`,
    possibly after `<|python_tag|>`, with text around them as content (vLLM's parser finds them there too): the
    first run of calls is read. Text streams as it comes; from a `{` (or a `[` before one) that begins
    `{"name"`, it is held until the object closes: a call holds everything after it until the end (more calls,
    then content), anything else goes out as content. Any other JSON value (a bracket that begins no call)
    streams through as content, its inside not searched for calls. `strict`: calls at the start only, where
    strict tools' structural tag constrains them (text before them is free, and so would be a call there).
    The buffer is scanned by position and cut once a feed, so a whole answer is read in linear time."""
    TAG = "<|python_tag|>"
    KEY = '"name"'
    OPENING = re.compile(r"[\[{]|<\|python_tag\|>")

    def __init__(self, parallel: bool = True, *, strict: bool = False, **kwargs):
        super().__init__(parallel, strict=strict, **kwargs)
        self._strict, self._plain = strict, False   # plain: no call can come any more
        self._buffer, self._content = "", _Content()
        self._object: _Brackets | None = None    # the candidate held: its value from `_skip`, read to `_scanned`
        self._skip = self._scanned = 0
        self._passing: _Brackets | None = None   # a value that is no call, streaming through as content
        self._read: list[tuple[str, str]] = []   # the first run's calls, once read

    def feed(self, text: str) -> Delta:
        self._buffer += text
        out, pos = Delta(), 0   # pos: what of the buffer is sent or taken
        while not self._read and not self._plain:
            if self._passing is not None:
                end = self._passing.advance(self._buffer, pos)
                stop = len(self._buffer) if end is None else end
                out.content += self._content.emit(self._buffer[pos:stop])
                pos = stop
                if end is None:
                    break
                self._passing = None
                continue
            if self._object is None:
                pos, state = self._start(out, pos)
                if state == "wait":
                    break
                if state == "passing":
                    continue
            end = self._object.advance(self._buffer, self._scanned)
            if end is None:
                self._scanned = len(self._buffer)
                break
            calls = self._calls_in(self._buffer[self._skip:end])
            self._object = None
            if not calls:
                out.content += self._content.emit(self._buffer[pos:end])
                self._plain = self._strict
            self._read, pos = calls, end
        self._buffer = self._buffer[pos:]
        self._skip, self._scanned = self._skip - pos, self._scanned - pos
        if self._plain:
            out.content += self._content.emit(self._buffer)
            self._buffer = ""
        return out

    def _start(self, out: Delta, pos: int) -> tuple[int, str]:
        """From `pos`: sends the content before a possible call; returns where it begins and "object" (a
        candidate held from there), "passing" (a value that is no call, to stream through) or "wait"."""
        while True:
            found = self.OPENING.search(self._buffer, pos)
            at = found.start() if found else max(pos, len(self._buffer) - _partial_suffix(self._buffer, self.TAG))
            if self._strict and self._buffer[pos:at].strip(WHITESPACE):
                self._plain = True
                return pos, "wait"
            out.content += self._content.emit(self._buffer[pos:at])
            pos = at
            if found is None:
                return pos, "wait"
            tag = len(self.TAG) if found.group() == self.TAG else 0
            begins, value = self._begins_call(pos + tag)
            if begins is None:
                return pos, "wait"
            if begins:
                self._object, self._skip, self._scanned = _Brackets(), value, value
                return pos, "object"
            if self._strict:
                self._plain = True
                return pos, "wait"
            if tag:   # the tag before other text: content
                out.content += self._content.emit(self.TAG)
                pos += tag
                continue
            self._passing = _Brackets()
            return pos, "passing"

    def _begins_call(self, at: int) -> tuple[bool | None, int]:
        """Whether the buffer from `at` (whitespace first) begins `{"name"` (or `[{"name"`, unless strict: the
        structural tag writes no list), None while it still may; and where the value begins."""
        text, start = self._buffer, at
        at = value = _past_whitespace(text, at)
        if at - start > MAX_GAP:
            return False, value
        if at < len(text) and text[at] == "[":
            if self._strict:
                return False, value
            start, at = at + 1, _past_whitespace(text, at + 1)
        if at - start > MAX_GAP:
            return False, value
        if at >= len(text):
            return None, value
        if text[at] != "{":
            return False, value
        start, at = at + 1, _past_whitespace(text, at + 1)
        if at - start > MAX_GAP:
            return False, value
        key = text[at:at + len(self.KEY)]
        if len(key) < len(self.KEY):
            return (None if self.KEY.startswith(key) else False), value
        return key == self.KEY, value

    def _calls_in(self, text: str) -> list[tuple[str, str]]:
        """The calls a JSON object or list of objects holds, all of them calls; else none."""
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return []
        calls = [_call(item, self._names) for item in (value if isinstance(value, list) else [value])]
        return calls if calls and None not in calls else []

    def finish(self) -> Delta:
        text, self._buffer = self._buffer, ""
        out = Delta()
        if not self._read:
            out.content += self._content.emit(text)
        else:
            calls, after = list(self._read), text
            while True:   # more calls, after `;` (or another tag)
                rest = after.lstrip().removeprefix(";").lstrip().removeprefix(self.TAG).lstrip()
                _, end = _json_prefix(rest)
                more = self._calls_in(rest[:end]) if end else []
                if not more:
                    break
                calls += more
                after = rest[end:]
            for call in calls:
                out.tool_calls += self._calls.whole(*call)
            self._content.called()
            out.content += self._content.emit(after.lstrip().removeprefix(";"))
        out.content += self._content.flush(self.calls > 0)
        return out


class _Brackets:
    """Where a JSON value that begins with a bracket closes, read as its text comes (strings and escapes
    counted; the state kept between calls)."""

    def __init__(self):
        self._depth, self._in_string, self._escaped = 0, False, False

    def advance(self, text: str, start: int) -> int | None:
        """The index after the value's closing bracket in `text`, read from `start`; None: not closed yet."""
        for i in range(start, len(text)):
            c = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None


def _past_whitespace(text: str, at: int) -> int:
    """Past the whitespace at `at`, at most MAX_GAP + 1 characters of it (a longer run begins no call)."""
    return WHITESPACE_RUN.match(text, at, at + MAX_GAP + 1).end()


class Mistral(Reader):
    MARK, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"

    def __init__(self, parallel: bool = True, **kwargs):
        super().__init__(parallel, **kwargs)
        self._buffer, self._mode, self._content = "", None, _Content()   # mode: None, "content", "calls"

    def feed(self, text: str) -> Delta:
        self._buffer += text
        out = Delta()
        if self._mode is None:
            start = self._buffer.lstrip(WHITESPACE)   # as strict tools' tag reads it: other spaces are text
            if not start or start == "[" or (self.MARK.startswith(start) and start != self.MARK):
                return out
            self._mode = "calls" if start.startswith((self.MARK, "[{")) else "content"
        if self._mode == "content":
            at = self._buffer.find(self.MARK)
            if at < 0:
                keep = _partial_suffix(self._buffer, self.MARK)
                out.content += self._content.emit(self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                return out
            out.content += self._content.emit(self._buffer[:at])
            self._buffer, self._mode = self._buffer[at:], "calls"
        return out

    def finish(self) -> Delta:
        text, self._buffer = self._buffer, ""
        out = Delta()
        read = self._read(text) if self._mode == "calls" else None
        if read is None:
            out.content += self._content.emit(text)
        else:
            calls, after = read
            for call in calls:
                out.tool_calls += self._calls.whole(*call)
            self._content.called()
            out.content += self._content.emit(after)
        out.content += self._content.flush(self.calls > 0)
        return out

    def _read(self, text: str) -> tuple[list[tuple[str, str]], str] | None:
        """The calls, and the text after each part's calls (content, as vLLM streams it), or None."""
        calls, after = [], []
        for part in text.split(self.MARK):
            part = part.strip()
            if not part:
                continue
            if part.startswith("["):   # [{"name": ..., "arguments": {...}}, ...]
                value, end = _json_prefix(part)
                found = [_call(v, self._names) for v in value] if isinstance(value, list) else [None]
            else:                      # v11: name[ARGS]{...} (name[CALL_ID]id[ARGS]{...}), or name{...}
                at = part.find(self.ARGS)
                at, skip = (at, len(self.ARGS)) if at >= 0 else (part.find("{"), 0) if "{" in part else (len(part), 0)
                value, end = _json_prefix(part[at + skip:])
                end += at + skip
                name = part[:at].split(self.CALL_ID)[0].strip()
                found = [_call({"name": name, "arguments": value}, self._names)]
            if not found or None in found:
                return None
            calls += found
            after.append(part[end:].strip())
        return (calls, " ".join(text for text in after if text)) if calls else None


def _json_prefix(text: str) -> tuple[Any, int]:
    """The JSON value `text` begins with and where it ends, or (None, 0)."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return None, 0


AUTO = {"hermes": Hermes, "llama3_json": Llama3Json, "mistral": Mistral}


def joined(entries: list[dict]) -> list[dict]:
    """One delta's entries with each call's fragments joined into one entry (its header's, if sent in this
    delta), as vLLM sends them."""
    out: list[dict] = []
    for entry in entries:
        if out and out[-1]["index"] == entry["index"] and "id" not in entry:
            last = out[-1]
            arguments = last["function"]["arguments"] + entry["function"]["arguments"]
            out[-1] = {**last, "function": {**last["function"], "arguments": arguments}}
        else:
            out.append(entry)
    return out


def collect(reader: Reader, text: str) -> tuple[str, list[dict]]:
    """A whole answer read: its content and its tool calls whole ({"id", "type", "function"})."""
    delta = reader.feed(text).add(reader.finish())
    calls: list[dict] = []
    for entry in delta.tool_calls:
        if "id" in entry:
            calls.append({"id": entry["id"], "type": "function", "function": dict(entry["function"])})
        else:
            calls[entry["index"]]["function"]["arguments"] += entry["function"]["arguments"]
    return delta.content, calls
