"""One quoting helper per output format: every user-derived value an exporter writes goes through
the function for its format and place, so a name is data in the file, never code.

The danger is not only in values: a model name with a newline written into a ``#`` comment ends
the comment, and the rest of the name runs when the file is sourced (bash), imported (Python) or
parsed (TOML, where it can set keys). So comments get :func:`comment` -- one line, control and
invisible characters written as escapes -- and values get the quoting of their language:

- shell words: :func:`sh_word` (``shlex.quote``: single quotes, nothing inside is expanded);
- Python: :func:`py_str` (``repr`` of a str is a literal that evaluates to exactly that str and
  escapes every non-printable character);
- TOML: :func:`toml_str`, a basic string with the escapes of TOML 1.0 (\\" \\\\ \\uXXXX
  \\UXXXXXXXX) for the quote, the backslash and every non-printable character.
"""

from __future__ import annotations

import re
import shlex

from planner.core.text import visible


def comment(text: str) -> str:
    """Text safe inside a ``#`` comment of shell, Python or TOML: one line, printable only."""
    return visible(text)


def sh_word(text: str) -> str:
    """One shell word that expands to exactly ``text`` (after :func:`comment`'s cleaning is not
    applied: the value is kept whole, only quoted)."""
    return shlex.quote(str(text))


def sh_token(text: str, allowed: str = r"A-Za-z0-9_.-") -> str:
    """A value for places that take no quoting at all (``#SBATCH --job-name=``): every character
    outside ``allowed`` becomes '-'."""
    return re.sub(f"[^{allowed}]", "-", str(text))


def py_str(text: str) -> str:
    """A Python string literal that evaluates to ``text``."""
    return repr(str(text))


def toml_str(text: str) -> str:
    """A TOML basic string that parses to ``text``."""
    out = ['"']
    for ch in str(text):
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        elif 0xD800 <= ord(ch) <= 0xDFFF:  # a lone surrogate is no Unicode scalar value
            out.append("\\uFFFD")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(f"\\U{ord(ch):08X}")
    out.append('"')
    return "".join(out)


def toml_list(items) -> str:
    """A TOML array of strings."""
    return "[" + ", ".join(toml_str(x) for x in items) + "]"
