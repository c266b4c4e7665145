"""``python -m xlanb.cache``: the first name of ``python -m xlanb.store``, still accepted."""
from __future__ import annotations

import sys

from .store import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
