"""python -m evaluators == vlm-eval."""

import sys

from .cli import main

sys.exit(main())
