"""``python -m xlanb.store info | prune | clear``: show and manage the executable store.

``info``   where the store is, whether it is on, its signing key, its cap and contents.
``prune``  delete entries of other xlanb sources, torch, JAX or jaxlib versions and
           abandoned temporary files, then least recently used entries down to the cap.
``clear``  delete every entry.

Exit status: 0 done, 1 the store is off or refused (nothing touched; ``info`` still
prints why), 2 usage error.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .base.config import config
from .base.formats import format_bytes, parse_bytes
from .runtime import store as exe_store

def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = _root()
    if args.command == "info":
        return _info(root)  # 1 when the store is off, as for prune and clear
    problem = _problem(root)
    if problem is not None:
        print(f"xlanb: the executable store is off: {problem}; nothing done.", file=sys.stderr)
        return 1
    if not os.path.isdir(root):
        print(f"{root}: empty (no store yet)")
        return 0
    if args.command == "prune":
        return _prune(root, args.max_bytes or config.store_max_bytes)
    return _clear(root)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m xlanb.store",
                                description="Show and manage xlanb's executable store.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{info,prune,clear}")
    sub.add_parser("info", help="where the store is, whether it is on, what it holds")
    prune = sub.add_parser("prune", help="delete other versions' entries and leftovers, "
                                         "then least recently used entries down to the cap")
    prune.add_argument("--max-bytes", type=_size, default=None,
                       help="cap to prune down to (default: XLANB_STORE_MAX_BYTES or 2G)")
    sub.add_parser("clear", help="delete every entry")
    return p


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _root() -> str | None:
    return os.path.join(config.store_dir, exe_store._DIR) if config.store_dir else None


def _problem(root: str | None) -> str | None:
    """Why the store is off, without creating anything (info must not make a key)."""
    if root is None:
        return "XLANB_STORE_DIR is empty"
    why = exe_store.dir_problem(config.store_dir)
    if why is None and os.path.exists(config.store_key_file):
        why = exe_store._load_secret(config.store_key_file)[1]
    return why


def _info(root: str | None) -> int:
    problem = _problem(root)
    found = exe_store.entries(root) if root and problem is None and os.path.isdir(root) else []
    tmp = [e for e in found if exe_store.is_leftover(e)]
    found = [e for e in found if not exe_store.is_leftover(e)]
    stale = [e for e in found if not e.current]
    key_state = "" if os.path.exists(config.store_key_file) else " (created on first use)"
    print(f"store:    {root or '-'}")
    print(f"status:   {'off: ' + problem if problem else 'on'}")
    print(f"key:      {config.store_key_file}{key_state}")
    print(f"cap:      {format_bytes(config.store_max_bytes)} (XLANB_STORE_MAX_BYTES)")
    print(f"entries:  {len(found)}, {format_bytes(sum(e.size for e in found))}")
    print(f"  other versions: {len(stale)}, {format_bytes(sum(e.size for e in stale))} "
          "(deleted by prune, and first when over the cap)")
    print(f"leftover temporary files: {len(tmp)}, {format_bytes(sum(e.size for e in tmp))} "
          "(writes that died; counted toward the cap, deleted by prune)")
    return 1 if problem else 0


def _prune(root: str, max_bytes: int) -> int:
    found = exe_store.entries(root)
    stale = [e for e in found if not e.current and not exe_store.is_leftover(e)]
    n_stale = _remove([e.path for e in stale])
    n_tmp = _remove(_leftover_tmp(root))
    gone, left = exe_store.evict(root, max_bytes)
    print(f"deleted {n_stale} entries of other versions ({format_bytes(sum(e.size for e in stale))}), "
          f"{len(gone)} least recently used ({format_bytes(sum(e.size for e in gone))}), "
          f"{n_tmp} leftover temporary files; "
          f"{format_bytes(left)} left (cap {format_bytes(max_bytes)})")
    return 0


def _clear(root: str) -> int:
    found = exe_store.entries(root, leftovers=False)
    _remove([e.path for e in found] + _leftover_tmp(root))
    _remove_empty_dirs(root)
    print(f"deleted {len(found)} entries ({format_bytes(sum(e.size for e in found))}) from {root}")
    return 0


def _leftover_tmp(root: str) -> list[str]:
    """Temporary files of writes that died (old enough not to be in progress)."""
    cutoff = time.time() - exe_store.STALE_TMP_S
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                if name.startswith(exe_store._TMP_PREFIX) and os.lstat(path).st_mtime < cutoff:
                    found.append(path)
            except OSError:
                pass
    return found


def _remove(paths: list[str]) -> int:
    n = 0
    for path in paths:
        try:
            os.unlink(path)
            n += 1
        except FileNotFoundError:
            n += 1  # another process got there first
        except OSError as e:
            print(f"xlanb: cannot delete {path}: {e}", file=sys.stderr)
    return n


def _remove_empty_dirs(root: str) -> None:
    """Environment and shard folders left empty (the root stays, private)."""
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        if dirpath != root:
            try:
                os.rmdir(dirpath)
            except OSError:  # not empty: a write in progress
                pass


if __name__ == "__main__":
    sys.exit(main())
