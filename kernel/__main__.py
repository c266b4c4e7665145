"""``python -m xlanb.kernel``: install, uninstall, show or launch the xlanb Jupyter kernel.

    python -m xlanb.kernel install [--user | --sys-prefix | --prefix P] [--name N] [--mode M]
                                   [--display-name D]
    python -m xlanb.kernel uninstall [--user | --sys-prefix | --prefix P] [--name N]
    python -m xlanb.kernel show [--mode M]      print the kernel.json that would be installed
    python -m xlanb.kernel launch -f CONNECTION_FILE   (what Jupyter runs)
"""
from __future__ import annotations

import argparse
import json
import sys


def _where(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--user", action="store_true", help="the per-user Jupyter data dir")
    g.add_argument("--sys-prefix", action="store_true",
                   help="this Python's prefix (a virtualenv or conda env)")
    g.add_argument("--prefix", default=None, help="PREFIX/share/jupyter/kernels")
    p.add_argument("--name", default=None, help="kernel name (default: xlanb)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "launch":  # ipykernel parses the rest
        from .launch import main as launch
        launch(argv[1:])
        return 0
    from . import spec
    parser = argparse.ArgumentParser(prog="python -m xlanb.kernel",
                                     description="The 'Python 3 (xlanb)' Jupyter kernel.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_in = sub.add_parser("install", help="install the kernel spec")
    _where(p_in)
    p_in.add_argument("--mode", choices=spec.MODES, default=None,
                      help="the kernel's starting mode (XLANB_MODE in the spec's env)")
    p_in.add_argument("--display-name", default=None, help='default: "Python 3 (xlanb)"')
    p_un = sub.add_parser("uninstall", help="remove the kernel spec")
    _where(p_un)
    p_show = sub.add_parser("show", help="print the kernel.json that install writes")
    p_show.add_argument("--mode", choices=spec.MODES, default=None)
    sub.add_parser("launch", help="start the kernel (Jupyter runs this)")
    args = parser.parse_args(argv)
    if args.cmd == "show":
        print(json.dumps(spec.kernel_json(mode=args.mode), indent=1))
        return 0
    prefix = sys.prefix if args.sys_prefix else args.prefix
    name = args.name or spec.DEFAULT_NAME
    if args.cmd == "install":
        try:
            path = spec.install(name, user=args.user, prefix=prefix, mode=args.mode,
                                display_name=args.display_name)
        except PermissionError as e:
            print(f"error: {e}\n(try --user or --sys-prefix)", file=sys.stderr)
            return 1
        print(f"Installed kernelspec {name} in {path}")
        return 0
    try:
        path = spec.uninstall(name, user=args.user, prefix=prefix)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Removed kernelspec {name} from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
