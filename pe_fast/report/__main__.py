import sys

from pe_fast.report.cli import main

sys.exit(main())
