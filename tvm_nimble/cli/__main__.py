"""``python -m tvm_nimble.cli`` is ``tvm-nimble``."""
import sys

from tvm_nimble.cli.main import main

sys.exit(main())
