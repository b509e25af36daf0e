"""``python -m ptexec.cli``: the ``ptexec`` command."""

from . import main

raise SystemExit(main())
