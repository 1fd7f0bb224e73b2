"""`python -m nsconfine.bench`."""

from nsconfine.bench._main import main

raise SystemExit(main())
