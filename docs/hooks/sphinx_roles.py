"""mkdocs hook: render the Sphinx cross-reference roles used in nobubble's docstrings.

The docstrings write references the Sphinx way (``:func:`~nobubble.pipeline.simulate.simulate```);
mkdocstrings renders them as the role's name followed by inline code. This hook drops the role
and, as Sphinx does for a leading ``~``, keeps only the last component of the name. It also
drops the reStructuredText literal-block marker ``::`` that introduces a code example (a
paragraph of its own, or the end of a sentence, where Sphinx shows ``:``).
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _render(match: re.Match[str]) -> str:
    tilde, name = match.group(1), match.group(2)
    if tilde:
        name = name.rsplit(".", 1)[-1]
    return f"<code>{name}</code>"


_LITERAL_ALONE = re.compile(r"<p>::</p>\s*")
_LITERAL_END = re.compile(r"::</p>")


def on_page_content(html: str, **_kwargs) -> str:
    html = _LITERAL_ALONE.sub("", html)
    html = _LITERAL_END.sub(":</p>", html)
    return _ROLE.sub(_render, html)
