"""``python -m fedsec``: the same as the ``fedsec`` command."""

import sys

from fedsec.cli import main

sys.exit(main())
