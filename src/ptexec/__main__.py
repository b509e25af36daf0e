"""``python -m ptexec``: the ``ptexec`` command."""

from .cli import main

raise SystemExit(main())
