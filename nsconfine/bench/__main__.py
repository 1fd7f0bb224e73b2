"""`python -m nsconfine.bench`."""

import sys

try:  # every section measures through it, and imports it as it is imported
    import psutil  # noqa: F401
except ImportError:
    print(
        "nsconfine bench: the bench needs psutil: pip install 'nsconfine[bench]'", file=sys.stderr
    )
    raise SystemExit(69) from None

from nsconfine.bench._main import main

raise SystemExit(main())
