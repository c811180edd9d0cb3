"""`kb daemon start|status|stop`: the warm answer daemon that makes repeated `kb ask` / `kb diagnose` fast."""

from __future__ import annotations

import json

from kb import daemon
from kb.errors import KBError


def register(sub) -> None:
    p = sub.add_parser("daemon", help="start, inspect or stop the warm answer daemon (env KB_DAEMON=auto|on|off)")
    p.add_argument("action", choices=["start", "status", "stop"])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    t = daemon.target(args.data_dir, args.incidents_dir, args.model)
    if args.action == "start":
        info = daemon.status(t)
        if info is None:
            daemon.start(t, wait_s=120.0)
            info = daemon.status(t)
        if info is None:
            raise KBError(f"the daemon did not come up; see {t.log_path}")
        print(json.dumps(info, indent=2) if args.json else f"daemon {info['pid']} running on {info['socket']}")
        return 0
    if args.action == "status":
        info = daemon.status(t)
        if args.json:
            print(json.dumps(info, indent=2))
        elif info is None:
            print(f"no daemon running for {t.data_dir}")
        else:
            print("\n".join(f"{k}: {v}" for k, v in info.items()))
        return 0 if info is not None else 1
    stopped = daemon.stop(t)
    print("stopped" if stopped else "no daemon was running")
    return 0
