"""Folders only their owner can change, and files made inside them by descriptor.

On a shared machine anyone may create ``/tmp/nblaunch-<your uid>`` before you do: as a symbolic
link to a folder of theirs, as a folder they own, or as a world-writable one. nblaunch therefore
never uses a run-folder base as it finds it: ``open_private_dir`` opens it without following a
link and accepts it only if it is a real folder, owned by this user and writable by nobody else;
what is then made inside (run folders, logs, times, state files) is made relative to the open
folder (``open_in``, ``dir_fd`` + ``O_NOFOLLOW``), owner-only, so a path swapped meanwhile
changes nothing. The kernel (``launch/run_dir.py``) and the Jupyter server (``jupyter_ext/runs.py``)
apply the same rules. Standard library only: the Jupyter server imports this.

Example::

    >>> fd = open_private_dir("/tmp/nblaunch-1000", create=True)   # mode 0700, or UnsafeFolderError
    >>> os.close(open_in(OpenFolder("/tmp/nblaunch-1000", fd), "notes", os.O_WRONLY | os.O_CREAT))  # mode 0600
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFolderError(Exception):
    """``path`` cannot be trusted to keep what nblaunch writes private: ``problem`` says why, ``remedy`` what to do.

    Example::

        >>> str(UnsafeFolderError("/tmp/x", "is not a folder", "remove it"))
        '/tmp/x is not a folder; remove it'
    """

    def __init__(self, path: str, problem: str, remedy: str):
        super().__init__(f"{path} {problem}; {remedy}")
        self.path, self.problem, self.remedy = path, problem, remedy


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_private(path: str, st: os.stat_result) -> None:
    """Raise ``UnsafeFolderError`` unless ``st`` (an open folder's ``fstat``) is this user's folder, not writable
    by group or others.

    Example::

        >>> check_private("/", os.stat("/"))  # doctest: +SKIP  (root's folder: refused for any other user)
    """
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(path, "is not a folder", f"remove it (rm {path})")
    if st.st_uid != os.getuid():
        raise UnsafeFolderError(
            path,
            f"belongs to {_user(st.st_uid)}, not to you, {_user(os.getuid())}",
            "its owner could read everything written there: have it removed (by its owner or an administrator)",
        )
    writable = [who for who, bit in (("its group", stat.S_IWGRP), ("every user", stat.S_IWOTH)) if st.st_mode & bit]
    if writable:
        raise UnsafeFolderError(
            path,
            f"can be written by {' and '.join(writable)} (mode {stat.S_IMODE(st.st_mode):04o})",
            f"others could add or swap folders in it: make it private (chmod go-w {path}) after checking what it holds",
        )


def open_private_dir(path: str, *, create: bool = False) -> int:
    """Open ``path`` (made owner-only first with ``create``) as a folder only this user can change: a descriptor.

    Raises ``UnsafeFolderError`` for a symbolic link, something that is not a folder, another user's folder
    or a group- or world-writable one; ``FileNotFoundError`` when it is missing (and not ``create``).

    Example::

        >>> open_private_dir("/tmp")  # doctest: +SKIP  (as root: root's own /tmp, but 1777)
        Traceback (most recent call last):
        UnsafeFolderError: /tmp can be written by its group and every user (mode 1777); others could add ...
    """
    created = False
    if create:
        try:
            os.mkdir(path, 0o700)
            created = True
        except FileExistsError:
            pass
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # (O_DIRECTORY | O_NOFOLLOW on a link answers ENOTDIR)
            if os.path.islink(path):
                try:
                    target = os.readlink(path)
                except OSError:  # (removed meanwhile)
                    target = "?"
                raise UnsafeFolderError(
                    path,
                    f"is a symbolic link (to {target})",
                    "nblaunch writes only into a real folder, so that no one can send what it writes elsewhere: "
                    f"remove the link (rm {path})",
                ) from None
            raise UnsafeFolderError(path, "is not a folder", f"remove it (rm {path})") from None
        if e.errno == errno.EACCES:  # another user's folder that this user cannot even open?
            try:
                check_private(path, os.lstat(path))
            except UnsafeFolderError as unsafe:
                raise unsafe from None
        raise
    try:
        if created:
            os.fchmod(fd, 0o700)  # whatever the umask: usable by its owner, by nobody else
        check_private(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


class OpenFolder(str):
    """A folder's path that holds the folder open: files inside are made relative to ``fd`` (``open_in``).

    It is the path everywhere a path is shown or joined; pickled (to a rank) it is the plain path, since a
    descriptor means nothing in another process. ``close()`` forgets the descriptor first, so a late
    ``open_in`` goes by the path (never through a reused descriptor number).

    Example::

        >>> folder = OpenFolder("/tmp/nblaunch-0/run-x", fd)   # doctest: +SKIP
        >>> os.close(open_in(folder, "rank0.log", os.O_WRONLY | os.O_CREAT))   # doctest: +SKIP
    """

    fd: int | None

    def __new__(cls, path: str, fd: int | None):
        folder = super().__new__(cls, path)
        folder.fd = fd
        return folder

    def __reduce__(self):
        return (str, (str(self),))

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def folder_fd(folder: str):
    """A descriptor of ``folder`` for ``dir_fd=`` calls: an ``OpenFolder``'s own, or the path opened without
    following a link (closed after).

    Example::

        >>> with folder_fd(run_dir) as fd:   # doctest: +SKIP
        ...     names = os.listdir(fd)
    """
    dir_fd = getattr(folder, "fd", None)
    if dir_fd is not None:
        yield dir_fd
        return
    dir_fd = os.open(folder, _DIR_FLAGS)
    try:
        yield dir_fd
    finally:
        os.close(dir_fd)


def open_in(folder: str, name: str, flags: int, mode: int = 0o600) -> int:
    """Open (or make, owner-only) the file ``name`` inside ``folder`` without following a link: a descriptor.

    ``folder`` is an ``OpenFolder`` (its descriptor is used) or a path (opened without following a link).

    Example::

        >>> fd = open_in(run_dir, "rank0.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)   # doctest: +SKIP
    """
    with folder_fd(folder) as dir_fd:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def write_in(folder: str, name: str, data: bytes) -> None:
    """Make (or empty) the owner-only file ``name`` inside ``folder`` without following a link, and write ``data``.

    Example::

        >>> write_in(run_dir, ".state.json.tmp", b"{}")   # doctest: +SKIP
    """
    fd = open_in(folder, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def replace_in(folder: str, source: str, target: str) -> None:
    """Rename ``source`` over ``target``, both inside ``folder`` (by its descriptor when it is an ``OpenFolder``)."""
    with folder_fd(folder) as dir_fd:
        os.replace(source, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
