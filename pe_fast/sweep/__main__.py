from pe_fast.program_exit import exit_now
from pe_fast.sweep.program import main

exit_now(main())
