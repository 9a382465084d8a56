"""Whether an agent socket may be trusted with a run's data, checked before anything is sent to it.

Without ``XDG_RUNTIME_DIR`` the default socket is ``/tmp/gpulse-<uid>/agent.sock``: anyone can
create that directory first and listen there. A client (the training library, ``gpulse status``,
``gpulse doctor``) therefore sends to a socket only when nobody but the user can have put it
there: the socket, its directory and every directory above belong to the user, to root, or to
the group the user named (the agent's ``--socket-group``; ``GPULSE_SOCKET_GROUP`` for training),
and none of them can be changed by others.

The rules follow what tmux and OpenSSH do for the same problem:

* tmux (``tmux.c``, ``make_label``) refuses its socket directory unless ``st_uid`` is the user's
  and it grants nothing to others (``TMUX_SOCK_PERM``, o+rwx);
* OpenSSH (``misc.c``, ``safe_path``) walks the canonical path upwards and refuses any component
  not owned by the user or root, or writable by group or others (mode & 022).

Two differences, both needed for the places a socket lives: a directory *above* the socket's
directory may be writable by others when its sticky bit is set (``/tmp``: nobody can rename or
remove another user's entry there), and group write is allowed where the group is the one the
user trusts. The socket's own directory may never be writable by others, sticky or not: whoever
can create entries there can put a socket in place of an absent agent's.

Both the path as given and its canonical form (symlinks resolved) are checked: a symlink in a
directory someone else controls could be switched after the check.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

#: Environment variable naming the group a training client trusts besides its user and root.
SOCKET_GROUP_ENV = "GPULSE_SOCKET_GROUP"


class UntrustedSocket(Exception):
    """A socket someone other than the user (or root, or the trusted group) controls.

    ``path`` is the file or directory that fails, ``owner`` names who owns it, ``fix`` says what to do.
    """

    def __init__(self, path: str, owner: str, problem: str, fix: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.owner = owner
        self.problem = problem
        self.fix = fix


def owner_name(uid: int) -> str:
    """``uid 1001 (alice)``, or ``uid 1001`` when the user database does not know it."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def group_id(group: str | int | None) -> int | None:
    """The gid of ``group`` (a name or a number); ``None`` when no group is trusted.

    Raises ``KeyError`` for a group name this machine does not know."""
    if group is None or group == "":
        return None
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    return grp.getgrnam(str(group)).gr_gid


def verify_socket(path: str, group: str | int | None = None) -> int | None:
    """Check that ``path`` (an agent socket) and every directory above it are safe to send to.

    Returns the uid that owns the socket (the agent's user: replies must come from it), or ``None``
    when there is no socket yet (its directory, where it would appear, is checked all the same).
    Raises :class:`UntrustedSocket` naming the path, its owner and the fix; ``KeyError`` when
    ``group`` names no group; other ``OSError`` (e.g. a directory the user may not search) as
    ``os.lstat`` raises it, which sending would meet too.
    """
    trusted = {os.geteuid(), 0}
    gid = group_id(group)
    given = os.path.abspath(path)
    owner = None
    checked: set[str] = set()
    for candidate in dict.fromkeys((given, os.path.realpath(given))):  # once when nothing is a symlink
        for entry, role in _chain(candidate):
            if entry in checked:
                continue
            checked.add(entry)
            try:
                st = os.lstat(entry)
            except FileNotFoundError:
                continue  # nothing there yet: whoever creates it is checked on the next connect
            if stat.S_ISLNK(st.st_mode):
                role = _LINK
            elif role == _SOCKET:
                owner = st.st_uid
            _check(entry, st, trusted, gid, group, role)
    return owner


def _chain(path: str) -> list[tuple[str, str]]:
    """The directories above ``path`` from ``/`` down, its directory, then ``path`` (the socket):
    the first problem reported is the one highest up, the one to fix."""
    out = [(path, _SOCKET), (os.path.dirname(path), _OWN_DIR)]
    directory = out[-1][0]
    while directory != "/":
        directory = os.path.dirname(directory)
        out.append((directory, _ANCESTOR))
    return out[::-1]


_SOCKET, _OWN_DIR, _ANCESTOR, _LINK = "socket", "directory", "ancestor", "link"


def _check(path: str, st: os.stat_result, trusted: set[int], gid: int | None, group: object, role: str) -> None:
    by_group = gid is not None and st.st_gid == gid
    if st.st_uid not in trusted and not by_group:
        whom = "you, root" + (f" or group {group}" if gid is not None else "")
        raise UntrustedSocket(
            path, owner_name(st.st_uid), f"belongs to {owner_name(st.st_uid)}, not to {whom}", _fix(path, role)
        )
    if role == _LINK:
        return  # a symlink's own mode means nothing; its target is checked as the canonical path
    mode = st.st_mode
    others = bool(mode & stat.S_IWOTH)
    group_w = bool(mode & stat.S_IWGRP) and not by_group
    sticky = bool(mode & stat.S_ISVTX)
    if role == _ANCESTOR and sticky:
        return  # /tmp and the like: nobody may rename or remove what is not theirs
    if others or (group_w and role != _SOCKET):
        who = "everyone" if others else f"group {_group_name(st.st_gid)}"
        raise UntrustedSocket(
            path,
            owner_name(st.st_uid),
            f"is writable by {who} (mode {stat.S_IMODE(mode):04o}), so it may not be the agent's",
            f"chmod go-w {path}" if st.st_uid == os.geteuid() else _fix(path, role),
        )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _fix(path: str, role: str) -> str:
    directory = path if role != _SOCKET else os.path.dirname(path)
    return (
        f"remove {directory} (its owner or root can) and restart `gpulse agent`, or give the agent and "
        "training a socket in a directory of yours: set XDG_RUNTIME_DIR, or GPULSE_SOCKET for training "
        "and --socket for the agent"
    )
