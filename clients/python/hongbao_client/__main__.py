"""`python3 -m hongbao_client ...`: see cli.py."""

import sys

from .cli import main

sys.exit(main())
