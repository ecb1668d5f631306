import sys

from pe_fast.sweep.program import main

sys.exit(main())
