"""Reading a run folder without ever leaving it: its state file, its rank logs, its lock and its
control socket, each opened relative to the folder's own descriptor with ``O_NOFOLLOW`` and
closed before the request ends (the server holds no file of a run between requests).

The server reads by the kernel's rules (``kernelside/private_dir.py``): a base or run folder that is a
link, another user's or writable by others is refused, and so is a file that is not a plain file of
this user's with one link (a hard link could make another file of the user's read as a rank's log).

The names are the run folder's contract (``kernelside/run_contract.py``), which the kernel side
writes by; it imports only the standard library, so reading a run never loads torch.

Example::

    >>> with RunDir.open("/tmp/nblaunch-0/run-20250101-120000-ab12cd34") as d:   # doctest: +SKIP
    ...     d.read_json("state.json"), d.in_use()
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat

# the run folder's contract (re-exported for the server's modules and tests)
from kernelside.private_dir import UnsafeFolderError, check_private, open_private_dir
from kernelside.run_contract import CONTROL_SOCKET, IN_USE_FILE, LOG_TIMES_RECORD, STATE_FILE

__all__ = ["CONTROL_SOCKET", "IN_USE_FILE", "STATE_FILE", "RunDir", "RunFileError", "private_base_problem"]

MAX_STATE_BYTES = 1 << 20
MAX_LOG_CHUNK = 1 << 20  # one answer carries at most this much of a log
_TIMES_BLOCK = 256  # records of a times file read at once


class RunFileError(Exception):
    """A file of a run cannot be read as asked; ``status`` is the HTTP answer it deserves."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def private_base_problem(path: str) -> str | None:
    """Why the server will not read run folders in ``path``, or None when it is private (or not there at all).

    Example::

        >>> private_base_problem(f"/tmp/nblaunch-{os.getuid()}")  # made by a launch of this user's: 0700
        >>> private_base_problem("/tmp")  # as root  # doctest: +SKIP
        'can be written by its group and every user (mode 1777); others could add or swap folders in it: ...'
    """
    try:
        os.close(open_private_dir(path))
    except FileNotFoundError:
        return None
    except UnsafeFolderError as e:
        return f"{e.problem}; {e.remedy}"
    except OSError as e:
        return f"cannot be opened ({e.strerror or e})"
    return None


class RunDir:
    """An open run folder (a directory descriptor); use as a context manager so it is closed."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: str) -> RunDir:
        """Open ``path`` as a real folder of this user that no one else can write: a symlink, another user's
        folder or one writable by others is refused (403)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RunFileError(403, f"refused: {path} is not a plain folder (a symbolic link?)") from None
            raise RunFileError(404, f"no run folder {path}") from None
        try:
            check_private(path, os.fstat(fd))
        except UnsafeFolderError as e:
            os.close(fd)
            raise RunFileError(403, f"refused: {path} {e.problem}") from None
        return cls(path, fd)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def _open_file(self, name: str) -> int:
        if not name or "/" in name or name in (".", ".."):
            raise RunFileError(400, f"refused: {name!r} is not a file name inside the run folder")
        try:
            # O_NONBLOCK: a FIFO planted under this name cannot hang the server
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RunFileError(403, f"refused: {name} in {self.path} is a symbolic link") from None
            raise RunFileError(404, f"{name} does not exist in {self.path}") from None
        st = os.fstat(fd)
        problem = (
            "is not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else "belongs to another user"
            if st.st_uid != os.getuid()
            else f"has {st.st_nlink} hard links (it may be another file's content)"
            if st.st_nlink != 1
            else None
        )
        if problem is not None:
            os.close(fd)
            raise RunFileError(403, f"refused: {name} in {self.path} {problem}")
        return fd

    def read_json(self, name: str) -> dict | None:
        """The JSON object in ``name``, or None if it is missing, too large or not a JSON object."""
        try:
            fd = self._open_file(name)
        except RunFileError:
            return None
        try:
            data = os.read(fd, MAX_STATE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_STATE_BYTES:
            return None
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):  # (nested 100,000 deep)
            return None
        return value if isinstance(value, dict) else None

    def in_use(self) -> bool:
        """True while the kernel that runs this launch holds the folder's lock (it is alive and not done)."""
        try:
            fd = self._open_file(IN_USE_FILE)
        except RunFileError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close below
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def read_from(self, name: str, offset: int, limit: int) -> tuple[bytes, int]:
        """At most ``limit`` bytes of ``name`` from ``offset`` on, and the file's inode (a new file: read it anew)."""
        fd = self._open_file(name)
        try:
            st = os.fstat(fd)
            return os.pread(fd, max(0, min(st.st_size - offset, limit)), offset), st.st_ino
        finally:
            os.close(fd)

    def read_log(self, name: str, *, tail: int = 200, offset: int | None = None, times: str | None = None) -> dict:
        """``tail`` last lines, or the bytes from ``offset`` on (at most MAX_LOG_CHUNK); start/end are byte offsets.
        ``times``: the log's times file (``run_contract.rank_log_times_name``): ``times`` in the answer then has,
        for each piece of the text up to and including a newline (and a last piece without one), when the
        kernel had it (seconds since the epoch), or None where the file does not say."""
        fd = self._open_file(name)
        try:
            size = os.fstat(fd).st_size
            if offset is not None:
                start = min(offset, size)
                data = os.pread(fd, min(size - start, MAX_LOG_CHUNK), start)
            else:
                start, data = _tail(fd, size, tail)
        finally:
            os.close(fd)
        data = data[: _complete_utf8(data)]  # a character cut at the end comes whole with the next read
        got = {"text": data.decode("utf-8", errors="replace"), "start": start, "end": start + len(data), "size": size}
        if times is not None:
            got["times"] = self._line_times(times, start, data)
        return got

    def _line_times(self, name: str, start: int, data: bytes) -> list[float | None]:
        """When each piece of ``data`` (the log's bytes from ``start``) was complete: the first record at or
        past the piece's end. The records are fixed-width and in order: found by bisection, read in one go."""
        ends, pos = [], start
        for piece in data.split(b"\n"):
            pos += len(piece) + 1
            ends.append(min(pos, start + len(data)))
        if data.endswith(b"\n"):
            ends.pop()  # (no piece after the last newline)
        try:
            fd = self._open_file(name)
        except RunFileError:
            return [None] * len(ends)
        try:
            count = os.fstat(fd).st_size // LOG_TIMES_RECORD

            def record(i: int) -> tuple[int, float] | None:
                raw = os.pread(fd, LOG_TIMES_RECORD, i * LOG_TIMES_RECORD).split()
                try:
                    return int(raw[0]), float(raw[1])
                except (IndexError, ValueError):
                    return None

            lo, hi = 0, count  # the first record whose end reaches the first piece's end
            while lo < hi:
                mid = (lo + hi) // 2
                r = record(mid)
                if r is not None and r[0] < (ends[0] if ends else start):
                    lo = mid + 1
                else:
                    hi = mid
            records, i, last = [], lo, ends[-1] if ends else start
            while i < count and (not records or records[-1][0] < last):  # blocks of records from there on
                block = os.pread(fd, _TIMES_BLOCK * LOG_TIMES_RECORD, i * LOG_TIMES_RECORD)
                i += _TIMES_BLOCK
                for line in block.splitlines():
                    try:
                        end, wall = line.split()
                        records.append((int(end), float(wall)))
                    except ValueError:
                        continue
        finally:
            os.close(fd)
        out, j = [], 0
        for end in ends:
            while j < len(records) and records[j][0] < end:
                j += 1
            out.append(records[j][1] if j < len(records) else None)
        return out

    def request(self, payload: dict, timeout: float, max_bytes: int = 65536) -> dict:
        """Send one JSON line to the run's control socket and return its one-line JSON answer.

        Raises ``RunFileError(409)`` when nothing listens there (the run's kernel is gone or done).
        """
        try:
            st = os.stat(CONTROL_SOCKET, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            raise RunFileError(409, "the run has no control socket: its kernel is gone or the run has ended") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise RunFileError(403, f"refused: {CONTROL_SOCKET} in {self.path} is not a socket")
        path = f"/proc/self/fd/{self.fd}/{CONTROL_SOCKET}"  # the verified folder itself, not what its path names now
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect(path)
                s.sendall(json.dumps(payload).encode() + b"\n")
                answer = b""
                while b"\n" not in answer and len(answer) < max_bytes:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            except (ConnectionRefusedError, FileNotFoundError):
                raise RunFileError(409, "nothing listens on the run's control socket: its kernel is gone") from None
            except TimeoutError:
                raise RunFileError(
                    409,
                    f"the run's kernel did not answer within {timeout:g} s (a run still starting its ranks "
                    "takes the request once they run)",
                ) from None
            except OSError as e:
                raise RunFileError(409, f"the run's kernel did not answer ({e}); it may be ending") from None
        try:
            reply = json.loads(answer.split(b"\n", 1)[0])
        except (ValueError, UnicodeDecodeError):
            reply = None
        if not isinstance(reply, dict):
            raise RunFileError(409, "the run ended before it took the request")
        return reply


def _tail(fd: int, size: int, lines: int) -> tuple[int, bytes]:
    """The last ``lines`` lines (a last line without its newline counts), read backwards by blocks."""
    pos, data = size, b""
    while pos > 0 and data.count(b"\n") <= lines and len(data) < MAX_LOG_CHUNK:
        step = min(65536, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
    if lines == 0:
        return size, b""
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            break
    data = data[cut + 1 :][-MAX_LOG_CHUNK:]
    return size - len(data), data


def _complete_utf8(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (drops at most 3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return len(data)  # ASCII: complete
        if b >= 0xC0:  # a lead byte: complete if its sequence fits in what is there
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return len(data) if need <= back else len(data) - back
    return len(data)
