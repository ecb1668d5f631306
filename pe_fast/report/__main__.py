from pe_fast.program_exit import exit_now
from pe_fast.report.cli import main

exit_now(main())
