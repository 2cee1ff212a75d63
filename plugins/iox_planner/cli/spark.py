"""`iox-batch spark start|stop|status`: the project's own Spark Connect server (`iox_planner/spark/server.py`), which
the `connect` runner (IOX_RUNNER=connect) queries over when IOX_SPARK_REMOTE names no other."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, commands: dict[str, Any]) -> None:
    spark = sub.add_parser("spark", help="the project's own Spark Connect server (IOX_RUNNER=connect)")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True, metavar="ACTION")
    start = spark_sub.add_parser("start", help="start it (or keep the one running) and wait until it answers")
    start.add_argument("--port", type=int, help="port to listen on (default: a free one, recorded in .iox/)")
    start.add_argument("--host", help="address to bind (default 127.0.0.1: only this machine reaches it; any "
                                      "other needs --behind-tls-proxy)")
    start.add_argument("--behind-tls-proxy", action="store_true",
                       help="with a --host beyond loopback: a TLS-terminating proxy fronts both ports, and clients "
                            "elsewhere reach the server only through it (README: Spark Connect beyond one machine)")
    start.add_argument("--conf", action="append", default=[], metavar="spark.KEY=VALUE",
                       help="a Spark setting of the server, e.g. spark.driver.memory=4g (repeatable)")
    start.set_defaults(func=commands["start"])
    stop = spark_sub.add_parser("stop", help="stop it and its Python workers")
    stop.set_defaults(func=commands["stop"])
    status = spark_sub.add_parser("status", help="whether it runs, its address, pid and log")
    status.set_defaults(func=commands["status"])


def start(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.errors import BadInputError
    from iox_planner.spark.server import check_ports, is_loopback, parse_conf, start as start_server

    check_ports(args.port)
    exposed = args.host is not None and not is_loopback(args.host)
    if exposed and not args.behind_tls_proxy:
        raise BadInputError(f"--host {args.host} binds the Spark Connect server and its gate beyond this machine, "
                            "where its token would travel in clear (and PySpark sends a token to another host over "
                            "TLS only). Put a TLS-terminating proxy in front of both ports and say so with "
                            "--behind-tls-proxy (README: Spark Connect beyond one machine), or bind 127.0.0.1 and "
                            "run the proxy on this machine")
    server = start_server(args.port, args.host, parse_conf(args.conf))
    console.print(f"Spark Connect server running at {server.url()} (gate port {server.gate_port}, pid {server.pid}, "
                  f"bound to {server.host}, log {server.log_file}); clients need its token (.iox/spark-connect.json)")
    if not is_loopback(server.host):
        console.print(f"warning: ports {server.port} and {server.gate_port} listen beyond this machine without TLS; "
                      "only the TLS proxy in front of them should be reachable by clients elsewhere")
    return 0


def stop(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.spark.server import stop as stop_server

    server = stop_server()
    console.print("no Spark Connect server was running" if server is None
                  else f"stopped the Spark Connect server at {server.url()} (pid {server.pid})")
    return 0


def status(args: argparse.Namespace, console: Any) -> int:
    """Exit 0 when it answers, 3 otherwise (so a script can wait on it)."""
    from iox_planner.spark.server import read_report, status as server_status

    server, state = server_status()
    if server is None:
        console.print("stopped: no Spark Connect server is recorded (iox-batch spark start)")
        return 3
    report = read_report(server)
    said = ""
    if report is not None and report.restarts:
        said = f"; restarted {report.restarts} time{'s' if report.restarts != 1 else ''} by its supervisor"
    if report is not None and state in ("restarting", "failed") and report.reason:
        said += f"; {report.reason}"
    elif report is not None and report.restarts and report.reason:
        said += f", last because {report.reason}"
    console.print(f"{state}: {server.url()} (gate port {server.gate_port}, pid {server.pid}, bound to "
                  f"{server.host}, log {server.log_file}){said}")
    return 0 if state == "running" else 3
