"""The fenced blocks of a docs page, for the tests that run a page's examples."""

from __future__ import annotations


def fenced(text: str) -> list:
    """``(language, body)`` of each fenced block of ``text``, in order."""
    out, lang, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                out.append((lang, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    return out
