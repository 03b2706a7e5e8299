"""``python -m k8s_sim --state-dir DIR --image-bin-dir .venv/bin --token T``: run the simulated cluster."""

import sys

from .server import main

sys.exit(main())
