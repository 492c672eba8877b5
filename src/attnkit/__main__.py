"""``python -m attnkit`` runs the ``attnkit`` command."""

from .cli import main

raise SystemExit(main())
