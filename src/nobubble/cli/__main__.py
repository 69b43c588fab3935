"""``python -m nobubble.cli``: the same as the ``nobubble`` command."""

from nobubble.cli import main

raise SystemExit(main())
