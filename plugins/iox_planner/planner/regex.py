"""Regular expressions a query may give Spark: literal patterns that cannot backtrack for ever.

Spark runs Java's backtracking regex engine, which no cancellation can interrupt: `(.*,){11}P` over a long value
kept a core busy for minutes after its query's budget ended. So every pattern argument (`REGEX_ARGUMENTS`, and
the RLIKE/REGEXP operators) must be one string literal that passes `pattern_problem`, which reads Java's syntax
well enough to be safe and refuses whatever it does not understand:
- at most `MAX_PATTERN_LENGTH` characters, counted repetitions `{n,m}` up to `MAX_REPEAT`;
- no backreferences (`\\1`, `\\k<name>`), lookarounds, comments mode (`(?x)`) or `\\N{...}`;
- star height at most 1: no repeating quantifier (`*`, `+`, `{n,}`, `{n,m}` with m > 1) over a group holding a
  quantifier, unless both are small counted repetitions; no repeated alternation whose branches can start alike
  (`(a|ab)*`);
- at most `MAX_OVERLAPPING` unbounded quantifiers in a row that can match the same character without a required
  character between them that they cannot, one at the pattern's very end not counted (`.*a.*a.*b` is refused,
  `.*foo.*bar.*` and `\\w+\\s+\\w+\\s+\\w+` pass): each one more multiplies the backtracking by the value's length.
Possessive and lazy quantifiers and atomic groups are read like greedy ones (they backtrack less, never more).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PATTERN_LENGTH = 1_000
MAX_REPEAT = 1_000
MAX_OVERLAPPING = 2
_NESTED_WAYS = 10_000
"""A counted repetition inside a counted repetition is allowed while (inner + 1) ** outer stays under this."""

REGEX_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "rlike": (1,), "regexp": (1,), "regexp_like": (1,), "regexp_replace": (1,), "regexp_extract": (1,),
    "regexp_extract_all": (1,), "regexp_count": (1,), "regexp_instr": (1,), "regexp_substr": (1,), "split": (1,),
    "str_to_map": (1, 2),
}
"""Allowed functions whose argument at these 0-based positions Spark compiles as a Java regular expression (Spark's
documentation of each; `str_to_map`'s two delimiters are regexes). A LIKE/ILIKE pattern, which Spark may run as a
regular expression too, must be one string literal, checked by `like_problem`."""

# Character sets, coarsely: a frozenset of code points below 128, plus whether other characters may match.
_ALL = frozenset(range(128))


@dataclass(frozen=True)
class _Set:
    ascii: frozenset[int]
    other: bool

    def overlaps(self, other: _Set) -> bool:
        return bool(self.ascii & other.ascii) or (self.other and other.other)

    def __or__(self, other: _Set) -> _Set:
        return _Set(self.ascii | other.ascii, self.other or other.other)


_ANY = _Set(_ALL, True)
_EMPTY = _Set(frozenset(), False)
_DIGITS = _Set(frozenset(range(48, 58)), False)
_WORD = _Set(frozenset([*range(48, 58), *range(65, 91), *range(97, 123), 95]), False)
_SPACE = _Set(frozenset([9, 10, 11, 12, 13, 32]), False)
_CLASSES = {"d": _DIGITS, "w": _WORD, "s": _SPACE, "h": _Set(frozenset([9, 32]), True),
            "v": _Set(frozenset([10, 11, 12, 13]), True)}


def _char(code: int, fold: bool) -> _Set:
    if code >= 128:
        return _Set(frozenset(), True)
    codes = {code}
    if fold and chr(code).isalpha():
        codes |= {ord(chr(code).lower()), ord(chr(code).upper())}
    return _Set(frozenset(codes), False)


@dataclass
class _Node:
    """One parsed piece: what its characters may be, how many unbounded quantifiers it holds, and its shape."""

    chars: _Set = _EMPTY
    first: _Set = _EMPTY
    quantified: bool = False
    """Holds a quantifier (`?` too: `(a?){30}` chooses 2^30 ways)."""
    counted: int = 1
    """The largest max of a counted repetition it holds (when `quantified` and all bounded)."""
    unbounded: bool = False
    alternation: bool = False
    nullable: bool = False
    items: list[_Node] = field(default_factory=list)


class RegexRefused(Exception):
    """Why a pattern is refused (one sentence, for the error message)."""


def pattern_problem(pattern: str) -> str | None:
    """Why Java's engine could backtrack on `pattern` for ever (or why it cannot be read safely), or None."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"it is {len(pattern):,} characters long, over the limit of {MAX_PATTERN_LENGTH:,}"
    try:
        _Parser(pattern).parse()
    except RegexRefused as why:
        return str(why)
    return None


def like_problem(pattern: str, escape: str = "\\") -> str | None:
    """Why a LIKE pattern could backtrack for ever, or None: Spark runs a LIKE that is not a plain prefix, suffix or
    substring as a Java regular expression, `%` as `.*` and `_` as `.`, so `%a%a%a%b` is `.*a.*a.*a.*b`."""
    parts: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if ch == escape:
            ch = next(chars, "")
            parts.append(ch if ch.isalnum() or not ch.isascii() else "\\" + ch)
        elif ch == "%":
            parts.append(".*")
        elif ch == "_":
            parts.append(".")
        else:
            parts.append(ch if ch.isalnum() or not ch.isascii() else "\\" + ch)
    return pattern_problem("".join(parts))


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0
        self.depth = 0
        self.fold = False

    def parse(self) -> _Node:
        node = self._alternation()
        if self.at != len(self.text):
            raise RegexRefused(f"it has an unmatched ')' at offset {self.at}")
        return node

    def _peek(self, k: int = 0) -> str:
        return self.text[self.at + k] if self.at + k < len(self.text) else ""

    def _alternation(self) -> _Node:
        branches = [self._sequence()]
        while self._peek() == "|":
            self.at += 1
            branches.append(self._sequence())
        if len(branches) == 1:
            return branches[0]
        node = _Node(alternation=True, items=branches)
        for branch in branches:
            node.chars |= branch.chars
            node.first |= branch.first
            node.quantified |= branch.quantified
            node.unbounded |= branch.unbounded
            node.nullable |= branch.nullable
            node.counted = max(node.counted, branch.counted)
        return node

    def _sequence(self) -> _Node:
        node = _Node(nullable=True)
        chain: list[_Set] = []
        over = 0
        while self._peek() not in ("", "|", ")"):
            item = self._quantified()
            if item is None:
                continue
            if over:
                raise _overlapping(over)
            node.items.append(item)
            node.chars |= item.chars
            if node.nullable:
                node.first |= item.first
            node.nullable &= item.nullable
            node.quantified |= item.quantified
            node.unbounded |= item.unbounded
            node.counted = max(node.counted, item.counted)
            chain = self._chain(chain, item)
            over = len(chain) if len(chain) > MAX_OVERLAPPING else 0
        if over and self.depth:
            raise _overlapping(over)
        # At the pattern's very end an unbounded repetition has nothing after it that could fail and make the ones
        # before it try again (Spark finds a match: `find`), so it adds no backtracking: `.*a.*` passes.
        return node

    @staticmethod
    def _chain(chain: list[_Set], item: _Node) -> list[_Set]:
        """The unbounded quantifiers in a row that can trade characters: a required piece none of them can match
        ends the row; an unbounded piece that overlaps the row extends it."""
        if item.unbounded:
            if chain and not any(item.chars.overlaps(c) for c in chain):
                chain = []
            return [*chain, item.chars]
        if not item.nullable and not any(item.chars.overlaps(c) for c in chain):
            return []
        return chain

    def _quantified(self) -> _Node | None:
        atom = self._atom()
        if atom is None:
            return None
        low, high = self._quantifier()
        if (low, high) == (1, 1):
            return atom
        if self._peek() in ("?", "+"):
            self.at += 1  # lazy or possessive: backtracks no more than greedy
        repeats = high is None or high > 1
        if repeats and atom.quantified:
            inner = atom.counted
            if atom.unbounded or high is None or (inner + 1) ** high > _NESTED_WAYS:
                raise RegexRefused("it repeats a group that itself holds a repetition (nested quantifiers, as in "
                                   "(a+)+ or (.*,){11}), which Java's engine can take exponential time on")
        if repeats and atom.alternation and _branches_overlap(atom.items):
            raise RegexRefused("it repeats an alternation whose branches can match the same text (as in (a|ab)*), "
                               "which Java's engine can take exponential time on")
        return _Node(chars=atom.chars, first=atom.first, quantified=True,
                     counted=max(atom.counted, high or 1) if high is not None else atom.counted,
                     unbounded=atom.unbounded or high is None, nullable=atom.nullable or low == 0,
                     alternation=False, items=[atom])

    def _quantifier(self) -> tuple[int, int | None]:
        ch = self._peek()
        if ch == "*":
            self.at += 1
            return 0, None
        if ch == "+":
            self.at += 1
            return 1, None
        if ch == "?":
            self.at += 1
            return 0, 1
        if ch != "{":
            return 1, 1
        end = self.text.find("}", self.at)
        body = self.text[self.at + 1:end] if end > 0 else ""
        parts = body.split(",")
        if end < 0 or len(parts) > 2 or not parts[0].isascii() or not parts[0].isdigit() \
                or (len(parts) == 2 and parts[1] and not (parts[1].isascii() and parts[1].isdigit())):
            raise RegexRefused(f"it has a '{{' at offset {self.at} that is not a counted repetition {{n}}, {{n,}} or "
                               "{n,m}; write \\{ for a brace")
        self.at = end + 1
        low = int(parts[0])
        high = low if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
            raise RegexRefused(f"it has the counted repetition {{{body}}}, over {MAX_REPEAT:,}")
        if high is not None and high < low:
            raise RegexRefused(f"it has the counted repetition {{{body}}}, whose maximum is below its minimum")
        return low, high

    def _atom(self) -> _Node | None:
        ch = self._peek()
        if ch in ("*", "+", "?", "{"):
            raise RegexRefused(f"it has a quantifier {ch!r} with nothing to repeat at offset {self.at}")
        self.at += 1
        if ch == "(":
            return self._group()
        if ch == "[":
            chars = self._class()
            return _Node(chars=chars, first=chars)
        if ch == ".":
            return _Node(chars=_ANY, first=_ANY)
        if ch in ("^", "$"):
            return _Node(nullable=True)
        if ch == "\\":
            return self._escape()
        chars = _char(ord(ch), self.fold)
        return _Node(chars=chars, first=chars)

    def _group(self) -> _Node | None:
        if self._peek() == "?":
            self.at += 1
            kind = self._peek()
            if kind in (":", ">"):
                self.at += 1
            elif kind in ("=", "!") or (kind == "<" and self._peek(1) in ("=", "!")):
                raise RegexRefused("it has a lookaround ((?=, (?!, (?<=, (?<!), which iox-batch does not allow")
            elif kind == "<":
                end = self.text.find(">", self.at)
                if end < 0 or not self.text[self.at + 1:end].isalnum():
                    raise RegexRefused("it has a named group whose name is not letters and digits")
                self.at = end + 1
            else:
                return self._flags()
        return self._group_body()

    def _group_body(self) -> _Node:
        """A group's alternation, one level deeper, up to and past its `)`."""
        self.depth += 1
        node = self._alternation()
        self.depth -= 1
        if self._peek() != ")":
            raise RegexRefused("it has an unclosed group '('")
        self.at += 1
        return node

    def _flags(self) -> _Node | None:
        """`(?idmsuU-idmsuU)` or `(?flags:X)`; comments mode (`x`) changes what the pattern means and is
        refused. Case-insensitivity widens the sets from there on (kept on: a safe over-estimate)."""
        start = self.at
        while self._peek() and self._peek() in "idmsuU-":
            self.at += 1
        flags = self.text[start:self.at]
        if self._peek() not in (")", ":") or not flags:
            raise RegexRefused(f"it has an inline flag group (?{self.text[start:self.at + 1]} that iox-batch does not "
                               "read (flags i d m s u U are allowed; comments mode x is not)")
        if "i" in flags.split("-")[0]:
            self.fold = True
        if self._peek() == ")":
            self.at += 1
            return None
        self.at += 1
        return self._group_body()

    def _escape(self) -> _Node:
        ch = self._peek()
        if not ch:
            raise RegexRefused("it ends with a lone backslash")
        self.at += 1
        if ch.isdigit() and ch != "0" or ch == "k":
            raise RegexRefused("it has a backreference (\\1, \\k<name>), which can take exponential time and is not "
                               "allowed")
        if ch in "bBAGZz":
            return _Node(nullable=True)
        if ch == "Q":
            end = self.text.find("\\E", self.at)
            quoted = self.text[self.at:] if end < 0 else self.text[self.at:end]
            self.at = len(self.text) if end < 0 else end + 2
            if not quoted:
                return _Node(nullable=True)
            node = _Node(first=_char(ord(quoted[0]), self.fold))
            for c in quoted:
                node.chars |= _char(ord(c), self.fold)
            return node
        chars = self._escaped_set(ch)
        return _Node(chars=chars, first=chars)

    def _escaped_set(self, ch: str) -> _Set:
        """The set of an escape outside or inside a character class (the escape's letter already read)."""
        if ch.lower() in _CLASSES:
            return _CLASSES[ch.lower()] if ch.islower() else _ANY
        if ch in "pP":
            if self._peek() == "{":
                end = self.text.find("}", self.at)
                if end < 0:
                    raise RegexRefused("it has an unclosed \\p{...}")
                self.at = end + 1
            else:
                self.at += 1
            return _ANY
        if ch in "RX":
            return _ANY
        simple = {"t": 9, "n": 10, "r": 13, "f": 12, "a": 7, "e": 27}
        if ch in simple:
            return _char(simple[ch], False)
        if ch == "0":
            while self._peek() and self._peek() in "01234567":
                self.at += 1
            return _ANY
        if ch in "xuc":
            if ch == "x" and self._peek() == "{":
                end = self.text.find("}", self.at)
                if end < 0:
                    raise RegexRefused("it has an unclosed \\x{...}")
                self.at = end + 1
            else:
                self.at += {"x": 2, "u": 4, "c": 1}[ch]
            return _ANY
        if ch.isascii() and ch.isalnum():
            raise RegexRefused(f"it has the escape \\{ch}, which iox-batch does not read")
        return _char(ord(ch), self.fold)

    def _class(self) -> _Set:
        """A character class, nested classes and intersections included; negated or intersected classes count as
        any character (an over-estimate, which only ever refuses more)."""
        negated = self._peek() == "^"
        if negated:
            self.at += 1
        if self._peek() == "]":
            raise RegexRefused("it has a character class starting with ']', which Java reads its own way; write "
                               "\\] for a bracket")
        chars = _EMPTY
        broad = negated
        previous: int | None = None
        while True:
            ch = self._peek()
            if not ch:
                raise RegexRefused("it has an unclosed character class '['")
            self.at += 1
            if ch == "]":
                break
            if ch == "[":
                chars |= self._class()
                previous = None
                continue
            if ch == "&" and self._peek() == "&":
                self.at += 1
                broad = True
                previous = None
                continue
            if ch == "\\":
                escaped = self._peek()
                if not escaped:
                    raise RegexRefused("it ends with a lone backslash")
                self.at += 1
                if escaped == "Q":
                    raise RegexRefused("it has \\Q inside a character class, which iox-batch does not read")
                member = self._escaped_set(escaped)
                chars |= member
                previous = next(iter(member.ascii)) if len(member.ascii) == 1 and not member.other else None
                continue
            if ch == "-" and previous is not None and self._peek() not in ("]", ""):
                end = self._peek()
                self.at += 1
                if end in ("[", "\\"):
                    raise RegexRefused("it has a character range ending in an escape or a class, which iox-batch "
                                       "does not read")
                if ord(end) < previous:
                    raise RegexRefused(f"it has the reversed character range {chr(previous)}-{end}")
                for code in range(previous, min(ord(end), 127) + 1):
                    chars |= _char(code, self.fold)
                if ord(end) >= 128:
                    chars |= _Set(frozenset(), True)
                previous = None
                continue
            chars |= _char(ord(ch), self.fold)
            previous = ord(ch)
        return _ANY if broad else chars


def _overlapping(count: int) -> RegexRefused:
    return RegexRefused(f"it has {count} unbounded repetitions in a row that can match the same characters, not "
                        f"counting one at its very end (at most {MAX_OVERLAPPING}: each one more multiplies the "
                        "backtracking by the value's length), as in .*a.*a.*b")


def _branches_overlap(branches: list[_Node]) -> bool:
    """Whether two branches of an alternation can start with the same character (or one can match nothing)."""
    for i, branch in enumerate(branches):
        if branch.nullable:
            return True
        if any(branch.first.overlaps(other.first) for other in branches[i + 1:]):
            return True
    return False
