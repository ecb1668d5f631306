import sys

from pe_fast.sweep.cli import main

sys.exit(main())
