"""
Plot the samples of a soak: the operator's RSS, open file descriptors, and asyncio tasks (or threads, where
the tasks were not counted) over the run, a colour per incarnation, with its restarts marked.

Usage: ``python -m tools.soak.plot WORKDIR OUT.png [--log SOAK-OUTPUT] [--title TEXT]``. WORKDIR is the
soak's work directory (its ``samples.jsonl``) or a samples file: the soak's own, or that of
``python -m tools.soak.sampler`` (no incarnations' numbers, no tasks: the pids' order gives them).
With ``--log`` (the soak's printed output), the API server's restarts are marked too, and the
operator's restarts are labelled by their cause (SIGKILL, SIGTERM, SIGINT). Prints a summary per incarnation.
"""
import argparse
import collections
import pathlib
import re
from typing import Any

from tools.soak import sampling

STARTED = re.compile(r'^\[\s*(?P<at>[\d.]+)s\] operator #(?P<number>\d+) started \(pid (?P<pid>\d+)')
ENDED = re.compile(r'^\[\s*(?P<at>[\d.]+)s\] operator #(?P<number>\d+) (?:killed \((?P<kill>SIGKILL)\)|'
                   r'stopped by (?P<signal>\w+))')
API_RESTART = re.compile(r'^\[\s*(?P<at>[\d.]+)s\] (?P<what>.+) restarting \(same port')
WARMED_UP = re.compile(r'^\[\s*(?P<at>[\d.]+)s\] RSS after the warm-up')


def parse_log(path: pathlib.Path) -> dict[str, Any]:
    """The soak's output: the incarnations' starts (seconds since the start) and ends, the API's restarts."""
    started: dict[int, tuple[int, float]] = {}  # pid -> (number, at)
    causes: dict[int, str] = {}  # number -> SIGKILL/SIGTERM/SIGINT
    api_restarts: list[float] = []
    warmed_up: float | None = None
    for line in path.read_text(errors='replace').splitlines():
        if match := STARTED.match(line):
            started[int(match['pid'])] = (int(match['number']), float(match['at']))
        elif match := ENDED.match(line):
            causes[int(match['number'])] = match['kill'] or match['signal']
        elif match := API_RESTART.match(line):
            api_restarts.append(float(match['at']))
        elif match := WARMED_UP.match(line):
            warmed_up = float(match['at'])
    return {'started': started, 'causes': causes, 'api_restarts': api_restarts, 'warmed_up': warmed_up}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('samples', type=pathlib.Path, help='the work directory, or a samples file')
    parser.add_argument('out', type=pathlib.Path)
    parser.add_argument('--log', type=pathlib.Path, default=None, help="the soak's printed output")
    parser.add_argument('--title', default="The soak: the operator's resources over the run")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    samples = sampling.load(args.samples)
    if not samples:
        parser.error(f'{args.samples}: no samples.')
    log = parse_log(args.log) if args.log is not None else None
    if log is not None and not all('incarnation' in sample for sample in samples):
        # The sampler samples every soak's operator on the machine: only this run's (its pids) are drawn.
        samples = [sample for sample in samples if sample['pid'] in log['started']]
        if not samples:
            parser.error(f'{args.samples}: no samples of the operators started in {args.log}.')

    # The x axis: seconds since the soak's start (the soak's samples have them; the sampler's get them from
    # the log: the first sample of an incarnation comes within an interval after its start), else since
    # the first sample.
    by_pid: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for sample in samples:
        by_pid[sample['pid']].append(sample)
    if all('elapsed' in sample for sample in samples):
        def elapsed(sample: dict[str, Any]) -> float:
            return float(sample['elapsed'])
    else:
        offsets = [own[0]['time'] - log['started'][pid][1] for pid, own in by_pid.items()
                   if log is not None and pid in log['started']]
        origin = min(offsets) if offsets else min(sample['time'] for sample in samples)

        def elapsed(sample: dict[str, Any]) -> float:
            return float(sample['time'] - origin)

    has_tasks = any(sample.get('tasks') is not None for sample in samples)
    figure, axes = plt.subplots(3, 1, sharex=True, figsize=(12, 8))
    rss_axes, fds_axes, third_axes = axes
    ordered = sorted(by_pid.items(), key=lambda item: item[1][0]['time'])
    for index, (pid, own) in enumerate(ordered, start=1):
        logged = log['started'].get(pid) if log is not None else None
        number = own[0].get('incarnation') or (logged[0] if logged is not None else index)
        minutes = [elapsed(sample) / 60 for sample in own]
        colour = f'C{index % 10}'
        style = {'linewidth': 1, 'color': colour, 'marker': '.', 'markersize': 2}
        rss_axes.plot(minutes, [sample['rss_kb'] / 1024 for sample in own], **style)
        fds_axes.plot(minutes, [sample['fds'] for sample in own], **style)
        key = 'tasks' if has_tasks else 'threads'
        points = [(minute, sample[key]) for minute, sample in zip(minutes, own, strict=True)
                  if sample.get(key) is not None]
        third_axes.plot([p[0] for p in points], [p[1] for p in points], **style)
        if index > 1:  # a restart of the operator
            at = logged[1] / 60 if logged is not None else minutes[0]
            for ax in axes:
                ax.axvline(at, color='grey', linewidth=0.5, linestyle=':')
        rss = [sample['rss_kb'] for sample in own]
        fds = [sample['fds'] for sample in own]
        threads = [sample['threads'] for sample in own]
        tasks = [sample['tasks'] for sample in own if sample.get('tasks') is not None]
        cause = f', ended by {log["causes"][number]}' if log and number in log['causes'] else ''
        print(f'#{number} (pid {pid}{cause}): {len(own)} samples over {minutes[-1] - minutes[0]:.1f} min '
              f'from {minutes[0]:.1f}; RSS {rss[0]}..{max(rss)} kB (last {rss[-1]}); '
              f'fds {min(fds)}..{max(fds)} (last {fds[-1]}); threads {min(threads)}..{max(threads)}'
              + (f'; tasks {min(tasks)}..{max(tasks)} (last {tasks[-1]})' if tasks else ''))
    if log is not None:
        for at in log['api_restarts']:
            for ax in axes:
                ax.axvline(at / 60, color='red', linewidth=0.6, alpha=0.5)
        if log['warmed_up'] is not None:
            for ax in axes:
                ax.axvline(log['warmed_up'] / 60, color='green', linewidth=1.2, linestyle='--')
    rss_axes.set_ylabel('RSS, MB')
    fds_axes.set_ylabel('open fds')
    third_axes.set_ylabel('asyncio tasks' if has_tasks else 'threads')
    marks = '; red: the API server restarts; dashed green: the last warm-up end' if log is not None else ''
    third_axes.set_xlabel(f'minutes since the start (a colour per incarnation; dotted grey: its restart'
                          f'{marks})')
    rss_axes.set_title(args.title)
    for ax in axes:
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.out, dpi=100)


if __name__ == '__main__':
    main()
