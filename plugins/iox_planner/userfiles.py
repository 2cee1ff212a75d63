"""Files a user names (a scenario, a materialized definition, `--sql-file`, line protocol, a bulk load's inputs):
opened so that only a regular file is ever read. A FIFO, a device or a socket where a file is expected would block
a read forever or stream without end; a folder cannot be read at all."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import BinaryIO

from iox_planner.errors import BadInputError
from iox_planner.objectstore import hide_credentials

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path: str | os.PathLike[str], what: str, *, follow_links: bool = True,
                 hint: str = "") -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file; else one BadInputError, `cannot read {what}:
    {why}{hint}`. The open does not block (`O_NONBLOCK`: opening a FIFO nobody writes to would wait forever), and
    the check is `fstat` on what was opened, not a look at the path beforehand that a swap could outdate.
    `follow_links=False` refuses a symlink (a bulk load's pinned files)."""
    # A message repeats the name the user gave: never a URL's credentials (`s3://key:secret@...` is no local file).
    what = hide_credentials(what)
    if "://" in os.fspath(path):
        raise BadInputError(f"cannot read {what}: it is a URL, and this takes a local file{hint}")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        why = ("it is a symlink" if err.errno == errno.ELOOP and not follow_links
               else "no such file" if err.errno == errno.ENOENT
               else "permission denied" if err.errno == errno.EACCES
               else err.strerror or type(err).__name__)
        raise BadInputError(f"cannot read {what}: {why}{hint}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise BadInputError(f"cannot read {what}: it is {kind}, not a regular file{hint}")
        # Reads of a regular file never block; clear the flag so the file object behaves as open() makes it.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
