"""
Serve the emulator until SIGINT/SIGTERM: ``python -m kopf.testing.emulator --port PORT --kubeconfig PATH``.
"""

import argparse
import asyncio
import signal
import sys

from kopf.testing._featuregates import parse_feature_gates
from kopf.testing.emulator.server import KubernetesEmulator


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='python -m kopf.testing.emulator',
        description='Serve a Kubernetes API emulator (a test double of the API server, not a cluster).',
    )
    parser.add_argument('--host', default='127.0.0.1', help='the address to listen on (default: %(default)s)')
    parser.add_argument('--port', type=int, default=0, help='the port to listen on; 0 picks a free one')
    parser.add_argument(
        '--kubeconfig', default=None, help='where to write a kubeconfig for the emulator once it listens'
    )
    parser.add_argument(
        '--bookmark-interval',
        type=float,
        default=60.0,
        help='seconds between BOOKMARK events of watches (default: %(default)s)',
    )
    parser.add_argument(
        '--history-limit',
        type=int,
        default=10_000,
        help='watch events retained per resource before 410 Gone (default: %(default)s)',
    )
    parser.add_argument(
        '--feature-gates',
        default='',
        help='the features off by default, as NAME=true,...: only ShardedListAndWatch (the shardSelector)',
    )
    return parser.parse_args(argv)


async def _serve(arguments: argparse.Namespace) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stopped.set)
    emulator = KubernetesEmulator(
        host=arguments.host,
        port=arguments.port,
        kubeconfig_path=arguments.kubeconfig,
        bookmark_interval=arguments.bookmark_interval,
        history_limit=arguments.history_limit,
        feature_gates=parse_feature_gates(arguments.feature_gates),
    )
    async with emulator:
        print(
            f'The Kubernetes API emulator serves at {emulator.url}; kubeconfig: {emulator.kubeconfig_path}',
            file=sys.stderr,
            flush=True,
        )
        await stopped.wait()


def main(argv: list[str] | None = None) -> None:
    try:
        asyncio.run(_serve(_parse_arguments(argv)))
    except ValueError as e:  # e.g. an unknown feature gate: one line, no traceback
        raise SystemExit(f'Error: {e}') from None


if __name__ == '__main__':
    main()
