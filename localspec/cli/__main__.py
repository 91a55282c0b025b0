"""python -m localspec.cli"""

import sys

from . import main

sys.exit(main())
