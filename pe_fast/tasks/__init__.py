"""The tasks. Each file defines one task and its KIND (pe_fast.tasks.base.TaskKind); a new task is a new file
and one entry here."""
from pe_fast.tasks import digits, fmri, lst, netsim

KINDS = {kind.name: kind for kind in (fmri.KIND, lst.KIND, netsim.KIND, digits.KIND, digits.CLASS_KIND)}
