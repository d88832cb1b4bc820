"""How every command-line tool runs its main: a user error or Ctrl-C ends it with one line, not
a traceback, and malloc keeps big freed blocks for reuse."""
from __future__ import annotations

import os
import sys

from core.errors import UserError, as_flags


def run(main) -> None:
    """Run a CLI main(); user errors and Ctrl-C end with one line, not a traceback (under
    torchrun: from rank 0 only, every rank exiting). Big temporaries stay with the process
    (core.memory.keep_freed_buffers)."""
    from core.memory import keep_freed_buffers
    keep_freed_buffers()
    speaks = os.environ.get("RANK", "0") == "0"
    try:
        main()
    except UserError as e:
        if speaks:
            print(f"error: {as_flags(str(e))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        if speaks:
            print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
