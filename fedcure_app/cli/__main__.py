"""``python -m fedcure_app.cli``: the ``fedcure`` command."""

import sys

from fedcure_app.cli import main

sys.exit(main())
