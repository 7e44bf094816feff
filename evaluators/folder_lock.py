"""One run at a time in an output folder.

The runner resumes a folder by reading what is already there, and takes over a folder
holding no answer (a run that failed before its first one). Two runs started at once
into one folder would both read it empty, both write ``run.json`` and both append
answers -- with different settings, to one file. :func:`hold` closes that: the process
that writes a folder holds an exclusive lock on ``output_dir/.lock`` for the whole run,
and a second run into it is refused at once, naming the process that holds it.

The lock is the operating system's advisory ``flock``, not the file's existence: it is
released when the holder exits, however it exits (a kill, a crash, a lost node), so a
dead run never leaves a folder locked and nothing needs cleaning up. The file itself
stays (it holds only the last holder's pid and host, for the message).

Choices the runner's callers should know:
- In a multi-process run (:mod:`evaluators.distributed`) only the main process takes
  the lock; the other ranks write their own shard files under it. A refused main
  process exits with an error and the launcher (``torchrun``/``accelerate launch``)
  stops the other ranks.
- ``flock`` is local to a machine on some network filesystems (older NFS): two hosts
  writing one shared folder are then not kept apart. A filesystem that refuses ``flock``
  (Lustre mounted without ``-o flock``) gets a warning and no lock. Where ``fcntl`` does not
  exist (Windows) no lock is taken, and the module says so in :data:`AVAILABLE`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

#: The lock file's name inside an output folder.
LOCK = ".lock"
#: Whether this platform can lock a folder (False on Windows).
AVAILABLE = fcntl is not None
__all__ = ["AVAILABLE", "FolderBusy", "LOCK", "hold"]


class FolderBusy(RuntimeError):
    """Another live process is writing answers into this output folder."""


@contextlib.contextmanager
def hold(folder: str | Path, *, take: bool = True) -> Iterator[None]:
    """Hold ``folder``'s lock for the block; raise :class:`FolderBusy` at once (never
    wait) when another process holds it. ``take=False`` (a non-main rank) does nothing."""
    if not take or fcntl is None:
        yield
        return
    path = Path(folder) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        unsupported = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise FolderBusy(
                f"output_dir {Path(folder)} is being written by another run ({holder}); two runs into one "
                "folder would mix their answers -- wait for it to finish, or choose another output_dir") from None
        except OSError as err:  # a filesystem without flock (Lustre without -o flock: ENOSYS)
            unsupported = err.strerror or str(err)
        if unsupported is not None:
            import warnings

            warnings.warn(f"output_dir {Path(folder)}: its filesystem cannot lock files ({unsupported}); "
                          "the run goes on without the lock, so make sure no other run writes there",
                          stacklevel=3)
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
